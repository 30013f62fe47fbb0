-- Cache API keys are random 384-bit tokens, so they are found by the
-- SHA-256 of the token (hex, unique, indexed) instead of trying an
-- argon2id hash per key of the cache: a wrong key must cost no more than
-- a right one. Keys made before this version exist only as argon2id
-- hashes, which no lookup can find; they are removed and must be created
-- again (gradient cache key create CACHE).
DROP TABLE cache_api_keys;

CREATE TABLE cache_api_keys (
    id           TEXT   PRIMARY KEY,
    cache_id     TEXT   NOT NULL REFERENCES caches (id) ON DELETE CASCADE,
    token_digest TEXT   NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL
);

CREATE INDEX cache_api_keys_cache ON cache_api_keys (cache_id);
