package daemon

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Operation codes (Nix's WorkerProto::Op).
const (
	opIsValidPath           = 1
	opAddTempRoot           = 11
	opAddIndirectRoot       = 12
	opSetOptions            = 19
	opQueryPathInfo         = 26
	opQueryValidPaths       = 31
	opNarFromPath           = 38
	opAddToStoreNar         = 39
	opQueryMissing          = 40
	opBuildPathsWithResults = 46
)

// PathInfo is the store's metadata of a valid path.
type PathInfo struct {
	Path             string
	Deriver          string // "" when unknown
	NarHash          []byte // SHA-256 digest of the NAR
	References       []string
	RegistrationTime time.Time
	NarSize          uint64
	Ultimate         bool // built here, not copied in
	Signatures       []string
	CA               string // content address, "" for input-addressed paths
}

// IsValidPath reports whether the store has path.
func (c *Client) IsValidPath(ctx context.Context, path string) (bool, error) {
	var valid bool
	err := c.do(ctx, true, func(cn *conn) error {
		cn.w.u64(opIsValidPath).string(path)
		if err := cn.request(nil); err != nil {
			return err
		}
		var err error
		valid, err = cn.r.bool()
		return err
	})
	return valid, err
}

// QueryValidPaths returns the paths among paths that the store has (in
// no particular order). It never substitutes.
func (c *Client) QueryValidPaths(ctx context.Context, paths []string) ([]string, error) {
	var valid []string
	err := c.do(ctx, true, func(cn *conn) error {
		cn.w.u64(opQueryValidPaths).strings(paths).bool(false)
		if err := cn.request(nil); err != nil {
			return err
		}
		var err error
		valid, err = cn.r.strings()
		return err
	})
	return valid, err
}

// QueryPathInfo returns path's metadata, or nil when the store lacks it.
func (c *Client) QueryPathInfo(ctx context.Context, path string) (*PathInfo, error) {
	var info *PathInfo
	err := c.do(ctx, true, func(cn *conn) error {
		cn.w.u64(opQueryPathInfo).string(path)
		if err := cn.request(nil); err != nil {
			return err
		}
		var err error
		info, err = cn.readPathInfo(path)
		return err
	})
	return info, err
}

// QueryPathInfos returns the metadata of several paths, in order, on one
// connection with the requests pipelined; a path the store lacks is nil.
func (c *Client) QueryPathInfos(ctx context.Context, paths []string) ([]*PathInfo, error) {
	infos := make([]*PathInfo, len(paths))
	err := c.do(ctx, true, func(cn *conn) error {
		// The daemon answers in order; writing every request first saves
		// a round trip per path. Its replies may fill the socket while
		// the requests are written, so they are written from another
		// goroutine.
		written := make(chan error, 1)
		go func() {
			for _, p := range paths {
				cn.w.u64(opQueryPathInfo).string(p)
			}
			written <- cn.w.flush()
		}()
		var firstErr error
		for i, p := range paths {
			if err := cn.processStderr(stderrIO{}); err != nil {
				if _, ok := err.(*Error); !ok {
					<-written
					return err
				}
				if firstErr == nil {
					firstErr = fmt.Errorf("path info of %s: %w", p, err)
				}
				continue
			}
			info, err := cn.readPathInfo(p)
			if err != nil {
				<-written
				return err
			}
			infos[i] = info
		}
		if err := <-written; err != nil {
			return err
		}
		return firstErr
	})
	return infos, err
}

func (cn *conn) readPathInfo(path string) (*PathInfo, error) {
	valid, err := cn.r.bool()
	if err != nil || !valid {
		return nil, err
	}
	info := &PathInfo{Path: path}
	if info.Deriver, err = cn.r.string(); err != nil {
		return nil, err
	}
	hash, err := cn.r.string()
	if err != nil {
		return nil, err
	}
	if info.NarHash, err = parseNarHash(hash); err != nil {
		return nil, err
	}
	if info.References, err = cn.r.strings(); err != nil {
		return nil, err
	}
	registered, err := cn.r.u64()
	if err != nil {
		return nil, err
	}
	info.RegistrationTime = time.Unix(int64(registered), 0)
	if info.NarSize, err = cn.r.u64(); err != nil {
		return nil, err
	}
	if info.Ultimate, err = cn.r.bool(); err != nil {
		return nil, err
	}
	if info.Signatures, err = cn.r.strings(); err != nil {
		return nil, err
	}
	info.CA, err = cn.r.string()
	return info, err
}

// parseNarHash reads the daemon's NAR hash: base-16 SHA-256, with or
// without a "sha256:" prefix.
func parseNarHash(s string) ([]byte, error) {
	digest, err := hex.DecodeString(strings.TrimPrefix(s, "sha256:"))
	if err != nil || len(digest) != 32 {
		return nil, fmt.Errorf("%w: NAR hash %.80q is not base-16 SHA-256", ErrProtocol, s)
	}
	return digest, nil
}

// ErrNotValid is wrapped by the error of an operation on a path the
// store lacks.
var ErrNotValid = errors.New("nix daemon: path is not valid")

// NarFromPath writes path's NAR serialisation to w and returns its size.
// The daemon sends the NAR unframed after its reply, so the path's size
// is asked for first, pipelined on the same connection.
func (c *Client) NarFromPath(ctx context.Context, path string, w io.Writer) (int64, error) {
	var size int64
	err := c.do(ctx, false, func(cn *conn) error {
		cn.w.u64(opQueryPathInfo).string(path).u64(opNarFromPath).string(path)
		if err := cn.request(nil); err != nil {
			// The NarFromPath request is still queued: the connection
			// is out of step.
			return discard{brokenAfter(err)}
		}
		info, err := cn.readPathInfo(path)
		if err != nil {
			return err
		}
		if info == nil {
			// The daemon would fail after its reply and hang up.
			return discard{fmt.Errorf("%w: %s", ErrNotValid, path)}
		}
		if err := cn.processStderr(stderrIO{}); err != nil {
			return err
		}
		n, err := io.CopyN(w, cn.r.r, int64(info.NarSize))
		size = n
		if err != nil {
			// The rest of the NAR is unread: the connection must go.
			return eof(err)
		}
		return nil
	})
	return size, err
}

// brokenAfter keeps a daemon error from leaving the connection in the
// pool when more of the exchange is still unread.
func brokenAfter(err error) error {
	if de, ok := err.(*Error); ok {
		return fmt.Errorf("nix daemon: %s (connection out of step)", de.Message)
	}
	return err
}

// Import is a path to add from its NAR.
type Import struct {
	Path       string
	Deriver    string
	NarHash    []byte // SHA-256 of the NAR; the daemon refuses a NAR that differs
	NarSize    uint64
	References []string
	Signatures []string
	CA         string
	// Ultimate marks the path as built here. Imports are not.
	Ultimate bool
}

// frameSize is how much of a NAR goes into one frame.
const frameSize = 64 << 10

// AddToStoreNar adds a path from its NAR, read from nar (protocol 1.23
// and later stream it in frames). dontCheckSigs skips the signature
// check, which only a trusted client may ask for.
func (c *Client) AddToStoreNar(ctx context.Context, it Import, nar io.Reader, dontCheckSigs bool) error {
	return c.do(ctx, false, func(cn *conn) error {
		cn.w.u64(opAddToStoreNar).string(it.Path).string(it.Deriver).string(hex.EncodeToString(it.NarHash)).
			strings(it.References).u64(0).u64(it.NarSize).bool(it.Ultimate).strings(it.Signatures).string(it.CA).
			bool(false).bool(dontCheckSigs)
		if err := cn.w.flush(); err != nil {
			return err
		}
		// The daemon may log (or fail) while it reads: its messages are
		// read while the frames are written.
		written := make(chan error, 1)
		go func() {
			err := cn.writeFrames(nar)
			if err != nil {
				// Unblocks the daemon, which waits for the frames' end,
				// and so the stderr loop.
				cn.rwc.Close()
			}
			written <- err
		}()
		err := cn.processStderr(stderrIO{})
		if werr := <-written; werr != nil {
			// The frames stopped short: the daemon still waits for the
			// rest, so the connection must go whatever it said. When the
			// NAR's reader failed, the daemon did not: its other
			// connections stay.
			var re narReadError
			if errors.As(werr, &re) {
				return discard{fmt.Errorf("reading the NAR of %s: %w", it.Path, re.error)}
			}
			return fmt.Errorf("sending the NAR of %s: %w", it.Path, werr)
		}
		return err
	})
}

// writeFrames sends r as frames (length, bytes; no padding) ending in an
// empty one.
func (cn *conn) writeFrames(r io.Reader) error {
	buf := make([]byte, frameSize)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			cn.w.u64(uint64(n))
			if cn.w.err == nil {
				_, cn.w.err = cn.w.w.Write(buf[:n])
			}
			if cn.w.err != nil {
				return cn.w.err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return cn.w.u64(0).flush()
		}
		if err != nil {
			return narReadError{err}
		}
	}
}

// narReadError is the failure of the reader an AddToStoreNar sends.
type narReadError struct{ error }

func (e narReadError) Unwrap() error { return e.error }

// AddTempRoot keeps path from the garbage collector while this
// connection lasts.
func (c *Client) AddTempRoot(ctx context.Context, path string) error {
	return c.simple(ctx, opAddTempRoot, path)
}

// AddIndirectRoot registers link, a symlink into the store kept
// anywhere, as a GC root for as long as the link exists.
func (c *Client) AddIndirectRoot(ctx context.Context, link string) error {
	return c.simple(ctx, opAddIndirectRoot, link)
}

// simple runs an operation of one string argument whose reply is 1.
func (c *Client) simple(ctx context.Context, op uint64, arg string) error {
	return c.do(ctx, true, func(cn *conn) error {
		cn.w.u64(op).string(arg)
		if err := cn.request(nil); err != nil {
			return err
		}
		_, err := cn.r.u64()
		return err
	})
}

// Missing is what realising some paths would take.
type Missing struct {
	WillBuild, WillSubstitute, Unknown []string
	DownloadSize, NarSize              uint64
}

// QueryMissing says which of targets (store paths, or "drv!out"
// derivation outputs) would be built or substituted, and which are
// unknown: neither valid nor obtainable.
func (c *Client) QueryMissing(ctx context.Context, targets []string) (*Missing, error) {
	var m Missing
	err := c.do(ctx, true, func(cn *conn) error {
		cn.w.u64(opQueryMissing).strings(targets)
		if err := cn.request(nil); err != nil {
			return err
		}
		var err error
		if m.WillBuild, err = cn.r.strings(); err != nil {
			return err
		}
		if m.WillSubstitute, err = cn.r.strings(); err != nil {
			return err
		}
		if m.Unknown, err = cn.r.strings(); err != nil {
			return err
		}
		if m.DownloadSize, err = cn.r.u64(); err != nil {
			return err
		}
		m.NarSize, err = cn.r.u64()
		return err
	})
	return &m, err
}

// BuildOptions are the settings a build runs with (sent by SetOptions
// on the build's connection before it starts).
type BuildOptions struct {
	Timeout   time.Duration // wall clock; 0: none
	MaxSilent time.Duration // without output; 0: none
	Cores     int           // 0: the daemon's setting
	// MaxJobs is how many builds may run at once (0: 1); Nix refuses to
	// build at all with 0.
	MaxJobs int
	// Substitute lets the daemon fetch from its substituters instead of
	// building.
	Substitute bool
	Log        *Logger
}

// Build statuses (Nix's BuildResult::Status).
const (
	StatusBuilt                  = 0
	StatusSubstituted            = 1
	StatusAlreadyValid           = 2
	StatusPermanentFailure       = 3
	StatusInputRejected          = 4
	StatusOutputRejected         = 5
	StatusTransientFailure       = 6
	StatusCachedFailure          = 7
	StatusTimedOut               = 8
	StatusMiscFailure            = 9
	StatusDependencyFailed       = 10
	StatusLogLimitExceeded       = 11
	StatusNotDeterministic       = 12
	StatusResolvesToAlreadyValid = 13
	StatusNoSubstituters         = 14
)

// BuildResult is the outcome of one requested path.
type BuildResult struct {
	Path               string // as requested ("drv!*", "drv!out", a store path)
	Status             uint64
	ErrorMsg           string
	TimesBuilt         uint64
	NonDeterministic   bool
	Start, Stop        time.Time
	CPUUser, CPUSystem *time.Duration // protocol 1.37 and later
	// Outputs maps output names to the store paths built or found.
	Outputs map[string]string
}

// Success reports whether the path is now valid.
func (r *BuildResult) Success() bool {
	switch r.Status {
	case StatusBuilt, StatusSubstituted, StatusAlreadyValid, StatusResolvesToAlreadyValid:
		return true
	}
	return false
}

// BuildPaths realises targets ("drv!*" for every output of a derivation)
// with opts and returns one result per target. A failed build is a
// result, not an error; errors are the daemon failing as a whole.
func (c *Client) BuildPaths(ctx context.Context, targets []string, opts BuildOptions) ([]BuildResult, error) {
	var results []BuildResult
	err := c.do(ctx, false, func(cn *conn) error {
		if err := cn.setOptions(opts, c.buildHook); err != nil {
			return err
		}
		cn.w.u64(opBuildPathsWithResults).strings(targets).u64(0)
		if err := cn.request(opts.Log); err != nil {
			return err
		}
		n, err := cn.r.count()
		if err != nil {
			return err
		}
		for range n {
			r, err := cn.readKeyedBuildResult()
			if err != nil {
				return err
			}
			results = append(results, r)
		}
		return nil
	})
	return results, err
}

// Verbosity levels; messages above the level are not sent.
const (
	levelError = 0
)

func (cn *conn) setOptions(opts BuildOptions, buildHook string) error {
	maxJobs := max(opts.MaxJobs, 1)
	overrides := [][2]string{{"timeout", seconds(opts.Timeout)}}
	if buildHook != "" {
		overrides = append(overrides, [2]string{"build-hook", buildHook})
	}
	cn.w.u64(opSetOptions).
		bool(false). // keepFailed
		bool(false). // keepGoing
		bool(false). // tryFallback
		u64(levelError).
		u64(uint64(maxJobs)).
		u64(uint64(secondsInt(opts.MaxSilent))).
		bool(true).      // obsolete useBuildHook
		u64(levelError). // verboseBuild: the build log at the error level
		u64(0).          // obsolete logType
		u64(0).          // obsolete printBuildTrace
		u64(uint64(max(opts.Cores, 0))).
		bool(opts.Substitute).
		u64(uint64(len(overrides)))
	for _, o := range overrides {
		cn.w.string(o[0]).string(o[1])
	}
	return cn.request(nil)
}

func secondsInt(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
func seconds(d time.Duration) string   { return fmt.Sprint(secondsInt(d)) }

func (cn *conn) readKeyedBuildResult() (BuildResult, error) {
	var r BuildResult
	var err error
	if r.Path, err = cn.r.string(); err != nil {
		return r, err
	}
	if r.Status, err = cn.r.u64(); err != nil {
		return r, err
	}
	msg, err := cn.r.string()
	if err != nil {
		return r, err
	}
	r.ErrorMsg = plain(msg)
	if r.TimesBuilt, err = cn.r.u64(); err != nil {
		return r, err
	}
	if r.NonDeterministic, err = cn.r.bool(); err != nil {
		return r, err
	}
	start, err := cn.r.u64()
	if err != nil {
		return r, err
	}
	stop, err := cn.r.u64()
	if err != nil {
		return r, err
	}
	r.Start, r.Stop = time.Unix(int64(start), 0), time.Unix(int64(stop), 0)
	if cn.minor() >= versionCPUTimes {
		if r.CPUUser, err = cn.readOptionalMicros(); err != nil {
			return r, err
		}
		if r.CPUSystem, err = cn.readOptionalMicros(); err != nil {
			return r, err
		}
	}
	n, err := cn.r.count()
	if err != nil {
		return r, err
	}
	r.Outputs = make(map[string]string, n)
	for range n {
		id, err := cn.r.string()
		if err != nil {
			return r, err
		}
		raw, err := cn.r.string()
		if err != nil {
			return r, err
		}
		_, name, ok := strings.Cut(id, "!")
		var realisation struct {
			OutPath string `json:"outPath"`
		}
		if !ok || json.Unmarshal([]byte(raw), &realisation) != nil || realisation.OutPath == "" {
			return r, fmt.Errorf("%w: built output %.80q: %.200q", ErrProtocol, id, raw)
		}
		if !strings.HasPrefix(realisation.OutPath, "/") {
			realisation.OutPath = StoreDir + "/" + realisation.OutPath
		}
		r.Outputs[name] = realisation.OutPath
	}
	return r, nil
}

// StoreDir is the logical store directory of every store the client
// speaks to (chroot stores keep it).
const StoreDir = "/nix/store"

func (cn *conn) readOptionalMicros() (*time.Duration, error) {
	tag, err := cn.r.u64()
	if err != nil || tag == 0 {
		return nil, err
	}
	if tag != 1 {
		return nil, fmt.Errorf("%w: optional tag %d", ErrProtocol, tag)
	}
	us, err := cn.r.u64()
	if err != nil {
		return nil, err
	}
	d := time.Duration(int64(us)) * time.Microsecond
	return &d, nil
}

// request flushes the written request and runs the stderr loop.
func (cn *conn) request(log *Logger) error {
	if err := cn.w.flush(); err != nil {
		return err
	}
	return cn.processStderr(stderrIO{log: log})
}
