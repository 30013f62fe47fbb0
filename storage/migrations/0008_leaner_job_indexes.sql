-- Every state change of a job rewrites its row, and each index of the
-- table gets an entry for the new version: an index costs on every claim
-- and completion. Lookups by evaluation only ever want the active jobs
-- (cancel, dependency failures) or the flake job (its log), so partial
-- indexes over those serve them, and finished jobs stay out of them.
DROP INDEX jobs_by_evaluation;
CREATE INDEX jobs_active_by_evaluation ON jobs (evaluation_id) WHERE status IN ('pending', 'assigned');
CREATE INDEX jobs_flake_by_evaluation ON jobs (evaluation_id) WHERE kind = 'flake';
-- Assignments are looked up by ID, or as open ones (job_assignments_open).
DROP INDEX job_assignments_by_job;
