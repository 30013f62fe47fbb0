package wire

// Nested types carried inside messages. The annotation syntax is described in
// messages.go and doc.go.

// Pair is two consecutive values on the wire, "(A,B)" in the schema.
type Pair[A, B any] struct {
	First  A
	Second B
}

// ---- Handshake and scheduling ----

// GradientCapabilities are the capability flags of one side; a capability is
// active only when both sides set it.
type GradientCapabilities struct {
	Core     bool `wire:"core"`
	Federate bool `wire:"federate"`
	Fetch    bool `wire:"fetch"`
	Eval     bool `wire:"eval"`
	Build    bool `wire:"build"`
	Cache    bool `wire:"cache"`
}

// FailedPeer is a peer whose token did not authorize the worker, and why.
type FailedPeer struct {
	PeerID string `wire:"peer_id"`
	Reason string `wire:"reason"`
}

// CandidateScore is the worker's view of one offered candidate.
type CandidateScore struct {
	JobID          string `wire:"job_id"`
	MissingCount   uint32 `wire:"missing_count"`
	MissingNarSize uint64 `wire:"missing_nar_size"`
	OutputsPresent bool   `wire:"outputs_present"`
}

// JobCandidate is a job the worker may score before it is assigned.
type JobCandidate struct {
	JobID         string            `wire:"job_id"`
	RequiredPaths []RequiredPath    `wire:"required_paths"`
	DrvPaths      []string          `wire:"drv_paths"`
	OutputPaths   []string          `wire:"output_paths"`
	Requirement   *BuildRequirement `wire:"requirement"`
}

// RequiredPath is an input store path of a candidate, with its cache sizes
// when the server's cache holds it.
type RequiredPath struct {
	Path      string     `wire:"path"`
	CacheInfo *CacheInfo `wire:"cache_info"`
}

// CacheInfo are the sizes of a cached path.
type CacheInfo struct {
	FileSize uint64 `wire:"file_size"`
	NarSize  uint64 `wire:"nar_size"`
}

// BuildRequirement is what a build needs from the worker.
type BuildRequirement struct {
	Architecture     string   `wire:"architecture"`
	RequiredFeatures []string `wire:"required_features"`
}

// JobKind is the kind of slot a RequestJob announces.
//
//wire:enum
//wire:variant 0 Flake JobKindFlake
//wire:variant 1 Build JobKindBuild
type JobKind uint8

const (
	JobKindFlake JobKind = 0 // fetch and evaluate a flake
	JobKindBuild JobKind = 1 // build derivations
)

// ClusterAddress names one member of a cluster attempt.
type ClusterAddress struct {
	Role  string `wire:"role"`
	Index uint32 `wire:"index"`
}

// ClusterMembership tells an assigned worker it is part of a cluster attempt.
type ClusterMembership struct {
	Attempt  string `wire:"attempt"`
	Role     string `wire:"role"`
	Index    uint32 `wire:"index"`
	HoldSecs uint32 `wire:"hold_secs"`
}

// ClusterPeer is one member of a started cluster attempt.
type ClusterPeer struct {
	Role     string  `wire:"role"`
	Index    uint32  `wire:"index"`
	Worker   string  `wire:"worker"`
	Zone     *string `wire:"zone"`
	Endpoint *string `wire:"endpoint"`
}

// CredentialKind is the kind of a Credential.
//
//wire:enum
//wire:variant 0 SshKey CredentialSSHKey
type CredentialKind uint8

const CredentialSSHKey CredentialKind = 0

// ---- Jobs ----

// Job is the work of an AssignJob: a flake job or a build job.
//
//wire:enum
//wire:variant 0 Flake *FlakeJob tuple
//wire:variant 1 Build *BuildJob tuple
type Job interface{ isJob() }

// FlakeJob fetches and/or evaluates one flake.
type FlakeJob struct {
	Steps          []FlakeStep          `wire:"steps"`
	Source         FlakeSource          `wire:"source"`
	Wildcards      []string             `wire:"wildcards"`
	TimeoutSecs    *uint64              `wire:"timeout_secs"`
	InputOverrides []FlakeInputOverride `wire:"input_overrides"`
	InputUpdate    *InputUpdateSpec     `wire:"input_update"`
}

// FlakeStep is one step of a flake job.
//
//wire:enum
//wire:variant 0 FetchFlake FlakeStepFetchFlake
//wire:variant 1 EvaluateFlake FlakeStepEvaluateFlake
//wire:variant 2 EvaluateDerivations FlakeStepEvaluateDerivations
type FlakeStep uint8

const (
	FlakeStepFetchFlake          FlakeStep = 0
	FlakeStepEvaluateFlake       FlakeStep = 1
	FlakeStepEvaluateDerivations FlakeStep = 2
)

// FlakeSource is where a flake job's source comes from.
//
//wire:enum
//wire:variant 0 Repository *FlakeSourceRepository
//wire:variant 1 Cached *FlakeSourceCached
type FlakeSource interface{ isFlakeSource() }

// FlakeSourceRepository is a repository URL at a commit.
type FlakeSourceRepository struct {
	URL    string `wire:"url"`
	Commit string `wire:"commit"`
}

// FlakeSourceCached is a flake source already in the cache.
type FlakeSourceCached struct {
	StorePath string `wire:"store_path"`
}

// FlakeInputOverride overrides one flake input.
type FlakeInputOverride struct {
	InputName string  `wire:"input_name"`
	URL       *string `wire:"url"`
}

// InputUpdateSpec asks the flake job to update inputs.
type InputUpdateSpec struct {
	Generator    string   `wire:"generator"`
	Inputs       []string `wire:"inputs"`
	DiscoverOnly bool     `wire:"discover_only"`
}

// BuildJob builds one or more derivations with one requirement.
type BuildJob struct {
	Builds      []BuildSpec      `wire:"builds"`
	Requirement BuildRequirement `wire:"requirement"`
}

// BuildSpec is one derivation of a build job.
type BuildSpec struct {
	BuildID       string             `wire:"build_id"`
	DrvPath       string             `wire:"drv_path"`
	Kind          BuildSpecKind      `wire:"kind"`
	IsFixedOutput bool               `wire:"is_fixed_output"`
	Outputs       []DerivationOutput `wire:"outputs"`
	TimeoutSecs   *uint64            `wire:"timeout_secs"`
	MaxSilentSecs *uint64            `wire:"max_silent_secs"`
}

// BuildSpecKind says how a BuildSpec is realised.
//
//wire:enum
//wire:variant 0 Build BuildSpecBuild
//wire:variant 1 Substitute BuildSpecSubstitute
//wire:variant 2 Download BuildSpecDownload
type BuildSpecKind uint8

const (
	BuildSpecBuild      BuildSpecKind = 0
	BuildSpecSubstitute BuildSpecKind = 1
	BuildSpecDownload   BuildSpecKind = 2
)

// DerivationOutput is one named output path of a derivation.
type DerivationOutput struct {
	Name string `wire:"name"`
	Path string `wire:"path"`
}

// ---- Job reports ----

// JobUpdateKind is the content of a JobUpdate.
//
//wire:enum
//wire:variant 0 Fetching *JobUpdateFetching
//wire:variant 1 FetchResult *JobUpdateFetchResult
//wire:variant 2 EvaluatingFlake *JobUpdateEvaluatingFlake
//wire:variant 3 EvaluatingDerivations *JobUpdateEvaluatingDerivations
//wire:variant 4 EvalResult *JobUpdateEvalResult
//wire:variant 5 Building *JobUpdateBuilding
//wire:variant 6 BuildOutput *JobUpdateBuildOutput
//wire:variant 7 Compressing *JobUpdateCompressing
//wire:variant 8 EvalStats *EvalStatsReport tuple
//wire:variant 9 InputUpdateResult *JobUpdateInputUpdateResult
//wire:variant 10 InputUpdateExpansion *JobUpdateInputUpdateExpansion
//wire:variant 11 Stage BuildStage tuple since=28
type JobUpdateKind interface{ isJobUpdateKind() }

// JobUpdateFetching: the flake source is being fetched.
type JobUpdateFetching struct{}

// JobUpdateFetchResult: the flake source is fetched, at FlakeSource.
type JobUpdateFetchResult struct {
	FlakeSource *string `wire:"flake_source"`
}

// JobUpdateEvaluatingFlake: the flake is being evaluated.
type JobUpdateEvaluatingFlake struct{}

// JobUpdateEvaluatingDerivations: derivations are being instantiated.
type JobUpdateEvaluatingDerivations struct{}

// JobUpdateEvalResult is one batch of discovered derivations.
type JobUpdateEvalResult struct {
	Derivations []DiscoveredDerivation `wire:"derivations"`
	Warnings    []string               `wire:"warnings"`
	Errors      []string               `wire:"errors"`
}

// JobUpdateBuilding: the build BuildID started.
type JobUpdateBuilding struct {
	BuildID string `wire:"build_id"`
}

// JobUpdateBuildOutput: the build BuildID produced its outputs.
type JobUpdateBuildOutput struct {
	BuildID     string        `wire:"build_id"`
	Outputs     []BuildOutput `wire:"outputs"`
	Metrics     *BuildMetrics `wire:"metrics"`
	Substituted bool          `wire:"substituted"`
}

// JobUpdateCompressing: outputs are being compressed.
type JobUpdateCompressing struct{}

// JobUpdateInputUpdateResult is the outcome of an input update.
type JobUpdateInputUpdateResult struct {
	CandidateLock string            `wire:"candidate_lock"`
	Bumped        []BumpedInputWire `wire:"bumped"`
}

// JobUpdateInputUpdateExpansion lists the inputs an update pattern matched.
type JobUpdateInputUpdateExpansion struct {
	Matched []string `wire:"matched"`
}

// DiscoveredDerivation is one derivation found by an evaluation.
type DiscoveredDerivation struct {
	Attr             string             `wire:"attr"`
	DrvPath          string             `wire:"drv_path"`
	Outputs          []DerivationOutput `wire:"outputs"`
	Dependencies     []string           `wire:"dependencies"`
	InputSources     []string           `wire:"input_sources"`
	Architecture     string             `wire:"architecture"`
	RequiredFeatures []string           `wire:"required_features"`
	TimeoutSecs      *uint64            `wire:"timeout_secs"`
	MaxSilentSecs    *uint64            `wire:"max_silent_secs"`
	PreferLocalBuild bool               `wire:"prefer_local_build"`
	IsFixedOutput    bool               `wire:"is_fixed_output"`
	AllowSubstitutes bool               `wire:"allow_substitutes"`
	Pname            *string            `wire:"pname"`
	// IFD marks a derivation recorded as an import-from-derivation entry
	// point. Peers below 32 never see it.
	IFD bool `wire:"ifd,since=32,default"`
}

// BuildOutput is one output of a finished build.
type BuildOutput struct {
	Name      string         `wire:"name"`
	StorePath string         `wire:"store_path"`
	Hash      string         `wire:"hash"`
	NarSize   *int64         `wire:"nar_size"`
	NarHash   *string        `wire:"nar_hash"`
	Products  []BuildProduct `wire:"products"`
}

// BuildProduct is a file a build declared as a product.
type BuildProduct struct {
	FileType string  `wire:"file_type"`
	Subtype  string  `wire:"subtype"`
	Name     string  `wire:"name"`
	Path     string  `wire:"path"`
	Size     *uint64 `wire:"size"`
}

// BuildMetrics are resource figures of one build.
type BuildMetrics struct {
	PeakRAMMB        *uint64  `wire:"peak_ram_mb"`
	CPUTimeMS        *uint64  `wire:"cpu_time_ms"`
	AvgCPUPct        *float32 `wire:"avg_cpu_pct"`
	DiskReadBytes    *uint64  `wire:"disk_read_bytes"`
	DiskWriteBytes   *uint64  `wire:"disk_write_bytes"`
	OOMKilled        bool     `wire:"oom_killed"`
	BuildTimeMS      *uint64  `wire:"build_time_ms"`
	ConcurrentBuilds *uint32  `wire:"concurrent_builds,since=28,default"`
	BuildCores       *uint32  `wire:"build_cores,since=28,default"`
	CPUCoreScore     *uint32  `wire:"cpu_core_score,since=28,default"`
}

// EvalStatsReport are evaluator statistics of one evaluation.
type EvalStatsReport struct {
	TotalThunks   uint64            `wire:"total_thunks"`
	FnCalls       uint64            `wire:"fn_calls"`
	PrimopCalls   uint64            `wire:"primop_calls"`
	Lookups       uint64            `wire:"lookups"`
	AllocBytes    uint64            `wire:"alloc_bytes"`
	PeakHeapMB    uint64            `wire:"peak_heap_mb"`
	PeakRSSMB     uint64            `wire:"peak_rss_mb"`
	TotalEvalMS   uint64            `wire:"total_eval_ms"`
	WorkerID      string            `wire:"worker_id"`
	PerEntryPoint []EvalAttrCost    `wire:"per_entry_point"`
	FlakeNodes    []FlakeOutputNode `wire:"flake_nodes"`
}

// EvalAttrCost is the evaluation cost of one attribute.
type EvalAttrCost struct {
	Attr       string `wire:"attr"`
	Thunks     uint64 `wire:"thunks"`
	FnCalls    uint64 `wire:"fn_calls"`
	EvalMS     uint64 `wire:"eval_ms"`
	AllocBytes uint64 `wire:"alloc_bytes"`
}

// FlakeOutputNode is one node of a flake's output tree.
type FlakeOutputNode struct {
	Path         string  `wire:"path"`
	Parent       *string `wire:"parent"`
	Name         string  `wire:"name"`
	Kind         string  `wire:"kind"`
	IsDerivation bool    `wire:"is_derivation"`
	DrvPath      *string `wire:"drv_path"`
}

// BumpedInputWire is one flake input an update moved.
type BumpedInputWire struct {
	Name   string  `wire:"name"`
	OldRev *string `wire:"old_rev"`
	NewRev string  `wire:"new_rev"`
}

// BuildStage is the stage of a build reported by JobUpdateKind Stage.
//
//wire:enum
//wire:variant 0 Prefetch BuildStagePrefetch
//wire:variant 1 Build BuildStageBuild
//wire:variant 2 Upload BuildStageUpload
type BuildStage uint8

const (
	BuildStagePrefetch BuildStage = 0
	BuildStageBuild    BuildStage = 1
	BuildStageUpload   BuildStage = 2
)

// JobPhaseSpan is one timed phase of a job.
type JobPhaseSpan struct {
	Phase   JobPhase `wire:"phase"`
	StartMS uint64   `wire:"start_ms"`
	EndMS   uint64   `wire:"end_ms"`
	Parent  *uint32  `wire:"parent"`
	Paths   uint32   `wire:"paths"`
	Bytes   uint64   `wire:"bytes"`
}

// JobPhase is a phase of a job's timeline. The wire index is the declaration
// order below; storage uses a different numbering.
//
//wire:enum
//wire:variant 0 Fetch JobPhaseFetch
//wire:variant 1 PushInputs JobPhasePushInputs
//wire:variant 2 EvalFlake JobPhaseEvalFlake
//wire:variant 3 EvalDerivations JobPhaseEvalDerivations
//wire:variant 4 EvalCachePull JobPhaseEvalCachePull
//wire:variant 5 EvalCachePush JobPhaseEvalCachePush
//wire:variant 6 KnownDerivationsWait JobPhaseKnownDerivationsWait
//wire:variant 7 DrvClosurePush JobPhaseDrvClosurePush
//wire:variant 8 Prefetch JobPhasePrefetch
//wire:variant 9 SubstituteFetch JobPhaseSubstituteFetch
//wire:variant 10 Download JobPhaseDownload
//wire:variant 11 Build JobPhaseBuild
//wire:variant 12 Compress JobPhaseCompress
//wire:variant 13 NarPush JobPhaseNarPush
//wire:variant 14 CacheQueryWait JobPhaseCacheQueryWait
//wire:variant 15 NarFetch JobPhaseNarFetch
//wire:variant 16 NarImport JobPhaseNarImport
//wire:variant 17 UploadWait JobPhaseUploadWait since=28
type JobPhase uint8

const (
	JobPhaseFetch                JobPhase = 0
	JobPhasePushInputs           JobPhase = 1
	JobPhaseEvalFlake            JobPhase = 2
	JobPhaseEvalDerivations      JobPhase = 3
	JobPhaseEvalCachePull        JobPhase = 4
	JobPhaseEvalCachePush        JobPhase = 5
	JobPhaseKnownDerivationsWait JobPhase = 6
	JobPhaseDrvClosurePush       JobPhase = 7
	JobPhasePrefetch             JobPhase = 8
	JobPhaseSubstituteFetch      JobPhase = 9
	JobPhaseDownload             JobPhase = 10
	JobPhaseBuild                JobPhase = 11
	JobPhaseCompress             JobPhase = 12
	JobPhaseNarPush              JobPhase = 13
	JobPhaseCacheQueryWait       JobPhase = 14
	JobPhaseNarFetch             JobPhase = 15
	JobPhaseNarImport            JobPhase = 16
	JobPhaseUploadWait           JobPhase = 17
)

// BuildFailureKind classifies a JobFailed.
//
//wire:enum
//wire:variant 0 Transient FailureTransient
//wire:variant 1 Permanent FailurePermanent
//wire:variant 2 Timeout FailureTimeout
//wire:variant 3 SubstituteUnavailable FailureSubstituteUnavailable
//wire:variant 4 InputsUnavailable FailureInputsUnavailable
//wire:variant 5 CorruptEvalCache FailureCorruptEvalCache
//wire:variant 6 Aborted FailureAborted
//wire:variant 7 Canceled FailureCanceled since=30
type BuildFailureKind uint8

const (
	FailureTransient             BuildFailureKind = 0 // retried a bounded number of times
	FailurePermanent             BuildFailureKind = 1
	FailureTimeout               BuildFailureKind = 2
	FailureSubstituteUnavailable BuildFailureKind = 3
	FailureInputsUnavailable     BuildFailureKind = 4
	FailureCorruptEvalCache      BuildFailureKind = 5
	FailureAborted               BuildFailureKind = 6 // answer to AbortJob
	FailureCanceled              BuildFailureKind = 7 // worker shutting down
)

// BuildProgressPhase is the phase a BuildProgress counts.
//
//wire:enum
//wire:variant 0 Download ProgressDownload
//wire:variant 1 Prefetch ProgressPrefetch
//wire:variant 2 Upload ProgressUpload
type BuildProgressPhase uint8

const (
	ProgressDownload BuildProgressPhase = 0
	ProgressPrefetch BuildProgressPhase = 1
	ProgressUpload   BuildProgressPhase = 2
)

// EvalProgressState is the content of an EvalProgress message.
//
//wire:enum name=EvalProgress
//wire:variant 0 Fetching *EvalFetching
//wire:variant 1 Evaluating *EvalEvaluating
type EvalProgressState interface{ isEvalProgressState() }

// EvalFetching lists the fetch state of each flake input.
type EvalFetching struct {
	Inputs []InputFetch `wire:"inputs"`
}

// EvalEvaluating is the live thunk count of a running evaluation.
type EvalEvaluating struct {
	Thunks uint64 `wire:"thunks"`
}

// InputFetch is the fetch state of one flake input.
type InputFetch struct {
	Name            string          `wire:"name"`
	State           InputFetchState `wire:"state"`
	DownloadedBytes uint64          `wire:"downloaded_bytes"`
	ExpectedBytes   uint64          `wire:"expected_bytes"`
}

// InputFetchState is the state of one input fetch.
//
//wire:enum
//wire:variant 0 Queued InputQueued
//wire:variant 1 Fetching InputFetching
//wire:variant 2 Done InputDone
//wire:variant 3 Failed InputFailed
type InputFetchState uint8

const (
	InputQueued   InputFetchState = 0
	InputFetching InputFetchState = 1
	InputDone     InputFetchState = 2
	InputFailed   InputFetchState = 3
)

// EvalMessageLevel is the severity of an EvalMessage.
//
//wire:enum
//wire:variant 0 Error EvalLevelError
//wire:variant 1 Warning EvalLevelWarning
//wire:variant 2 Notice EvalLevelNotice
type EvalMessageLevel uint8

const (
	EvalLevelError   EvalMessageLevel = 0
	EvalLevelWarning EvalMessageLevel = 1
	EvalLevelNotice  EvalMessageLevel = 2
)

// ---- Cache, NAR and uploads ----

// QueryMode is the mode of a CacheQuery.
//
//wire:enum
//wire:variant 0 Normal QueryNormal
//wire:variant 1 Pull QueryPull
//wire:variant 2 Push QueryPush
type QueryMode uint8

const (
	QueryNormal QueryMode = 0
	QueryPull   QueryMode = 1
	QueryPush   QueryMode = 2
)

// CachedPath is the cache state of one queried path.
type CachedPath struct {
	Path       string    `wire:"path"`
	Cached     bool      `wire:"cached"`
	FileSize   *uint64   `wire:"file_size"`
	NarSize    *uint64   `wire:"nar_size"`
	URL        *string   `wire:"url"`
	NarHash    *string   `wire:"nar_hash"`
	FileHash   *string   `wire:"file_hash"`
	References *[]string `wire:"references"`
	Signatures *[]string `wire:"signatures"`
	Deriver    *string   `wire:"deriver"`
	CA         *string   `wire:"ca"`
}

// EvalCachePullOutcome is the answer to EvalCachePull.
//
//wire:enum
//wire:variant 0 Miss *EvalCacheMiss
//wire:variant 1 Presigned *EvalCachePresigned
//wire:variant 2 Inline *EvalCacheInline
type EvalCachePullOutcome interface{ isEvalCachePullOutcome() }

// EvalCacheMiss: the server has no blob for the fingerprint.
type EvalCacheMiss struct{}

// EvalCachePresigned: fetch the blob from URL.
type EvalCachePresigned struct {
	URL string `wire:"url"`
}

// EvalCacheInline: EvalCacheChunk frames of TotalBytes follow.
type EvalCacheInline struct {
	TotalBytes  uint64 `wire:"total_bytes"`
	StreamToken string `wire:"stream_token"`
}

// UploadObject is what an UploadRequest wants to upload.
//
//wire:enum
//wire:variant 0 Nar *UploadNar
//wire:variant 1 EvalCache *UploadEvalCache
type UploadObject interface{ isUploadObject() }

// UploadNar is the NAR of a store path.
type UploadNar struct {
	StorePath string `wire:"store_path"`
}

// UploadEvalCache is an evaluation-cache blob.
type UploadEvalCache struct {
	Fingerprint string `wire:"fingerprint"`
}

// UploadMetadata closes an upload.
//
//wire:enum
//wire:variant 0 Nar *NarUploadMetadata tuple
//wire:variant 1 EvalCache *EvalCacheUploadMetadata
type UploadMetadata interface{ isUploadMetadata() }

// NarUploadMetadata is the metadata of an uploaded NAR.
type NarUploadMetadata struct {
	FileHash   string              `wire:"file_hash"`
	FileSize   uint64              `wire:"file_size"`
	NarSize    uint64              `wire:"nar_size"`
	NarHash    string              `wire:"nar_hash"`
	References []string            `wire:"references"`
	Deriver    *string             `wire:"deriver"`
	CA         *string             `wire:"ca"`
	Multipart  *CompletedMultipart `wire:"multipart"`
}

// EvalCacheUploadMetadata is the metadata of an uploaded eval-cache blob.
type EvalCacheUploadMetadata struct {
	SizeBytes uint64 `wire:"size_bytes"`
}

// CompletedMultipart identifies a finished presigned multipart upload.
type CompletedMultipart struct {
	UploadID string   `wire:"upload_id"`
	ETags    []string `wire:"etags"`
}

// GrantTarget is where an admitted upload goes.
//
//wire:enum
//wire:variant 0 Skip *GrantSkip
//wire:variant 1 Passthrough *GrantPassthrough
//wire:variant 2 Put *GrantPut
//wire:variant 3 Multipart *PresignedMultipart tuple
type GrantTarget interface{ isGrantTarget() }

// GrantSkip: the object is already stored; send nothing.
type GrantSkip struct{}

// GrantPassthrough: relay the bytes as UploadChunk frames from ResumeOffset.
type GrantPassthrough struct {
	ResumeOffset uint64 `wire:"resume_offset"`
}

// GrantPut: upload the bytes to a presigned URL.
type GrantPut struct {
	URL string `wire:"url"`
}

// PresignedMultipart: upload the bytes in parts to presigned URLs.
type PresignedMultipart struct {
	UploadID string   `wire:"upload_id"`
	PartSize uint64   `wire:"part_size"`
	PartURLs []string `wire:"part_urls"`
}

// UploadOutcome is the result of an upload.
//
//wire:enum
//wire:variant 0 Ok *UploadOk
//wire:variant 1 Retry *UploadRetry
//wire:variant 2 Rejected *UploadRejected
type UploadOutcome interface{ isUploadOutcome() }

// UploadOk: the object is stored.
type UploadOk struct{}

// UploadRetry: a transient failure; upload again.
type UploadRetry struct {
	Reason string `wire:"reason"`
}

// UploadRejected: the object is refused; do not retry.
type UploadRejected struct {
	Reason string `wire:"reason"`
}

// ImportOutcome is the result of an ImportRequest.
//
//wire:enum
//wire:variant 0 Completed *ImportCompleted
//wire:variant 1 Failed *ImportFailed
//wire:variant 2 Unknown *ImportUnknown
type ImportOutcome interface{ isImportOutcome() }

// ImportCompleted: every imported derivation is built.
type ImportCompleted struct{}

// ImportFailed: the build of DrvPath failed with Status.
type ImportFailed struct {
	DrvPath string `wire:"drv_path"`
	BuildID string `wire:"build_id"`
	Status  string `wire:"status"`
}

// ImportUnknown: the server does not know DrvPath.
type ImportUnknown struct {
	DrvPath string `wire:"drv_path"`
}
