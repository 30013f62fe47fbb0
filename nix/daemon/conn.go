package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
)

// Protocol versions: the major is 1; minors are what changed.
const (
	workerMagic1 = 0x6e697863 // "nixc"
	workerMagic2 = 0x6478696f // "dxio"

	// ClientVersion is the newest protocol this client speaks (Nix 2.25
	// and later: 1.38, with its feature exchange).
	ClientVersion = 1<<8 | 38
	// MinVersion is the oldest daemon protocol accepted: 1.34, Nix 2.8,
	// the oldest Nix the project supports; it is the first with
	// BuildPathsWithResults.
	MinVersion = 1<<8 | 34

	versionTrust    = 35 // the daemon says whether it trusts the client
	versionCPUTimes = 37 // build results carry CPU times
	versionFeatures = 38 // both sides exchange feature names
)

// Minor is a protocol version's minor number.
func Minor(v uint64) uint64 { return v & 0xff }

// FormatVersion renders a protocol version as Nix does ("1.34").
func FormatVersion(v uint64) string { return fmt.Sprintf("%d.%d", v>>8, Minor(v)) }

// Handshake is what the daemon said about itself.
type Handshake struct {
	// Version is the protocol both sides use: the lower of the two.
	Version uint64
	// DaemonVersion is the newest protocol the daemon speaks.
	DaemonVersion uint64
	// NixVersion is the daemon's Nix version ("2.8.0").
	NixVersion string
	// Trusted is the daemon's view of this client from protocol 1.35
	// on; nil when the daemon does not say.
	Trusted *bool
	// Features the daemon offered (1.38 and later). The client asks for
	// none, so none are in use.
	Features []string
}

// ErrConnection is wrapped by every failure of the connection itself —
// the daemon went away, the socket broke, the context ended mid-operation
// — as opposed to an *Error the daemon reported.
var ErrConnection = errors.New("nix daemon: connection failed")

// conn is one handshaken connection.
type conn struct {
	rwc     io.ReadWriteCloser
	r       reader
	w       writer
	hs      Handshake
	created time.Time
}

// version is the agreed protocol's minor number.
func (c *conn) minor() uint64 { return Minor(c.hs.Version) }

func newConn(rwc io.ReadWriteCloser) *conn {
	c := &conn{rwc: rwc, created: time.Now()}
	c.r.r = bufio.NewReaderSize(rwc, 64<<10)
	c.w.w = bufio.NewWriterSize(rwc, 64<<10)
	return c
}

// handshake runs the opening exchange and the first stderr loop.
func (c *conn) handshake() error {
	if err := c.w.u64(workerMagic1).u64(ClientVersion).flush(); err != nil {
		return err
	}
	magic, err := c.r.u64()
	if err != nil {
		return err
	}
	if magic != workerMagic2 {
		return fmt.Errorf("%w: the peer answered %#x, not the Nix daemon's magic number", ErrProtocol, magic)
	}
	daemonVersion, err := c.r.u64()
	if err != nil {
		return err
	}
	if daemonVersion>>8 != ClientVersion>>8 {
		return fmt.Errorf("%w: the daemon speaks protocol %s; this client speaks major version 1", ErrProtocol, FormatVersion(daemonVersion))
	}
	if daemonVersion < MinVersion {
		return fmt.Errorf("nix daemon: protocol %s is too old: at least %s (Nix 2.8) is needed", FormatVersion(daemonVersion), FormatVersion(MinVersion))
	}
	c.hs = Handshake{Version: min(daemonVersion, ClientVersion), DaemonVersion: daemonVersion}
	if c.minor() >= versionFeatures {
		if err := c.w.strings(nil).flush(); err != nil {
			return err
		}
		if c.hs.Features, err = c.r.strings(); err != nil {
			return err
		}
	}
	// The obsolete CPU affinity (none) and reserveSpace (false).
	if err := c.w.u64(0).u64(0).flush(); err != nil {
		return err
	}
	if c.hs.NixVersion, err = c.r.string(); err != nil {
		return err
	}
	if c.minor() >= versionTrust {
		flag, err := c.r.u64()
		if err != nil {
			return err
		}
		switch flag {
		case 0:
		case 1, 2:
			trusted := flag == 1
			c.hs.Trusted = &trusted
		default:
			return fmt.Errorf("%w: trust flag %d", ErrProtocol, flag)
		}
	}
	return c.processStderr(stderrIO{})
}
