-- Retention and garbage collection of the binary cache and the build logs
-- (docs/protocol/cache.md §10.1).
--
-- keep_evaluations: how many of a project's newest evaluations are kept
-- (NULL: the server's default). pinned: an operator keeps the evaluation
-- whatever its age. logs_pruned_at: when retention deleted the job logs of
-- an evaluation that is no longer kept (its rows stay for the dashboard).
ALTER TABLE projects ADD COLUMN keep_evaluations INTEGER;
ALTER TABLE evaluations ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE evaluations ADD COLUMN logs_pruned_at BIGINT;
CREATE INDEX evaluations_pinned ON evaluations (project_id) WHERE pinned;

-- max_bytes: the cache's optional size cap (sum of its rows' file sizes).
ALTER TABLE caches ADD COLUMN max_bytes BIGINT;

-- pushed: an operator pushed the path; it is a root until deleted or until
-- expires_at (NULL: no time to live). last_served: when the path was last
-- served (flushed in batches; NULL: never since it was created).
ALTER TABLE cache_paths ADD COLUMN pushed BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE cache_paths ADD COLUMN expires_at BIGINT;
ALTER TABLE cache_paths ADD COLUMN last_served BIGINT;
CREATE INDEX cache_paths_pushed ON cache_paths (cache_id, store_hash) WHERE pushed;

-- The mark of one collection: every (cache, path) a root reaches. gen is
-- the breadth-first generation (roots 0), so the closure is walked one
-- generation at a time without a queue in memory; kind is the kind of
-- the root that reached it first ('evaluation', 'pushed', 'recent').
-- Rebuilt by every run; only one run at a time.
CREATE TABLE gc_marks (
    cache_id   TEXT    NOT NULL,
    store_hash TEXT    NOT NULL,
    gen        INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    PRIMARY KEY (cache_id, store_hash)
);
CREATE INDEX gc_marks_by_gen ON gc_marks (gen, cache_id, store_hash);

-- The store hashes a run's kept evaluations name (outputs, .drv files,
-- flake sources), per project, before they are looked up in its caches.
CREATE TABLE gc_roots (
    project_id TEXT NOT NULL,
    store_hash TEXT NOT NULL,
    PRIMARY KEY (project_id, store_hash)
);

-- What the run deletes: rows no root reaches, and rows a size cap evicts.
-- The dry run stops after filling it.
CREATE TABLE gc_sweep (
    cache_id   TEXT   NOT NULL,
    store_hash TEXT   NOT NULL,
    store_path TEXT   NOT NULL,
    object_key TEXT   NOT NULL,
    file_size  BIGINT NOT NULL,
    reason     TEXT   NOT NULL,
    PRIMARY KEY (cache_id, store_hash)
);

-- NAR objects whose last row was deleted, written in the transaction that
-- deleted it; the object is deleted after that commit, under the object's
-- lock, only if still no row references it (docs/protocol/cache.md §10.1).
-- A crash leaves the row, and the next run finishes the deletion.
CREATE TABLE nar_deletions (
    object_key TEXT   PRIMARY KEY,
    file_size  BIGINT NOT NULL,
    queued_at  BIGINT NOT NULL
);
