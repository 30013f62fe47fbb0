package storage

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// WorkerSession is one instance's claim on a worker ID (table
// worker_sessions): the rule of one live session per worker ID across the
// server instances sharing the database (docs/protocol/connection.md).
type WorkerSession struct {
	WorkerID    string
	InstanceID  string
	Nonce       string // tells this session from the worker ID's next one
	ConnectedAt time.Time
	LeaseUntil  time.Time // by the database's clock
	// Status is the holder's view of the session (JSON), shown by the
	// other instances.
	Status []byte
}

// sessionsChannel is the PostgreSQL notification channel on which
// instances ask each other about the sessions they hold (channelFor).
func (db *DB) sessionsChannel(ctx context.Context) (string, error) {
	return db.channelFor(ctx, "gradient_worker_sessions_")
}

// channelFor names a PostgreSQL notification channel of the instances
// sharing this schema. Notifications go to the whole database, so a
// channel is named after the schema the instances share: deployments in
// other schemas of the database never hear them.
func (db *DB) channelFor(ctx context.Context, prefix string) (string, error) {
	db.channelMu.Lock()
	defer db.channelMu.Unlock()
	if db.schemaTag == "" {
		var schema string
		if err := db.sql.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			return "", err
		}
		sum := sha256.Sum256([]byte(schema))
		db.schemaTag = hex.EncodeToString(sum[:8])
	}
	return prefix + db.schemaTag, nil
}

// ClaimWorkerSession takes s.WorkerID for s with a lease of ttl when no
// instance holds it, its holder's lease ran out, or s.InstanceID itself
// holds it (a row its release missed: the instance knows it holds no
// session). Otherwise it returns the holding instance's ID and claims
// nothing.
func (db *DB) ClaimWorkerSession(ctx context.Context, s WorkerSession, ttl time.Duration) (holder string, err error) {
	now := db.dbNowMillis()
	status := s.Status
	if len(status) == 0 {
		status = []byte("{}")
	}
	var got string
	err = db.sql.QueryRowContext(ctx, `
		INSERT INTO worker_sessions (worker_id, instance_id, nonce, connected_at, lease_until, status)
		VALUES ($1, $2, $3, $4, `+now+` + $5, $6)
		ON CONFLICT (worker_id) DO UPDATE SET
			instance_id = excluded.instance_id, nonce = excluded.nonce, connected_at = excluded.connected_at,
			lease_until = excluded.lease_until, status = excluded.status
		WHERE worker_sessions.lease_until < `+now+` OR worker_sessions.instance_id = excluded.instance_id
		RETURNING nonce`,
		s.WorkerID, s.InstanceID, s.Nonce, s.ConnectedAt.UnixMilli(), ttl.Milliseconds(), string(status)).Scan(&got)
	if err == nil {
		return "", nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	// Refused: name the holder. It may have gone in between; the caller
	// refuses this attempt anyway and the worker's next one claims it.
	err = db.sql.QueryRowContext(ctx, `SELECT instance_id FROM worker_sessions WHERE worker_id = $1`, s.WorkerID).Scan(&holder)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errors.New("storage: worker session claim refused, then its holder went away")
	}
	return holder, err
}

// RenewWorkerSessions extends the leases of instance's sessions by ttl
// and stores their current status; it returns the worker IDs among them
// whose row is no longer theirs (another instance took the claim over
// after the lease ran out, or it was deleted).
func (db *DB) RenewWorkerSessions(ctx context.Context, instance string, sessions []WorkerSession, ttl time.Duration) (lost []string, err error) {
	if len(sessions) == 0 {
		return nil, nil
	}
	now := db.dbNowMillis()
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		lost = lost[:0]
		for _, s := range sessions {
			status := s.Status
			if len(status) == 0 {
				status = []byte("{}")
			}
			res, err := tx.ExecContext(ctx, `UPDATE worker_sessions SET lease_until = `+now+` + $1, status = $2
				WHERE worker_id = $3 AND instance_id = $4 AND nonce = $5`,
				ttl.Milliseconds(), string(status), s.WorkerID, instance, s.Nonce)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				lost = append(lost, s.WorkerID)
			}
		}
		return nil
	})
	return lost, err
}

// ReleaseWorkerSession deletes the claim of one session, if it is still
// that session's.
func (db *DB) ReleaseWorkerSession(ctx context.Context, workerID, instance, nonce string) error {
	_, err := db.exec(ctx, `DELETE FROM worker_sessions WHERE worker_id = $1 AND instance_id = $2 AND nonce = $3`,
		workerID, instance, nonce)
	return err
}

// LiveWorkerSession is the unexpired claim on workerID; false when none.
func (db *DB) LiveWorkerSession(ctx context.Context, workerID string) (WorkerSession, bool, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT worker_id, instance_id, nonce, connected_at, lease_until, status
		FROM worker_sessions WHERE worker_id = $1 AND lease_until >= `+db.dbNowMillis(), workerID)
	list, err := collect(rows, err, scanWorkerSession)
	if err != nil || len(list) == 0 {
		return WorkerSession{}, false, err
	}
	return list[0], true, nil
}

// LiveWorkerSessions lists every unexpired claim, of every instance.
func (db *DB) LiveWorkerSessions(ctx context.Context) ([]WorkerSession, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT worker_id, instance_id, nonce, connected_at, lease_until, status
		FROM worker_sessions WHERE lease_until >= `+db.dbNowMillis()+` ORDER BY worker_id`)
	return collect(rows, err, scanWorkerSession)
}

// LiveWorkerSessionCounts counts the unexpired claims by holding
// instance: how many worker sessions each instance holds.
func (db *DB) LiveWorkerSessionCounts(ctx context.Context) (map[string]int, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT instance_id, count(*) FROM worker_sessions
		WHERE lease_until >= `+db.dbNowMillis()+` GROUP BY instance_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		counts[id] = n
	}
	return counts, rows.Err()
}

func scanWorkerSession(rows *sql.Rows) (WorkerSession, error) {
	var s WorkerSession
	var connected, lease int64
	var status string
	if err := rows.Scan(&s.WorkerID, &s.InstanceID, &s.Nonce, &connected, &lease, &status); err != nil {
		return s, err
	}
	s.ConnectedAt, s.LeaseUntil, s.Status = time.UnixMilli(connected), time.UnixMilli(lease), []byte(status)
	return s, nil
}

// NotifyWorkerSessions sends payload to the instances sharing this
// database schema (PostgreSQL only).
func (db *DB) NotifyWorkerSessions(ctx context.Context, payload string) error {
	if db.engine != EnginePostgres {
		return sqldb.ErrNoNotifications
	}
	channel, err := db.sessionsChannel(ctx)
	if err != nil {
		return err
	}
	return db.base.Notify(ctx, channel, payload)
}

// ListenWorkerSessions listens to what NotifyWorkerSessions sends until
// ctx ends or the connection fails (sqldb.DB.Listen; PostgreSQL only).
func (db *DB) ListenWorkerSessions(ctx context.Context, ready func(), handle func(payload string)) error {
	if db.engine != EnginePostgres {
		return sqldb.ErrNoNotifications
	}
	channel, err := db.sessionsChannel(ctx)
	if err != nil {
		return err
	}
	return db.base.Listen(ctx, channel, ready, handle)
}
