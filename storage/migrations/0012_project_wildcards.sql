-- The attribute patterns a project's evaluations build (docs/protocol/worker.md §6.2),
-- a JSON array of strings. Existing projects keep what every evaluation
-- built before: the default.
ALTER TABLE projects ADD COLUMN wildcards TEXT NOT NULL DEFAULT '["packages.x86_64-linux.*"]';
