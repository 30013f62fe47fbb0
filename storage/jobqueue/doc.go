// Package jobqueue is the server's durable job queue, on the storage
// database (see storage/migrations/0004_jobs.sql); its records are
// storage's types (storage.Evaluation, storage.Build, storage.PendingJob…).
//
// An evaluation of a project's commit owns one flake job. Its worker
// reports the derivations it discovered (AddDiscoveredDerivations): each
// becomes a waiting build. When the flake job completes, every build whose
// dependencies are built becomes queued with a pending build job; each
// completed build readies its dependents the same way. Jobs are claimed by
// opening an assignment (at most one open per job) and end through
// CompleteFlakeJob, CompleteBuild, FailJob, ReleaseAssignment or
// CancelEvaluation. Every state change is one short transaction; the
// scheduler keeps its hot state in memory and reads the queue back with
// PendingJobs after a restart (RecoverInterruptedWork first).
//
// Several server instances may share the queue (README "Several
// instances"): each assignment names the instance it was claimed for
// (ForInstance), a start recovers only its own previous run's, the
// ownerless and dead instances' assignments, and every scheduler pass
// re-queues dead instances' running jobs exactly once across the
// instances (RecoverDeadInstances; recovery.go).
//
// # Engines
//
// The queue's code is written once for both engines; what differs is the
// small engine interface (engine.go), implemented once for SQLite
// (sqlite.go: the generic statement sequences under the one write lock)
// and once for PostgreSQL (postgres.go: row locks, commits that do not
// wait for the WAL flush, and claims and completions folded into
// statements that concurrent calls share). Callers see the difference only
// as ParallelCompletions.
package jobqueue
