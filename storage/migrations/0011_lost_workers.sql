-- How many sessions in a row ended while holding the job, without a
-- report from their worker. A build that crashes every worker it runs on
-- fails for good at the limit (docs/protocol/jobs.md §12.4) instead of going round the
-- pool for ever; a report (success or failure) starts the count again.
ALTER TABLE jobs ADD COLUMN lost_workers INTEGER NOT NULL DEFAULT 0;
