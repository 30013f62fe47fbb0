package daemon

import (
	"context"
	"math"
)

// opCollectGarbage is Nix's WorkerProto::Op CollectGarbage.
const opCollectGarbage = 20

// gcDeleteDead is GCOptions::gcDeleteDead: delete what no root reaches.
const gcDeleteDead = 2

// GCResult is what a collection deleted.
type GCResult struct {
	// Paths is how many store paths (and other entries, such as
	// temporary build directories) were deleted.
	Paths int
	// BytesFreed is the size of what was deleted, as the daemon counts it.
	BytesFreed uint64
}

// CollectGarbage deletes dead store paths until maxFreed bytes are freed
// (math.MaxUint64: every dead path). The idle connections are closed
// first: the daemon keeps whatever a connection added or built as a
// temporary root until the connection ends, so otherwise nothing this
// client ever touched could go. Busy connections keep theirs.
func (c *Client) CollectGarbage(ctx context.Context, maxFreed uint64) (GCResult, error) {
	c.dropIdle()
	var res GCResult
	// Not idempotent: a retry would free more than asked.
	err := c.do(ctx, false, func(cn *conn) error {
		cn.w.u64(opCollectGarbage).u64(gcDeleteDead).strings(nil).u64(0).u64(maxFreed)
		cn.w.u64(0).u64(0).u64(0) // obsolete fields
		if err := cn.request(nil); err != nil {
			return err
		}
		n, err := cn.r.count()
		if err != nil {
			return err
		}
		// Only the count matters; the names are read and dropped.
		for range n {
			if _, err := cn.r.bytes(); err != nil {
				return err
			}
		}
		res.Paths = n
		if res.BytesFreed, err = cn.r.u64(); err != nil {
			return err
		}
		_, err = cn.r.u64() // obsolete
		return err
	})
	return res, err
}

// FreeAll is the maxFreed that deletes every dead path.
const FreeAll = math.MaxUint64
