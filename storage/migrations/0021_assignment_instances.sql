-- Job ownership across server instances (README "Several instances",
-- docs/protocol/jobs.md §12.6). instance_id is the server instance
-- (server_instances.id) whose job loop opened the assignment and talks to
-- its worker. NULL: no owner recorded (assignments opened before this
-- migration, or by a job loop without an instance ID); only a starting
-- instance recovers those.
--
-- When an instance dies (its server_instances row gone or its lease
-- passed), another instance closes that instance's open assignments as
-- "server instance lost" and queues their jobs again; a starting instance
-- closes its own previous run's, the ownerless ones and dead instances',
-- never a live instance's.
ALTER TABLE job_assignments ADD COLUMN instance_id TEXT;

-- "The open assignments of instance X" and "the instances that hold open
-- assignments": partial, so it holds only running work (a few entries per
-- worker slot), however many assignments were ever closed.
CREATE INDEX job_assignments_open_by_instance ON job_assignments (instance_id) WHERE closed_at IS NULL;
