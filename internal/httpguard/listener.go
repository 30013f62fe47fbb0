package httpguard

import (
	"container/list"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Listener accepts for an http.Server and keeps it answering near the
// process's open-file limit (RLIMIT_NOFILE). Past the limit every accept
// fails with EMFILE, and the server stops answering anyone, /healthz
// included, until some client lets go. So the Listener makes room
// instead of waiting: when an accepted socket's descriptor comes within
// a reserve of the limit, or an accept fails with EMFILE or ENFILE, it
// closes the oldest connection that holds nothing — an idle keep-alive
// connection, then one that has not sent a whole request, then (through
// ShedUnauthenticated) a WebSocket that has not finished its handshake.
// Sessions past their handshake and requests being served are never
// closed. When nothing can be closed, accepting backs off and retries
// rather than failing.
//
// Install ConnState as the http.Server's ConnState; Serve the server on
// the Listener, without TLS (the states are kept per accepted conn).
type Listener struct {
	net.Listener
	log *slog.Logger
	// ShedUnauthenticated closes one unauthenticated WebSocket (the
	// authority's budget); false when there is none. Optional.
	ShedUnauthenticated func() bool

	limit, reserve int

	mu sync.Mutex
	// Guarded by mu: every accepted conn not hijacked or closed, oldest
	// first, in the queue of its state.
	waiting *list.List // StateNew: no whole request yet
	idle    *list.List // StateIdle: keep-alive between requests
	open    int

	shed       *prometheus.CounterVec
	fileLimits prometheus.Counter
	openGauge  prometheus.Gauge
}

// Metrics are a Listener's series, named with the binary's prefix.
type Metrics struct {
	shed       *prometheus.CounterVec
	fileLimits prometheus.Counter
	open       prometheus.Gauge
}

// NewMetrics registers the series prefix_http_connections_shed_total
// {state}, prefix_http_accept_file_limit_total and
// prefix_http_connections_open.
func NewMetrics(reg prometheus.Registerer, prefix string) (*Metrics, error) {
	m := &Metrics{
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + "_http_connections_shed_total",
			Help: "HTTP connections closed near the open-file limit to make room, by state: idle (keep-alive), new (no whole request yet), unauthenticated (a WebSocket before its handshake ended)."},
			[]string{"state"}),
		fileLimits: prometheus.NewCounter(prometheus.CounterOpts{Name: prefix + "_http_accept_file_limit_total",
			Help: "Accepts that failed for the open-file limit (EMFILE, ENFILE) and were retried after making room or backing off."}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: prefix + "_http_connections_open",
			Help: "HTTP connections accepted and not yet closed or upgraded."}),
	}
	for _, c := range []prometheus.Collector{m.shed, m.fileLimits, m.open} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// NewListener guards ln; m may be nil (no series).
func NewListener(ln net.Listener, m *Metrics, log *slog.Logger) *Listener {
	l := &Listener{Listener: ln, log: log, waiting: list.New(), idle: list.New()}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < 1<<31 {
		l.limit = int(rl.Cur)
		// Room for the files, database connections and outbound
		// sessions the process opens besides the accepted sockets.
		l.reserve = min(max(l.limit/16, 16), 256)
	}
	if m == nil {
		m, _ = NewMetrics(prometheus.NewRegistry(), "unregistered")
	}
	l.shed, l.fileLimits, l.openGauge = m.shed, m.fileLimits, m.open
	return l
}

// Accept returns the next connection, making room near the file limit.
func (l *Listener) Accept() (net.Conn, error) {
	const firstBackoff = 5 * time.Millisecond
	backoff := firstBackoff
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !isFileLimit(err) {
				return nil, err
			}
			l.fileLimits.Inc()
			// Several at once: the handler of the connection admitted
			// next may need descriptors of its own.
			if l.makeRoom(4) > 0 {
				continue
			}
			if backoff == firstBackoff { // once per stretch of failures
				l.log.Warn("out of file descriptors and nothing to close: backing off", "error", err, "limit", l.limit)
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		if l.nearLimit(c) {
			l.makeRoom(1)
		}
		return l.track(c), nil
	}
}

func isFileLimit(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// nearLimit reports whether c's descriptor is within the reserve of the
// limit. Descriptors are handed out lowest first, so a descriptor n means
// n are open.
func (l *Listener) nearLimit(c net.Conn) bool {
	if l.limit == 0 {
		return false
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	fd := 0
	if raw.Control(func(f uintptr) { fd = int(f) }) != nil {
		return false
	}
	return fd >= l.limit-l.reserve
}

// makeRoom closes up to n connections that hold nothing, and says how
// many it closed.
func (l *Listener) makeRoom(n int) int {
	closed := 0
	for closed < n {
		l.mu.Lock()
		victim, state := l.oldestIdle()
		l.mu.Unlock()
		if victim != nil {
			victim.Close()
			l.shed.WithLabelValues(state).Inc()
			closed++
			continue
		}
		if l.ShedUnauthenticated != nil && l.ShedUnauthenticated() {
			l.shed.WithLabelValues("unauthenticated").Inc()
			closed++
			continue
		}
		break
	}
	if closed > 0 {
		l.log.Debug("closed connections near the open-file limit", "closed", closed, "limit", l.limit)
	}
	return closed
}

// oldestIdle takes the oldest keep-alive connection, else the oldest
// without a whole request, out of its queue. Caller holds mu.
func (l *Listener) oldestIdle() (*conn, string) {
	for _, q := range []struct {
		l     *list.List
		state string
	}{{l.idle, "idle"}, {l.waiting, "new"}} {
		if e := q.l.Front(); e != nil {
			c := e.Value.(*conn)
			l.unqueue(c)
			return c, q.state
		}
	}
	return nil, ""
}

// ConnState follows the http.Server's view of each accepted connection.
func (l *Listener) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.gone {
		return
	}
	l.unqueue(c)
	switch state {
	case http.StateIdle:
		c.elem = l.idle.PushBack(c)
		c.queue = l.idle
	case http.StateNew:
		c.elem = l.waiting.PushBack(c)
		c.queue = l.waiting
	case http.StateHijacked, http.StateClosed:
		l.forget(c)
	}
	// StateActive: serving a request, in no queue.
}

func (l *Listener) track(nc net.Conn) net.Conn {
	c := &conn{Conn: nc, l: l}
	l.mu.Lock()
	c.elem = l.waiting.PushBack(c)
	c.queue = l.waiting
	l.open++
	l.openGauge.Set(float64(l.open))
	l.mu.Unlock()
	return c
}

// unqueue takes c out of its queue. Caller holds mu.
func (l *Listener) unqueue(c *conn) {
	if c.queue != nil {
		c.queue.Remove(c.elem)
		c.queue, c.elem = nil, nil
	}
}

// forget stops tracking c for good. Caller holds mu.
func (l *Listener) forget(c *conn) {
	if c.gone {
		return
	}
	l.unqueue(c)
	c.gone = true
	l.open--
	l.openGauge.Set(float64(l.open))
}

// conn is an accepted connection as the Listener tracks it.
type conn struct {
	net.Conn
	l *Listener
	// Guarded by l.mu.
	queue *list.List
	elem  *list.Element
	gone  bool
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
