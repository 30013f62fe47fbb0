package scheduler

import (
	"context"
	"sync"
	"time"
)

// Build logs arrive as many small LogChunks (a line each, from most
// builders); one database insert per chunk would make logging the
// heaviest thing the queue does. The log buffer keeps each job's recent
// output and writes it as one row when it reaches logFlushBytes, every
// logFlushInterval, and before the job's end is recorded, so a finished
// job's log is complete. A crash loses at most the last interval.
const (
	logFlushBytes    = 64 << 10
	logFlushInterval = time.Second
)

type logBuffer struct {
	s *Scheduler

	mu   sync.Mutex
	jobs map[string][]byte
}

func newLogBuffer(s *Scheduler) *logBuffer {
	return &logBuffer{s: s, jobs: map[string][]byte{}}
}

// add appends data to jobID's log, writing it out when it is large.
func (b *logBuffer) add(ctx context.Context, jobID string, data []byte) {
	b.mu.Lock()
	buf := append(b.jobs[jobID], data...)
	if len(buf) < logFlushBytes {
		b.jobs[jobID] = buf
		b.mu.Unlock()
		return
	}
	delete(b.jobs, jobID)
	b.mu.Unlock()
	b.write(ctx, jobID, buf)
}

// flush writes out jobID's buffered log (before its end is recorded).
func (b *logBuffer) flush(ctx context.Context, jobID string) {
	b.mu.Lock()
	buf := b.jobs[jobID]
	delete(b.jobs, jobID)
	b.mu.Unlock()
	if len(buf) > 0 {
		b.write(ctx, jobID, buf)
	}
}

// flushAll writes out every buffered log.
func (b *logBuffer) flushAll(ctx context.Context) {
	b.mu.Lock()
	jobs := b.jobs
	b.jobs = map[string][]byte{}
	b.mu.Unlock()
	for id, buf := range jobs {
		b.write(ctx, id, buf)
	}
}

func (b *logBuffer) write(ctx context.Context, jobID string, buf []byte) {
	if err := b.s.queue.AppendJobLog(ctx, jobID, buf); err != nil {
		b.s.log.Warn("storing a job's log failed", "job", jobID, "bytes", len(buf), "error", err)
	}
}

// run flushes every interval until ctx ends, then once more.
func (b *logBuffer) run(ctx context.Context) {
	t := time.NewTicker(logFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.flushAll(context.WithoutCancel(ctx))
			return
		case <-t.C:
			b.flushAll(ctx)
		}
	}
}
