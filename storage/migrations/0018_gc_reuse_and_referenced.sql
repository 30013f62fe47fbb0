-- Retention (docs/protocol/cache.md §10.1), second part.
--
-- reused_at: when a worker's upload was last answered by this row (a Push
-- query answered cached:true, so the worker skipped the upload). For the
-- grace period the row counts as uploaded then: a collection keeps it like
-- a fresh upload, and its delete re-checks it in its own statement.
ALTER TABLE cache_paths ADD COLUMN reused_at BIGINT;

-- A collection's scratch set for a capped cache: every store hash some
-- row of the cache references. It replaces rows gc_roots held under a
-- pseudo project. Filled and used within one cache's size-cap selection,
-- emptied before it is filled and by every run's reset, so what a crash
-- leaves is never read.
CREATE TABLE gc_referenced (
    cache_id   TEXT NOT NULL,
    store_hash TEXT NOT NULL,
    PRIMARY KEY (cache_id, store_hash)
);

-- A dry run lists the objects only selected rows reference in key order,
-- a batch at a time.
CREATE INDEX gc_sweep_object_key ON gc_sweep (object_key);
