package sqldb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrNoNotifications: SQLite has no LISTEN/NOTIFY (one process uses it).
var ErrNoNotifications = errors.New("storage: notifications need PostgreSQL")

// Listen holds one connection of the pool for LISTEN channel and calls
// handle with each notification's payload until ctx ends or the
// connection fails; ready runs once the LISTEN is in place, so a caller
// knows notifications sent after it arrive. handle runs on the listening
// goroutine: it must not block.
func (db *DB) Listen(ctx context.Context, channel string, ready func(), handle func(payload string)) error {
	if db.engine != EnginePostgres {
		return ErrNoNotifications
	}
	conn, err := db.sql.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("storage: listen on a %T connection", dc)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return errors.Join(err, driver.ErrBadConn)
		}
		if ready != nil {
			ready()
		}
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				// A wait cut short leaves the connection listening (or
				// closed): never hand it back to the pool.
				return errors.Join(err, driver.ErrBadConn)
			}
			handle(n.Payload)
		}
	})
}

// Notify sends payload on channel to every listener of the database
// (PostgreSQL delivers it when the sending transaction commits; here at
// once). Payloads are limited to 8000 bytes by PostgreSQL.
func (db *DB) Notify(ctx context.Context, channel, payload string) error {
	if db.engine != EnginePostgres {
		return ErrNoNotifications
	}
	_, err := db.sql.ExecContext(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
	return err
}
