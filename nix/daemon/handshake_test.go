package daemon

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// wireBytes builds protocol bytes: uint64s, strings and string lists.
type wireBytes struct{ bytes.Buffer }

func (b *wireBytes) u64(vs ...uint64) *wireBytes {
	for _, v := range vs {
		binary.Write(&b.Buffer, binary.LittleEndian, v)
	}
	return b
}

func (b *wireBytes) str(ss ...string) *wireBytes {
	for _, s := range ss {
		b.u64(uint64(len(s)))
		b.WriteString(s)
		b.Write(make([]byte, -len(s)&7))
	}
	return b
}

func (b *wireBytes) strs(ss ...string) *wireBytes { return b.u64(uint64(len(ss))).str(ss...) }

// recordedDaemon plays one daemon's side of a handshake: it checks that
// the client sends exactly want, in order, and answers with the parts of
// reply as the client's bytes arrive.
func recordedDaemon(t *testing.T, server net.Conn, exchange []struct{ want, reply []byte }) <-chan error {
	done := make(chan error, 1)
	go func() {
		defer server.Close()
		for i, step := range exchange {
			got := make([]byte, len(step.want))
			if _, err := io.ReadFull(server, got); err != nil {
				done <- err
				return
			}
			if !bytes.Equal(got, step.want) {
				done <- errors.New("step " + string(rune('0'+i)) + ": unexpected client bytes")
				return
			}
			if _, err := server.Write(step.reply); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

func TestHandshakeVersions(t *testing.T) {
	hello := (&wireBytes{}).u64(workerMagic1, ClientVersion).Bytes()
	postHandshake := (&wireBytes{}).u64(0, 0).Bytes() // no CPU affinity, no reserveSpace
	last := (&wireBytes{}).u64(stderrLast).Bytes()
	trusted, notTrusted := true, false
	for _, tc := range []struct {
		name     string
		daemon   uint64
		features []string
		trust    *uint64
		want     Handshake
	}{
		// Nix 2.8 to 2.14: 1.34, a version string, no trust flag.
		{name: "nix 2.8", daemon: 1<<8 | 34, want: Handshake{Version: 1<<8 | 34, NixVersion: "2.8.0"}},
		// Nix 2.15 to 2.19: 1.35 adds the trust flag.
		{name: "nix 2.15", daemon: 1<<8 | 35, trust: new(uint64(1)), want: Handshake{Version: 1<<8 | 35, NixVersion: "2.15.0", Trusted: &trusted}},
		// Nix 2.20 to 2.24: 1.37 (CPU times in build results).
		{name: "nix 2.20", daemon: 1<<8 | 37, trust: new(uint64(2)), want: Handshake{Version: 1<<8 | 37, NixVersion: "2.20.0", Trusted: &notTrusted}},
		// Nix 2.25 and later: 1.38 exchanges features before the rest.
		{name: "nix 2.25", daemon: 1<<8 | 38, features: []string{"realisation-with-path-not-hash"}, trust: new(uint64(0)),
			want: Handshake{Version: 1<<8 | 38, NixVersion: "2.25.0", Features: []string{"realisation-with-path-not-hash"}}},
		// A daemon newer than the client talks the client's version.
		{name: "future", daemon: 1<<8 | 40, features: []string{}, trust: new(uint64(1)), want: Handshake{Version: ClientVersion, NixVersion: "3.0.0", Trusted: &trusted, Features: []string{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.DaemonVersion = tc.daemon
			version := strings.TrimPrefix(tc.name, "nix ")
			if tc.want.NixVersion != "" {
				version = tc.want.NixVersion
			}
			var exchange []struct{ want, reply []byte }
			exchange = append(exchange, struct{ want, reply []byte }{hello, (&wireBytes{}).u64(workerMagic2, tc.daemon).Bytes()})
			if Minor(tc.want.Version) >= 38 {
				exchange = append(exchange, struct{ want, reply []byte }{(&wireBytes{}).strs().Bytes(), (&wireBytes{}).strs(tc.features...).Bytes()})
			}
			reply := (&wireBytes{}).str(version)
			if tc.trust != nil {
				reply.u64(*tc.trust)
			}
			reply.Write(last)
			exchange = append(exchange, struct{ want, reply []byte }{postHandshake, reply.Bytes()})
			client, server := net.Pipe()
			done := recordedDaemon(t, server, exchange)
			c := newConn(client)
			client.SetDeadline(time.Now().Add(10 * time.Second))
			if err := c.handshake(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := c.hs
			if got.Version != tc.want.Version || got.DaemonVersion != tc.want.DaemonVersion || got.NixVersion != tc.want.NixVersion ||
				(got.Trusted == nil) != (tc.want.Trusted == nil) || (got.Trusted != nil && *got.Trusted != *tc.want.Trusted) ||
				strings.Join(got.Features, ",") != strings.Join(tc.want.Features, ",") {
				t.Errorf("handshake %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestHandshakeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		reply      []byte
	}{
		{"not a daemon", "magic number", (&wireBytes{}).u64(0x1234, 1<<8|34).Bytes()},
		{"too old", "too old", (&wireBytes{}).u64(workerMagic2, 1<<8|21).Bytes()},
		{"major 2", "major version 1", (&wireBytes{}).u64(workerMagic2, 2<<8|0).Bytes()},
		{"hangs up", "unexpected EOF", (&wireBytes{}).u64(workerMagic2).Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConn(rwc{bytes.NewReader(tc.reply), io.Discard})
			err := c.handshake()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

type rwc struct {
	io.Reader
	io.Writer
}

func (rwc) Close() error { return nil }

// TestStderrMessages decodes each message kind as a daemon sends it.
func TestStderrMessages(t *testing.T) {
	in := (&wireBytes{}).
		u64(stderrNext).str("\x1b[31;1mwarning:\x1b[0m hello\n").
		u64(stderrStartActivity, 7, 3, ActivityBuild).str("building '/nix/store/x.drv'").u64(2, fieldText).str("/nix/store/x.drv").u64(fieldInt, 1).u64(0).
		u64(stderrResult, 7, ResultBuildLogLine, 1, fieldText).str("compiling").
		u64(stderrStopActivity, 7).
		u64(stderrError).str("Error").u64(0).str("Error").str("path '\x1b[35;1m/nix/store/x\x1b[0m' is not valid").u64(0, 1, 0).str("while doing x").
		Bytes()
	c := newConn(rwc{bytes.NewReader(in), io.Discard})
	var lines []string
	var started, stopped []uint64
	err := c.processStderr(stderrIO{log: &Logger{
		Line:  func(s string) { lines = append(lines, s) },
		Start: func(a Activity) { started = append(started, a.ID) },
		Stop:  func(id uint64) { stopped = append(stopped, id) },
	}})
	var de *Error
	if !errors.As(err, &de) || de.Message != "path '/nix/store/x' is not valid" || len(de.Traces) != 1 || de.Traces[0] != "while doing x" {
		t.Fatalf("error %#v", err)
	}
	if strings.Join(lines, "|") != "warning: hello|compiling" || len(started) != 1 || len(stopped) != 1 {
		t.Errorf("lines %q started %v stopped %v", lines, started, stopped)
	}
}

// FuzzStderr: whatever the daemon sends, the stderr loop ends with an
// error or STDERR_LAST; it never panics or allocates without bound.
func FuzzStderr(f *testing.F) {
	f.Add((&wireBytes{}).u64(stderrNext).str("x").u64(stderrLast).Bytes())
	f.Add((&wireBytes{}).u64(stderrError).str("Error").u64(0).str("Error").str("msg").u64(0, 1, 0).str("trace").Bytes())
	f.Add((&wireBytes{}).u64(stderrStartActivity, 1, 0, 105).str("t").u64(1, fieldInt, 5, 0, stderrResult, 1, 101, 1, fieldText).str("l").u64(stderrLast).Bytes())
	f.Add((&wireBytes{}).u64(stderrRead, 5, stderrLast).Bytes())
	f.Add((&wireBytes{}).u64(stderrWrite).str("data").u64(stderrLast).Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newConn(rwc{bytes.NewReader(data), io.Discard})
		c.r.r = bufio.NewReader(bytes.NewReader(data))
		err := c.processStderr(stderrIO{log: &Logger{Line: func(string) {}}, sink: io.Discard, source: strings.NewReader("source")})
		_ = err
	})
}
