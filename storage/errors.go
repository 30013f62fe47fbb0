package storage

import "gradient.dev/gradient/storage/sqldb"

// Errors every method wraps, so the HTTP layer can pick a status with
// errors.Is: ErrNotFound → 404, ErrConflict → 409, ErrInvalid → 400.
// The wrapping message says what was missing or clashing. They are
// sqldb's, which the proxy's store wraps too.
var (
	ErrNotFound = sqldb.ErrNotFound
	ErrConflict = sqldb.ErrConflict
	ErrInvalid  = sqldb.ErrInvalid
)

func notFound(format string, args ...any) error { return sqldb.NotFound(format, args...) }

func conflict(format string, args ...any) error { return sqldb.Conflict(format, args...) }

func invalid(format string, args ...any) error { return sqldb.Invalid(format, args...) }

// storage's short names for sqldb's constraint classification.
const (
	uniqueViolation     = sqldb.UniqueViolation
	foreignKeyViolation = sqldb.ForeignKeyViolation
	checkViolation      = sqldb.CheckViolation
)

func constraintOf(err error) sqldb.Constraint { return sqldb.ConstraintOf(err) }
