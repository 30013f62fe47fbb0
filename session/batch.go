package session

// queues are the writer's two lanes and the batching rule of docs/protocol/session.md
// §6.3, separate from the task so batches can be tested directly.
type queues struct {
	control chan []byte
	bulk    chan []byte
	// held is a message taken while waiting on both lanes; it opens the
	// next batch of its lane.
	held     []byte
	heldLane Lane
}

func newQueues() *queues {
	return &queues{control: make(chan []byte, ControlLaneDepth), bulk: make(chan []byte, BulkLaneDepth)}
}

// next fills dst with the next batch: every ready control message (up to
// WriteBatch) if there is one, else ready bulk messages (up to WriteBatch,
// no more added once BulkBatchBytes are held). Batches never mix lanes.
// With nothing ready it waits on both lanes until stop or abort is closed;
// then it returns an empty batch.
func (q *queues) next(dst [][]byte, stop, abort <-chan struct{}) ([][]byte, Lane) {
	for {
		if b := q.drainControl(dst); len(b) > 0 {
			return b, ControlLane
		}
		if b := q.drainBulk(dst); len(b) > 0 {
			return b, BulkLane
		}
		select {
		case m := <-q.control:
			q.held, q.heldLane = m, ControlLane
		case m := <-q.bulk:
			// Control is still preferred: the loop drains control first
			// and this message opens the bulk batch after it.
			q.held, q.heldLane = m, BulkLane
		case <-stop:
			return dst[:0], ControlLane
		case <-abort:
			return dst[:0], ControlLane
		}
	}
}

func (q *queues) takeHeld(lane Lane) []byte {
	if q.held == nil || q.heldLane != lane {
		return nil
	}
	m := q.held
	q.held = nil
	return m
}

func (q *queues) drainControl(dst [][]byte) [][]byte {
	dst = dst[:0]
	if m := q.takeHeld(ControlLane); m != nil {
		dst = append(dst, m)
	}
	for len(dst) < WriteBatch {
		select {
		case m := <-q.control:
			dst = append(dst, m)
		default:
			return dst
		}
	}
	return dst
}

func (q *queues) drainBulk(dst [][]byte) [][]byte {
	dst = dst[:0]
	size := 0
	if m := q.takeHeld(BulkLane); m != nil {
		dst = append(dst, m)
		size += len(m)
	}
	for len(dst) < WriteBatch && size < BulkBatchBytes {
		select {
		case m := <-q.bulk:
			dst = append(dst, m)
			size += len(m)
		default:
			return dst
		}
	}
	return dst
}

// appendSmallBulk adds ready bulk messages to a control batch, for a
// transport that gathers small frames into one write (coalescingConn):
// small job reports (JobCompleted, a LogChunk line) then leave in the same
// system call as the control replies before them. It adds messages of at
// most small bytes each, at most limit bytes and WriteBatch messages in
// all; the first that does not fit is held and opens the next bulk batch,
// so a large chunk never joins a control batch (docs/protocol/session.md §6.3, 1).
func (q *queues) appendSmallBulk(dst [][]byte, small, limit int) [][]byte {
	size := 0
	for range WriteBatch {
		var m []byte
		switch {
		case q.held != nil && q.heldLane != BulkLane:
			return dst
		case q.held != nil:
			m, q.held = q.held, nil
		default:
			select {
			case m = <-q.bulk:
			default:
				return dst
			}
		}
		if len(m) > small || size+len(m) > limit {
			q.held, q.heldLane = m, BulkLane
			return dst
		}
		dst = append(dst, m)
		size += len(m)
	}
	return dst
}
