package sqldb

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Errors every store method wraps, so an HTTP layer can pick a status
// with errors.Is: ErrNotFound → 404, ErrConflict → 409, ErrInvalid → 400.
// The wrapping message says what was missing or clashing.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid")
)

// NotFound is ErrNotFound with a message.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrNotFound}, args...)...)
}

// Conflict is ErrConflict with a message.
func Conflict(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConflict}, args...)...)
}

// Invalid is ErrInvalid with a message.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Constraint tells which integrity constraint a driver error broke, so
// both engines map to the same typed errors.
type Constraint int

const (
	NoConstraint Constraint = iota
	UniqueViolation
	ForeignKeyViolation
	CheckViolation
)

// ConstraintOf classifies err from either engine's driver.
func ConstraintOf(err error) Constraint {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505":
			return UniqueViolation
		case "23503":
			return ForeignKeyViolation
		case "23514":
			return CheckViolation
		}
		return NoConstraint
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return UniqueViolation
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return ForeignKeyViolation
		case sqlite3.SQLITE_CONSTRAINT_CHECK:
			return CheckViolation
		}
	}
	return NoConstraint
}
