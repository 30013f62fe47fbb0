-- The binary cache's content: one row per store path a cache serves, with
-- the narinfo metadata (hashes are sha256:<nix32> as Nix writes them;
-- references are base names, space-separated, sorted) and the key of the
-- compressed NAR object in the NAR store. Objects are content-addressed,
-- so several rows (of several caches) may share one object_key.
CREATE TABLE cache_paths (
    cache_id    TEXT   NOT NULL REFERENCES caches (id) ON DELETE CASCADE,
    store_hash  TEXT   NOT NULL,
    store_path  TEXT   NOT NULL,
    nar_hash    TEXT   NOT NULL,
    nar_size    BIGINT NOT NULL,
    file_hash   TEXT   NOT NULL,
    file_size   BIGINT NOT NULL,
    compression TEXT   NOT NULL,
    refs        TEXT   NOT NULL,
    deriver     TEXT   NOT NULL,
    ca          TEXT   NOT NULL,
    object_key  TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (cache_id, store_hash)
);

CREATE INDEX cache_paths_object_key ON cache_paths (object_key);

-- API keys that grant reading a private cache. Only argon2id hashes are
-- kept; the key is shown once, as GRAD<token>.
CREATE TABLE cache_api_keys (
    id         TEXT   PRIMARY KEY,
    cache_id   TEXT   NOT NULL REFERENCES caches (id) ON DELETE CASCADE,
    token_hash TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX cache_api_keys_cache ON cache_api_keys (cache_id);
