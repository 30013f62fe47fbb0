-- Builds an evaluation needs before it can finish evaluating (import
-- from derivation): they, unlike the rest, are queued while the
-- evaluation still runs.
ALTER TABLE builds ADD COLUMN for_import BOOLEAN NOT NULL DEFAULT FALSE;
