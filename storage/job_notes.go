package storage

import (
	"context"

	"gradient.dev/gradient/storage/sqldb"
)

// The job loops of the server instances sharing one PostgreSQL schema
// tell each other about work on their own channel (README "Several
// instances"): jobs one made pending, assignments to abort. What a note
// says is the job loop's business (server/scheduler); storage only
// carries it.

// jobsChannel is the channel of the job loops' notes.
func (db *DB) jobsChannel(ctx context.Context) (string, error) {
	return db.channelFor(ctx, "gradient_jobs_")
}

// MaxNotePayload is the largest payload PostgreSQL's NOTIFY carries (its
// limit is 8000 bytes).
const MaxNotePayload = 7999

// NotifyJobs sends payload to the job loops of the instances sharing this
// database schema (PostgreSQL only; sqldb.ErrNoNotifications on SQLite).
func (db *DB) NotifyJobs(ctx context.Context, payload string) error {
	if db.engine != EnginePostgres {
		return sqldb.ErrNoNotifications
	}
	if len(payload) > MaxNotePayload {
		return sqldb.Invalid("job note of %d bytes is over PostgreSQL's limit", len(payload))
	}
	channel, err := db.jobsChannel(ctx)
	if err != nil {
		return err
	}
	return db.base.Notify(ctx, channel, payload)
}

// ListenJobs listens to what NotifyJobs sends until ctx ends or the
// connection fails (sqldb.DB.Listen; PostgreSQL only). ready runs each
// time the LISTEN is in place; handle must not block.
func (db *DB) ListenJobs(ctx context.Context, ready func(), handle func(payload string)) error {
	if db.engine != EnginePostgres {
		return sqldb.ErrNoNotifications
	}
	channel, err := db.jobsChannel(ctx)
	if err != nil {
		return err
	}
	return db.base.Listen(ctx, channel, ready, handle)
}
