package proxystore

import (
	"context"
	"database/sql"
	"errors"

	"gradient.dev/gradient/storage/sqldb"
)

// maxAddrLen bounds a stored source address (an IPv6 address with a
// zone is well below it).
const maxAddrLen = 64

// VMBinding is what BindVMWorker decided for one handshake.
type VMBinding struct {
	// VM: the worker is a Hetzner VM's; false for the proxy's other
	// workers, whose tokens are not one-time (the rest is then unset).
	VM bool
	// Accepted: the VM's row is open and its token is bound to the
	// handshake's address (by this handshake or an earlier one).
	Accepted bool
	// BoundTo is the address the token is bound to ("" while unbound,
	// e.g. when the row is closed before any handshake).
	BoundTo string
}

// BindVMWorker makes a Hetzner VM's worker token one-time: the first
// handshake whose token passed binds the VM's row to addr, the
// handshake's source address; later handshakes are accepted only from
// that address and only while the row is open (creating or running).
// The binding is a compare-and-set, so of two first handshakes from
// different addresses one wins. An unknown address ("") is refused. A
// worker that is no VM's is VM false.
func (s *Store) BindVMWorker(ctx context.Context, workerID, addr string) (VMBinding, error) {
	id, err := sqldb.CanonicalUUID("worker ID", workerID)
	if err != nil {
		return VMBinding{}, err
	}
	if len(addr) > maxAddrLen {
		return VMBinding{}, sqldb.Invalid("a worker's source address is longer than %d characters", maxAddrLen)
	}
	read := func() (VMOutcome, sql.NullString, error) {
		var outcome VMOutcome
		var bound sql.NullString
		err := s.sql.QueryRowContext(ctx, `SELECT outcome, worker_addr FROM vm_usage WHERE worker_id = $1`, id).Scan(&outcome, &bound)
		return outcome, bound, err
	}
	outcome, bound, err := read()
	if errors.Is(err, sql.ErrNoRows) {
		return VMBinding{}, nil // no VM's worker: the common case reads only
	}
	if err != nil {
		return VMBinding{}, err
	}
	// An unknown address ("") binds nothing and is never accepted.
	if !bound.Valid && outcome.Open() && addr != "" {
		if _, err := s.db.Exec(ctx, `UPDATE vm_usage SET worker_addr = $2
			WHERE worker_id = $1 AND worker_addr IS NULL AND outcome IN ('creating', 'running')`, id, addr); err != nil {
			return VMBinding{}, err
		}
		if outcome, bound, err = read(); err != nil {
			return VMBinding{}, err
		}
	}
	return VMBinding{VM: true, Accepted: addr != "" && outcome.Open() && bound.String == addr, BoundTo: bound.String}, nil
}
