package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Leases make something run on one server instance at a time when several
// share a PostgreSQL database (README "Several instances"): a row names
// the lease, its owner (an instance ID) and when it expires.
//
// Rows rather than PostgreSQL advisory locks, because:
//   - an advisory lock lives as long as its connection, so an instance
//     would pin one connection of its bounded pool per lock it holds, and
//     a lock cannot outlive the work it guards; a lease can, which is how
//     "once per interval" is said (a branch polled once per poll interval
//     across instances: the lease expires when the next poll is due);
//   - a row is visible: an operator sees who holds what, and a lease of a
//     dead instance simply expires (its owner stops renewing it).
//
// Expiry is compared with the database's clock, so instances' clocks need
// not agree. On SQLite (one instance) the same statements work.

// Lease is one lease row.
type Lease struct {
	Name       string
	Owner      string
	AcquiredAt time.Time
	ExpiresAt  time.Time
}

// dbNowMillis is the database's clock in milliseconds, as SQL.
func (db *DB) dbNowMillis() string { return db.ClockMillisSQL() }

// ClockMillisSQL is the database's clock in milliseconds, as an SQL
// expression: what leases (server_instances.lease_until among them) are
// compared with.
func (db *DB) ClockMillisSQL() string {
	if db.engine == EnginePostgres {
		return `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`
	}
	return `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`
}

func checkLease(name, owner string, ttl time.Duration) error {
	if name == "" || owner == "" || len(name) > 300 || len(owner) > 200 {
		return fmt.Errorf("%w: lease name and owner must be 1-300 and 1-200 bytes", ErrInvalid)
	}
	if ttl <= 0 {
		return fmt.Errorf("%w: lease duration must be positive", ErrInvalid)
	}
	return nil
}

// AcquireLease takes the lease name for owner for ttl when nobody holds
// it or its holder's lease has expired, and reports whether it did. It is
// not reentrant: a lease owner still holds is not taken again (callers
// serialise their own work in process). One statement, so two instances
// asking at once cannot both get it: PostgreSQL re-checks the WHERE of
// ON CONFLICT DO UPDATE on the row it locked.
func (db *DB) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := checkLease(name, owner, ttl); err != nil {
		return false, err
	}
	now := db.dbNowMillis()
	var got string
	unlock := db.base.LockWriter() // SQLite's one writer; nothing on PostgreSQL
	defer unlock()
	err := db.sql.QueryRowContext(ctx, `INSERT INTO leases (name, owner, acquired_at, expires_at)
		VALUES ($1, $2, `+now+`, `+now+` + $3)
		ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, acquired_at = excluded.acquired_at,
			expires_at = excluded.expires_at
		WHERE leases.expires_at <= excluded.acquired_at
		RETURNING owner`, name, owner, ttl.Milliseconds()).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return got == owner, nil
}

// RenewLease moves the expiry of owner's lease to ttl from now and
// reports whether owner still held it (false: another instance took it
// after it expired, or it was released).
func (db *DB) RenewLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := checkLease(name, owner, ttl); err != nil {
		return false, err
	}
	res, err := db.exec(ctx, `UPDATE leases SET expires_at = `+db.dbNowMillis()+` + $3
		WHERE name = $1 AND owner = $2`, name, owner, ttl.Milliseconds())
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ReleaseLease ends owner's lease at once; another owner's is left alone.
func (db *DB) ReleaseLease(ctx context.Context, name, owner string) error {
	_, err := db.exec(ctx, `DELETE FROM leases WHERE name = $1 AND owner = $2`, name, owner)
	return err
}

// LeaseHolder is the lease's row while it has not expired; ErrNotFound
// when nobody holds it.
func (db *DB) LeaseHolder(ctx context.Context, name string) (Lease, error) {
	var l Lease
	var acquired, expires int64
	err := db.sql.QueryRowContext(ctx, `SELECT name, owner, acquired_at, expires_at FROM leases
		WHERE name = $1 AND expires_at > `+db.dbNowMillis(), name).Scan(&l.Name, &l.Owner, &acquired, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return Lease{}, ErrNotFound
	}
	l.AcquiredAt, l.ExpiresAt = fromMillis(acquired), fromMillis(expires)
	return l, err
}

// PruneLeases deletes leases that expired more than ago (those of deleted
// projects' polls, of runs long over) and returns how many.
func (db *DB) PruneLeases(ctx context.Context, ago time.Duration) (int, error) {
	res, err := db.exec(ctx, `DELETE FROM leases WHERE expires_at < `+db.dbNowMillis()+` - $1`, ago.Milliseconds())
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
