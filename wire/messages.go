package wire

// This file declares the two top-level message enums and their variants.
//
// Annotations (read by the generator in internal/wiregen, see doc.go):
//   - on an enum type:   //wire:enum [name=WireName] [oldest=N]
//   - on an enum type:   //wire:variant TAG WireName GoType [tuple] [since=N] [until=N] [job|cache] [bulk]
//   - on a struct field: `wire:"snake_name[,since=N][,default]"`

// ClientMessage is every message a worker (or a proxy acting as a worker)
// sends to the server it is connected to.
//
//wire:enum oldest=30
//wire:variant 0 InitConnection *InitConnection
//wire:variant 1 AuthResponse *AuthResponse
//wire:variant 2 ReauthRequest *ReauthRequest
//wire:variant 3 Reject *ClientReject
//wire:variant 4 WorkerCapabilities *WorkerCapabilities job
//wire:variant 5 WorkerMetrics *WorkerMetrics job
//wire:variant 6 RequestJobList *RequestJobList job
//wire:variant 7 RequestJobChunk *RequestJobChunk job
//wire:variant 8 AssignJobResponse *AssignJobResponse job
//wire:variant 9 JobUpdate *JobUpdate job
//wire:variant 10 JobCompleted *JobCompleted job bulk
//wire:variant 11 JobFailed *JobFailed job bulk
//wire:variant 12 Draining *ClientDraining job
//wire:variant 13 BuildProgress *BuildProgress job
//wire:variant 14 EvalProgress *EvalProgress job
//wire:variant 15 LogChunk *LogChunk job bulk
//wire:variant 16 NarRequest *NarRequest cache
//wire:variant 17 NarRequestResume *NarRequestResume cache bulk
//wire:variant 18 EvalCachePull *EvalCachePull cache
//wire:variant 19 RequestJob *RequestJob job
//wire:variant 20 ClusterSignal *ClientClusterSignal job
//wire:variant 21 CacheQuery *CacheQuery cache
//wire:variant 22 EvalMessage *EvalMessage job
//wire:variant 23 QueryKnownDerivations *QueryKnownDerivations cache
//wire:variant 24 UploadRequest *UploadRequest cache
//wire:variant 25 UploadChunk *UploadChunk cache bulk
//wire:variant 26 UploadFinished *UploadFinished cache
//wire:variant 27 UploadCancel *UploadCancel cache
//wire:variant 28 HandoverDone *HandoverDone until=31
//wire:variant 28 ImportRequest *ImportRequest since=32 job
type ClientMessage interface {
	Message
	isClientMessage()
}

// ServerMessage is every message the server (or a proxy acting as an
// authority) sends to a connected worker.
//
//wire:enum oldest=30
//wire:variant 0 AuthChallenge *AuthChallenge
//wire:variant 1 InitAck *InitAck
//wire:variant 2 AuthUpdate *AuthUpdate
//wire:variant 3 Reject *ServerReject
//wire:variant 4 Error *ServerError
//wire:variant 5 Draining *ServerDraining
//wire:variant 6 JobListChunk *JobListChunk job
//wire:variant 7 JobOffer *JobOffer job
//wire:variant 8 AssignJob *AssignJob job
//wire:variant 9 AbortJob *AbortJob job
//wire:variant 10 StartCluster *StartCluster job
//wire:variant 11 ClusterSignal *ServerClusterSignal job
//wire:variant 12 AbortCluster *AbortCluster job
//wire:variant 13 Credential *Credential job
//wire:variant 14 NarPush *NarPush cache bulk
//wire:variant 15 NarUnavailable *NarUnavailable cache bulk
//wire:variant 16 NarAbort *NarAbort cache bulk
//wire:variant 17 NarStreamHeader *NarStreamHeader cache bulk
//wire:variant 18 EvalCachePullResult *EvalCachePullResult cache bulk
//wire:variant 19 EvalCacheChunk *EvalCacheChunk cache bulk
//wire:variant 20 CacheStatus *CacheStatus cache
//wire:variant 21 KnownDerivations *KnownDerivations cache
//wire:variant 22 CacheError *CacheError cache
//wire:variant 23 UploadGrant *UploadGrant cache
//wire:variant 24 UploadCommitted *UploadCommitted cache
//wire:variant 25 Authenticate *Authenticate
//wire:variant 26 Handover *Handover until=31
//wire:variant 26 ImportResult *ImportResult since=32 job
type ServerMessage interface {
	Message
	isServerMessage()
}

// Message is implemented by every variant of ClientMessage and ServerMessage.
type Message interface {
	// WireName is the variant's name in the protocol ("AssignJob").
	WireName() string
}

// ---- ClientMessage variants (worker → server) ----

// InitConnection is the worker's greeting: its capability flags and its
// persistent worker ID. It opens a worker-dialed session (answered by
// AuthChallenge) and answers Authenticate on a server-dialed one (answered
// by InitAck or Reject).
type InitConnection struct {
	Capabilities GradientCapabilities `wire:"capabilities"`
	ID           string               `wire:"id"`
}

// AuthResponse answers AuthChallenge with one (peer_id, plaintext token) pair
// per challenged peer the worker holds a token for. Answered by InitAck or
// Reject during the handshake, by AuthUpdate on reauth. Carries secrets:
// never log it.
type AuthResponse struct {
	Tokens []Pair[string, string] `wire:"tokens"`
}

// ReauthRequest asks the server to re-challenge the worker without
// reconnecting, after its peers file changed. Answered by AuthChallenge, or
// directly by AuthUpdate on server-dialed sessions.
type ReauthRequest struct{}

// ClientReject is a dialed worker declining a server-dialed session (400 for
// a wrong first message, 401 for an unknown worker ID or a wrong token). The
// worker closes the socket after sending it.
type ClientReject struct {
	Code   uint16 `wire:"code"`
	Reason string `wire:"reason"`
}

// WorkerCapabilities describes a build-capable worker's capacity, sent after
// the handshake. A later one replaces the earlier. No reply.
type WorkerCapabilities struct {
	Architectures       []string `wire:"architectures"`
	SystemFeatures      []string `wire:"system_features"`
	MaxConcurrentBuilds uint32   `wire:"max_concurrent_builds"`
	CPUCount            uint32   `wire:"cpu_count"`
	RAMTotalMB          uint64   `wire:"ram_total_mb"`
	CPUCoreScore        uint32   `wire:"cpu_core_score"`
	Zone                *string  `wire:"zone"`
	Endpoint            *string  `wire:"endpoint"`
}

// WorkerMetrics is the worker's load heartbeat, sent every 10 s. No reply.
type WorkerMetrics struct {
	CPUUsagePct       float32  `wire:"cpu_usage_pct"`
	RAMFreeMB         uint64   `wire:"ram_free_mb"`
	DiskSpeedMbps     *float32 `wire:"disk_speed_mbps"`
	UploadSpeedMbps   *float32 `wire:"upload_speed_mbps"`
	DownloadSpeedMbps *float32 `wire:"download_speed_mbps"`
	// BuildPeakRAMMB is the peak memory of each running build, nil when
	// not measured. Peers below 33 never see it.
	BuildPeakRAMMB *[]Pair[string, uint64] `wire:"build_peak_ram_mb,since=33,default"`
}

// RequestJobList asks for the full candidate list; answered by JobListChunk
// pages, the last one with IsFinal set.
type RequestJobList struct{}

// RequestJobChunk carries the worker's scores for offered candidates. No reply.
type RequestJobChunk struct {
	Scores  []CandidateScore `wire:"scores"`
	IsFinal bool             `wire:"is_final"`
}

// AssignJobResponse accepts or declines an AssignJob; a declined job is
// re-queued.
type AssignJobResponse struct {
	JobID    string  `wire:"job_id"`
	Accepted bool    `wire:"accepted"`
	Reason   *string `wire:"reason"`
}

// JobUpdate reports progress of an assigned job. It must echo the
// assignment ID of its AssignJob; reports with stale IDs are dropped.
type JobUpdate struct {
	JobID        string        `wire:"job_id"`
	AssignmentID string        `wire:"assignment_id"`
	Update       JobUpdateKind `wire:"update"`
}

// JobCompleted reports a job that finished successfully, with its phase
// timeline.
type JobCompleted struct {
	JobID        string         `wire:"job_id"`
	AssignmentID string         `wire:"assignment_id"`
	Spans        []JobPhaseSpan `wire:"spans"`
	ElapsedMS    uint64         `wire:"elapsed_ms"`
}

// JobFailed reports a failed job. It is also the worker's answer to
// AbortJob (kind Aborted or Canceled). MissingPaths is set only for
// InputsUnavailable.
type JobFailed struct {
	JobID        string           `wire:"job_id"`
	AssignmentID string           `wire:"assignment_id"`
	Error        string           `wire:"error"`
	Kind         BuildFailureKind `wire:"kind"`
	MissingPaths []string         `wire:"missing_paths"`
	Spans        []JobPhaseSpan   `wire:"spans"`
	ElapsedMS    uint64           `wire:"elapsed_ms"`
	Metrics      *BuildMetrics    `wire:"metrics"`
}

// ClientDraining tells the server the worker is stopping: assign it nothing
// more.
type ClientDraining struct{}

// BuildProgress reports bytes and paths of a build's download, prefetch or
// upload. Fire-and-forget.
type BuildProgress struct {
	JobID        string             `wire:"job_id"`
	AssignmentID string             `wire:"assignment_id"`
	BuildID      string             `wire:"build_id"`
	Phase        BuildProgressPhase `wire:"phase"`
	BytesDone    uint64             `wire:"bytes_done"`
	BytesTotal   *uint64            `wire:"bytes_total"`
	PathsDone    uint32             `wire:"paths_done"`
	PathsTotal   *uint32            `wire:"paths_total"`
}

// EvalProgress reports evaluation progress (input fetch states or the live
// thunk count), at most once per second.
type EvalProgress struct {
	JobID        string            `wire:"job_id"`
	AssignmentID string            `wire:"assignment_id"`
	Progress     EvalProgressState `wire:"progress"`
}

// LogChunk carries build log bytes of the build at TaskIndex. Data is a
// slice of the received frame. No acknowledgement.
type LogChunk struct {
	JobID     string `wire:"job_id"`
	TaskIndex uint32 `wire:"task_index"`
	Data      []byte `wire:"data"`
}

// NarRequest pulls store paths over the socket. Per path the server answers
// NarStreamHeader and NarPush chunks, or NarUnavailable / NarAbort.
type NarRequest struct {
	JobID string   `wire:"job_id"`
	Paths []string `wire:"paths"`
}

// NarRequestResume resumes a broken pull at ReceivedBytes; a stream token
// that does not match restarts from 0. Answered like NarRequest.
type NarRequestResume struct {
	JobID         string `wire:"job_id"`
	StorePath     string `wire:"store_path"`
	ReceivedBytes uint64 `wire:"received_bytes"`
	StreamToken   string `wire:"stream_token"`
}

// EvalCachePull asks for the evaluation-cache blob of a fingerprint;
// answered by EvalCachePullResult (and EvalCacheChunk frames when Inline).
type EvalCachePull struct {
	JobID       string `wire:"job_id"`
	Fingerprint string `wire:"fingerprint"`
}

// RequestJob announces one free slot of a kind. Answered by AssignJob when
// a job is picked; re-sent after each AssignJob while slots remain and every
// 10 s while idle.
type RequestJob struct {
	Kind JobKind `wire:"kind"`
}

// ClientClusterSignal is a control payload for one member (To set) or all
// other members (To nil) of a started cluster attempt, relayed by the server.
type ClientClusterSignal struct {
	Attempt string          `wire:"attempt"`
	To      *ClusterAddress `wire:"to"`
	Payload []byte          `wire:"payload"`
}

// CacheQuery looks up at most 1000 store paths. NarSizes is used only in
// Push mode, External only with exactly one path. Answered by CacheStatus or
// CacheError echoing QueryID.
type CacheQuery struct {
	JobID    string    `wire:"job_id"`
	QueryID  string    `wire:"query_id"`
	Paths    []string  `wire:"paths"`
	Mode     QueryMode `wire:"mode"`
	NarSizes []*uint64 `wire:"nar_sizes"`
	External bool      `wire:"external"`
}

// EvalMessage attaches an infrastructure warning or error to the job's
// evaluation. No reply.
type EvalMessage struct {
	JobID   string           `wire:"job_id"`
	Level   EvalMessageLevel `wire:"level"`
	Source  string           `wire:"source"`
	Message string           `wire:"message"`
}

// QueryKnownDerivations asks which .drv paths the server already recorded,
// to prune the evaluation walk. Answered by KnownDerivations.
type QueryKnownDerivations struct {
	JobID    string   `wire:"job_id"`
	QueryID  string   `wire:"query_id"`
	DrvPaths []string `wire:"drv_paths"`
}

// UploadRequest asks for an upload slot for a NAR or an eval-cache blob.
// Answered by UploadGrant.
type UploadRequest struct {
	JobID     string       `wire:"job_id"`
	RequestID uint64       `wire:"request_id"`
	Object    UploadObject `wire:"object"`
	Size      uint64       `wire:"size"`
}

// UploadChunk relays upload bytes through the server after a Passthrough
// grant. Data is a slice of the received frame.
type UploadChunk struct {
	RequestID uint64 `wire:"request_id"`
	Data      []byte `wire:"data"`
	Offset    uint64 `wire:"offset"`
	IsFinal   bool   `wire:"is_final"`
}

// UploadFinished closes an upload with its metadata. Answered by
// UploadCommitted.
type UploadFinished struct {
	RequestID uint64         `wire:"request_id"`
	Metadata  UploadMetadata `wire:"metadata"`
}

// UploadCancel abandons an upload and releases the server's lease. No reply.
type UploadCancel struct {
	RequestID uint64 `wire:"request_id"`
}

// HandoverDone (protocol 30 only) tells the server the worker applied a
// Handover. Protocol 31 removed it and 32 reused its tag for ImportRequest.
type HandoverDone struct{}

// ImportRequest (since 32) asks the server, during an evaluation that
// imports from a derivation, to build these derivations now. Answered by
// ImportResult once they finished.
type ImportRequest struct {
	JobID     string   `wire:"job_id"`
	RequestID string   `wire:"request_id"`
	DrvPaths  []string `wire:"drv_paths"`
}

// ---- ServerMessage variants (server → worker) ----

// AuthChallenge names the peers the worker must present tokens for: step 2
// of the handshake, a reauth, or a new peer registering the worker.
// Answered by AuthResponse.
type AuthChallenge struct {
	Peers []string `wire:"peers"`
}

// InitAck accepts the handshake with the negotiated capabilities and the
// per-peer results.
type InitAck struct {
	Capabilities    GradientCapabilities `wire:"capabilities"`
	AuthorizedPeers []string             `wire:"authorized_peers"`
	FailedPeers     []FailedPeer         `wire:"failed_peers"`
}

// AuthUpdate is the result of a reauth. It never revokes granted peers.
type AuthUpdate struct {
	AuthorizedPeers []string     `wire:"authorized_peers"`
	FailedPeers     []FailedPeer `wire:"failed_peers"`
}

// ServerReject declines the session (400, 401, 403, 495, 496); the sender
// closes the socket afterwards.
type ServerReject struct {
	Code   uint16 `wire:"code"`
	Reason string `wire:"reason"`
}

// ServerError reports a protocol error, such as 400 "malformed message".
type ServerError struct {
	Code    uint16 `wire:"code"`
	Message string `wire:"message"`
}

// ServerDraining says the session ends soon (server shutdown): request no
// more jobs.
type ServerDraining struct{}

// JobListChunk is one page of the full candidate list, the answer to
// RequestJobList.
type JobListChunk struct {
	Candidates []JobCandidate `wire:"candidates"`
	IsFinal    bool           `wire:"is_final"`
}

// JobOffer announces new candidates (a delta): at most 1000 and about 2 MiB
// per message.
type JobOffer struct {
	Candidates []JobCandidate `wire:"candidates"`
}

// AssignJob hands a job to the worker. Reports must echo AssignmentID.
// With Cluster set, the worker holds the slot until StartCluster. Answered
// by AssignJobResponse.
type AssignJob struct {
	JobID        string             `wire:"job_id"`
	AssignmentID string             `wire:"assignment_id"`
	Job          Job                `wire:"job"`
	Cluster      *ClusterMembership `wire:"cluster"`
}

// AbortJob cancels a running job; the worker stops it and answers JobFailed
// (kind Aborted).
type AbortJob struct {
	JobID  string `wire:"job_id"`
	Reason string `wire:"reason"`
}

// StartCluster says every member of a cluster attempt accepted: run the held
// jobs.
type StartCluster struct {
	Attempt string        `wire:"attempt"`
	Roster  []ClusterPeer `wire:"roster"`
}

// ServerClusterSignal relays a control payload from another member of a
// cluster attempt.
type ServerClusterSignal struct {
	Attempt string         `wire:"attempt"`
	From    ClusterAddress `wire:"from"`
	Payload []byte         `wire:"payload"`
}

// AbortCluster drops or aborts every job of a cluster attempt.
type AbortCluster struct {
	Attempt string `wire:"attempt"`
	Reason  string `wire:"reason"`
}

// Credential is a short-lived credential (a project's SSH key), sent right
// before the AssignJob that needs it. Secret: never log it.
type Credential struct {
	Kind CredentialKind `wire:"kind"`
	Data []byte         `wire:"data"`
}

// NarPush is one zstd chunk (at most 512 KiB) of a NAR pull stream. Data is
// a slice of the received frame.
type NarPush struct {
	JobID     string `wire:"job_id"`
	StorePath string `wire:"store_path"`
	Data      []byte `wire:"data"`
	Offset    uint64 `wire:"offset"`
	IsFinal   bool   `wire:"is_final"`
}

// NarUnavailable says there is no object for the path; no chunks follow.
type NarUnavailable struct {
	JobID     string `wire:"job_id"`
	StorePath string `wire:"store_path"`
	Reason    string `wire:"reason"`
}

// NarAbort says a pull failed before or during the stream (storage error,
// timeout); the worker may retry.
type NarAbort struct {
	JobID     string `wire:"job_id"`
	StorePath string `wire:"store_path"`
	Reason    string `wire:"reason"`
}

// NarStreamHeader opens a NAR pull stream; its NarPush chunks follow.
type NarStreamHeader struct {
	JobID       string `wire:"job_id"`
	StorePath   string `wire:"store_path"`
	TotalBytes  uint64 `wire:"total_bytes"`
	StreamToken string `wire:"stream_token"`
}

// EvalCachePullResult answers EvalCachePull.
type EvalCachePullResult struct {
	JobID   string               `wire:"job_id"`
	Outcome EvalCachePullOutcome `wire:"outcome"`
}

// EvalCacheChunk is one inline evaluation-cache chunk. Data is a slice of
// the received frame.
type EvalCacheChunk struct {
	JobID   string `wire:"job_id"`
	Data    []byte `wire:"data"`
	Offset  uint64 `wire:"offset"`
	IsFinal bool   `wire:"is_final"`
}

// CacheStatus answers CacheQuery.
type CacheStatus struct {
	QueryID string       `wire:"query_id"`
	Cached  []CachedPath `wire:"cached"`
}

// KnownDerivations answers QueryKnownDerivations.
type KnownDerivations struct {
	QueryID string   `wire:"query_id"`
	Known   []string `wire:"known"`
}

// CacheError says the cache state for a query is unknown; the worker must
// retry and never treat it as "missing".
type CacheError struct {
	QueryID string `wire:"query_id"`
	Message string `wire:"message"`
}

// UploadGrant admits an upload: Skip, Passthrough (relay, with a resume
// offset), a presigned Put, or Multipart.
type UploadGrant struct {
	RequestID uint64      `wire:"request_id"`
	Target    GrantTarget `wire:"target"`
}

// UploadCommitted is the outcome of an upload: Ok, Retry or Rejected.
type UploadCommitted struct {
	RequestID uint64        `wire:"request_id"`
	Outcome   UploadOutcome `wire:"outcome"`
}

// Authenticate opens a server-dialed session: the dialed worker ID and one
// (peer, token) pair per registration at the dialed URL. Answered by
// InitConnection or Reject. Secret: never log it.
type Authenticate struct {
	WorkerID string                 `wire:"worker_id"`
	Tokens   []Pair[string, string] `wire:"tokens"`
}

// Handover (protocol 30 only) says a shared worker changes hands: a new ID
// wipes its evaluation cache. Answered by HandoverDone. Protocol 31 removed
// it and 32 reused its tag for ImportResult.
type Handover struct {
	ID string `wire:"id"`
}

// ImportResult (since 32) answers ImportRequest once the imported
// derivations finished.
type ImportResult struct {
	JobID     string        `wire:"job_id"`
	RequestID string        `wire:"request_id"`
	Outcome   ImportOutcome `wire:"outcome"`
}

// MessageClass is who handles a message once the session is established:
// the session itself (handshake, reauth, Draining, Reject, errors), the
// job loop, or the cache. The job and cache options of a message's
// //wire:variant set it; ClientMessageClass and ServerMessageClass read it.
type MessageClass uint8

const (
	ClassSession MessageClass = iota
	ClassJob
	ClassCache
)
