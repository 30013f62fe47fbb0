package session

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// watchHeartbeat calls expire once no message arrived for timeout. It costs
// one timer per session and nothing per message: the timer re-arms for the
// remaining time whenever it finds the session was heard from.
func watchHeartbeat(idleFor func(time.Time) time.Duration, timeout time.Duration, expire func(string)) (arm, stop func()) {
	var timer *time.Timer
	timer = time.AfterFunc(time.Hour, func() {
		idle := idleFor(time.Now())
		if idle >= timeout {
			expire(fmt.Sprintf("no message for %s (heartbeat timeout)", timeout))
			return
		}
		timer.Reset(timeout - idle)
	})
	timer.Stop()
	return func() { timer.Reset(timeout) }, func() { timer.Stop() }
}

// watchAcks proves every interval that the peer has read what was sent: a
// WebSocket ping is queued behind the data already written, and its pong
// comes back only after the peer's reader consumed that data. A ping not
// answered within timeout means data sent before it stayed unacknowledged
// that long, and expire is called.
func watchAcks(p pinger, timeout, interval time.Duration, expire func(string)) (arm, stop func()) {
	if interval <= 0 {
		interval = timeout / 4
	}
	ctx, cancel := context.WithCancel(context.Background())
	var timer *time.Timer
	timer = time.AfterFunc(time.Hour, func() {
		pctx, pcancel := context.WithTimeout(ctx, timeout)
		err := p.Ping(pctx)
		pcancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, context.DeadlineExceeded) {
			expire(fmt.Sprintf("sent data unacknowledged for %s", timeout))
			return
		}
		if err != nil {
			expire("connection lost: " + err.Error())
			return
		}
		timer.Reset(interval)
	})
	timer.Stop()
	return func() { timer.Reset(interval) }, func() { cancel(); timer.Stop() }
}
