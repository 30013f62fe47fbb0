package authority

import (
	"math"
	"slices"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// WorkerStatus is the operator's view of one worker ID.
type WorkerStatus struct {
	WorkerID     string    `json:"worker_id"`
	Live         bool      `json:"live"`
	ConnectedAt  time.Time `json:"connected_at,omitzero"`
	Projects     []string  `json:"projects,omitempty"` // authenticated for, while live
	Capabilities []string  `json:"capabilities,omitempty"`
	Draining     bool      `json:"draining,omitempty"`
	// Host is what the live session last reported of its machine; for
	// a federation proxy, the aggregate of its pool. Nil before the
	// first WorkerCapabilities or WorkerMetrics.
	Host *HostStatus `json:"host,omitempty"`
	// DialedURL is set while the server's own dial holds the session.
	DialedURL string `json:"dialed_url,omitempty"`
	// Instance is the server instance holding the live session, set
	// where several instances may share one database (Config.Claims).
	Instance string `json:"instance,omitempty"`
	// OfflineReason is the last failure or disconnect of the worker ID,
	// empty while it is live.
	OfflineReason string    `json:"offline_reason,omitempty"`
	OfflineSince  time.Time `json:"offline_since,omitzero"`
}

// HostStatus is a live worker's latest WorkerCapabilities and
// WorkerMetrics.
type HostStatus struct {
	// From WorkerCapabilities (zero while none came: a worker that may
	// not build sends none).
	Architectures       []string `json:"architectures"`
	SystemFeatures      []string `json:"system_features"`
	MaxConcurrentBuilds uint32   `json:"max_concurrent_builds"`
	CPUCount            uint32   `json:"cpu_count"`
	RAMTotalMB          uint64   `json:"ram_total_mb"`
	CPUCoreScore        uint32   `json:"cpu_core_score"`
	Zone                string   `json:"zone,omitempty"`
	// From the latest heartbeat's WorkerMetrics, nil before it.
	CPUUsagePct *float32 `json:"cpu_usage_pct,omitempty"`
	RAMFreeMB   *uint64  `json:"ram_free_mb,omitempty"`
}

// hostStatus is the view of what a session reported; nil when nothing.
func hostStatus(caps *wire.WorkerCapabilities, load *wire.WorkerMetrics) *HostStatus {
	if caps == nil && load == nil {
		return nil
	}
	h := &HostStatus{Architectures: []string{}, SystemFeatures: []string{}}
	if caps != nil {
		h.Architectures = append(h.Architectures, caps.Architectures...)
		h.SystemFeatures = append(h.SystemFeatures, caps.SystemFeatures...)
		h.MaxConcurrentBuilds, h.CPUCount = caps.MaxConcurrentBuilds, caps.CPUCount
		h.RAMTotalMB, h.CPUCoreScore = caps.RAMTotalMB, caps.CPUCoreScore
		if caps.Zone != nil {
			h.Zone = *caps.Zone
		}
	}
	if load != nil {
		free := load.RAMFreeMB
		h.RAMFreeMB = &free
		// JSON has no NaN or infinity: a worker's bad figure is left out.
		if usage := load.CPUUsagePct; !math.IsNaN(float64(usage)) && !math.IsInf(float64(usage), 0) {
			h.CPUUsagePct = &usage
		}
	}
	return h
}

// WorkerStatus reports whether a worker is connected, and why it last went
// away.
func (a *Authority) WorkerStatus(workerID string) WorkerStatus {
	st := WorkerStatus{WorkerID: workerID}
	// A session holds the worker ID from its admission on, which is just
	// before the worker reads its InitAck.
	if conn := a.live.get(workerID); conn != nil {
		st = a.statusOf(conn)
		st.WorkerID = workerID
	}
	// The reason says why the worker is away. While a session holds the
	// ID, the one kept is of the past (a disconnect before this session,
	// or another connection refused beside it) and beside live=true it
	// would read as the live worker's trouble; the next disconnect sets
	// a new one.
	if r, ok := a.offline.get(workerID); ok && !st.Live {
		st.OfflineReason, st.OfflineSince = r.Reason, r.At
	}
	return st
}

// statusOf is the live view of conn's session.
func (a *Authority) statusOf(conn *workerConn) WorkerStatus {
	conn.mu.Lock()
	defer conn.mu.Unlock()
	return WorkerStatus{
		WorkerID:     conn.workerID,
		Live:         true,
		ConnectedAt:  conn.connectedAt,
		DialedURL:    conn.dialURL,
		Instance:     a.instance(),
		Projects:     slices.Clone(conn.grant.Projects),
		Capabilities: conn.capabilities.Names(),
		Draining:     conn.draining,
		Host:         hostStatus(conn.workerCaps, conn.workerLoad),
	}
}

// instance names this authority in WorkerStatus where instances share
// claims; "" for the only one.
func (a *Authority) instance() string {
	if a.cfg.Claims == nil {
		return ""
	}
	return a.cfg.Instance
}

// Session is the established session holding workerID, nil while none
// is (or it is still in its handshake).
func (a *Authority) Session(workerID string) *LiveWorker {
	conn := a.live.get(workerID)
	if conn == nil {
		return nil
	}
	conn.mu.Lock()
	defer conn.mu.Unlock()
	return conn.live
}

// Holds reports whether a session, established or handshaking past its
// admission, holds workerID.
func (a *Authority) Holds(workerID string) bool { return a.live.get(workerID) != nil }

// Disconnect starts closing the live session of a worker, if any, with
// 1008 and reason: the operator deactivated it, or the proxy revoked its
// row. It does not wait for the close.
func (a *Authority) Disconnect(workerID, reason string) {
	conn := a.live.get(workerID)
	if conn == nil {
		return
	}
	conn.mu.Lock()
	sess := conn.sess
	if sess == nil {
		// Admitted, not yet split: serveSession closes it right after.
		conn.kickReason = reason
	}
	conn.mu.Unlock()
	a.log.Info("closing worker session", "worker", workerID, "reason", reason)
	if sess == nil {
		return
	}
	// Close waits for the worker's close frame; the caller need not.
	go sess.Close(session.ClosePolicy, reason)
}
