package instance

import (
	"context"
	"fmt"
	"time"

	"gradient.dev/gradient/storage"
)

// One at a time across instances, on storage's lease rows (see
// storage/leases.go for why rows rather than advisory locks). A nil
// Instance, or one on SQLite, is the only instance: every lease is its own
// and nothing is written.

// TakeFor takes the lease name for d if no instance holds it, and reports
// whether it did. Not reentrant: callers serialise their own work.
func (i *Instance) TakeFor(ctx context.Context, name string, d time.Duration) (bool, error) {
	if i == nil || !i.shared {
		return true, nil
	}
	return i.db.AcquireLease(ctx, name, i.cfg.ID, d)
}

// HoldFor makes the lease name, which this instance took, end d from now
// (at once when d <= 0): e.g. a poll that took its lease for the poll's
// length keeps it until the next poll is due. False: the lease was lost.
func (i *Instance) HoldFor(ctx context.Context, name string, d time.Duration) (bool, error) {
	if i == nil || !i.shared {
		return true, nil
	}
	if d <= 0 {
		return true, i.db.ReleaseLease(ctx, name, i.cfg.ID)
	}
	return i.db.RenewLease(ctx, name, i.cfg.ID, d)
}

// ErrHeldElsewhere: another instance holds the lease (RunExclusive).
type ErrHeldElsewhere struct {
	Name, Holder string
}

func (e *ErrHeldElsewhere) Error() string {
	return fmt.Sprintf("%s is running on server instance %s", e.Name, e.Holder)
}

// Is makes the error a storage.ErrConflict, so the admin API answers 409.
func (e *ErrHeldElsewhere) Is(target error) bool { return target == storage.ErrConflict }

// RunExclusive runs fn while holding the lease name, renewing it every
// RenewEvery for Lease, and releases it after; if another instance holds
// it, fn does not run and the error is *ErrHeldElsewhere. fn's context
// ends if the lease is lost (not renewed in time, taken over): two
// instances must not both go on.
func (i *Instance) RunExclusive(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if i == nil || !i.shared {
		return fn(ctx)
	}
	ok, err := i.db.AcquireLease(ctx, name, i.cfg.ID, i.cfg.Lease)
	if err != nil {
		return fmt.Errorf("lease %s: %w", name, err)
	}
	if !ok {
		holder := "(unknown)"
		if l, err := i.db.LeaseHolder(ctx, name); err == nil {
			holder = l.Owner
		}
		return &ErrHeldElsewhere{Name: name, Holder: holder}
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(i.cfg.RenewEvery)
		defer t.Stop()
		lastOK := time.Now()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			ok, err := i.db.RenewLease(runCtx, name, i.cfg.ID, i.cfg.Lease)
			switch {
			case err == nil && ok:
				lastOK = time.Now()
			case err == nil:
				cancel(fmt.Errorf("lease %s was taken over by another instance", name))
				return
			case time.Since(lastOK) >= i.cfg.Lease-i.cfg.RenewEvery:
				cancel(fmt.Errorf("lease %s could not be renewed: %w", name, err))
				return
			}
		}
	}()
	err = fn(runCtx)
	cause := context.Cause(runCtx) // nil unless the lease was lost or ctx ended
	cancel(nil)
	<-renewed
	if err != nil && cause != nil && ctx.Err() == nil {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	if rerr := i.db.ReleaseLease(context.WithoutCancel(ctx), name, i.cfg.ID); rerr != nil {
		i.log.Warn("server instance: releasing a lease failed (it expires)", "lease", name, "error", rerr)
	}
	return err
}
