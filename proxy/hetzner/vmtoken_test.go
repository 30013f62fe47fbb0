package hetzner

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

// relayFrom forwards every connection to target from the source address
// ip (a loopback address other than 127.0.0.1 is another host as far as
// the proxy can tell) and returns where it listens.
func relayFrom(t *testing.T, ip net.IP, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			wg.Add(2)
			for _, p := range [][2]net.Conn{{in, out}, {out, in}} {
				go func() {
					defer wg.Done()
					io.Copy(p[0], p[1])
					p[0].Close()
					p[1].Close()
				}()
			}
		}
	}()
	return ln.Addr().String()
}

// runWorker runs a worker with a VM's env file, dialing url, until the
// test ends; rejected receives the codes the proxy refused it with.
func runWorker(t *testing.T, env map[string]string, url string) (rejected chan uint16, established chan struct{}) {
	t.Helper()
	rejected, established = make(chan uint16, 16), make(chan struct{}, 16)
	w, err := worker.New(worker.Config{
		Session: workersession.Config{
			ServerURL: url, WorkerID: env[EnvWorkerID], Peers: env[EnvPeers],
			Capabilities:   wire.GradientCapabilities{Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour,
			Logger:        slog.New(slog.DiscardHandler),
			OnEstablished: func() { established <- struct{}{} },
			OnRejected: func(code uint16, _ string) bool {
				select {
				case rejected <- code:
				default:
				}
				return false
			},
		},
		Architectures: []string{x86}, MaxBuilds: 1, CPUCoreScore: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return rejected, established
}

// A VM's worker token is one-time: its first handshake binds it to the
// VM's address. A copy of the token (as a build could read it from the
// metadata service) used from another address is refused, even while
// the VM's own worker is away; the VM's worker itself reconnects.
func TestVMTokenIsBoundToTheVMsAddress(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 1)
	r.pass()
	r.waitConnected(acme.ID, 1)
	vm := r.rows(acme.ID)[0]
	if vm.WorkerAddr != "127.0.0.1" {
		t.Fatalf("the VM's row is bound to %q, want the address of its first handshake 127.0.0.1", vm.WorkerAddr)
	}
	env := r.env(vm.ServerID)
	r.crash(vm.ServerID)
	waitfor.True(t, "the proxy sees the VM's worker gone", func() bool { return !r.sessions.Connected(vm.WorkerID) })

	// The stolen token from 127.0.0.2: refused in the handshake.
	target := strings.TrimPrefix(r.protoURL, "ws://")
	target, _, _ = strings.Cut(target, "/")
	thief := "ws://" + relayFrom(t, net.IPv4(127, 0, 0, 2), target) + "/proto"
	rejected, established := runWorker(t, env, thief)
	var code uint16
	waitfor.True(t, "the proxy refuses the token from another address", func() bool {
		select {
		case code = <-rejected:
			return true
		default:
			return false
		}
	})
	select {
	case <-established:
		t.Fatal("a session was established with the VM's token from another address")
	default:
	}
	if r.sessions.Connected(vm.WorkerID) {
		t.Fatal("the token from another address holds the VM's worker ID")
	}
	t.Logf("refused with %d", code)

	// The VM's worker comes back (a restarted unit, a reboot): accepted.
	_, back := runWorker(t, env, r.protoURL)
	waitfor.True(t, "the VM's own worker reconnects", func() bool {
		select {
		case <-back:
			return true
		default:
			return false
		}
	})
	if !r.sessions.Connected(vm.WorkerID) {
		t.Fatal("the VM's worker reconnected but holds no session")
	}
	if rows := r.rows(acme.ID); len(rows) != 1 || rows[0].WorkerAddr != "127.0.0.1" {
		t.Fatalf("rows %+v: the binding moved", rows)
	}
}

// The user data firewalls the metadata service from every user but
// root before it writes the token: bootcmd runs at every boot and comes
// first. The script uses nft, else iptables, and powers the VM off with
// neither (run here with commands that record what they were asked).
func TestUserDataFirewallsTheMetadataService(t *testing.T) {
	t.Parallel()
	ud, err := UserData("wss://proxy.example/proto", "0190f0c2-7c4e-7a6b-9c1d-2e3f4a5b6c7d", "tok3n", 2)
	if err != nil {
		t.Fatal(err)
	}
	boot, files := strings.Index(ud, "\nbootcmd:\n"), strings.Index(ud, "\nwrite_files:\n")
	if boot < 0 || files < 0 || boot > files {
		t.Fatalf("want bootcmd before write_files:\n%s", ud)
	}
	for _, rule := range []string{
		"ip daddr 169.254.169.254 meta skuid != 0 reject",
		"iptables -w -I OUTPUT 1 -d 169.254.169.254/32 -m owner ! --uid-owner 0 -j REJECT",
	} {
		if !strings.Contains(ud, rule) {
			t.Fatalf("the user data lacks %q:\n%s", rule, ud)
		}
	}
	// The script, as cloud-init runs it: the block's lines without
	// their indentation.
	var script strings.Builder
	for _, line := range strings.Split(ud[boot+len("\nbootcmd:\n  - |\n"):files], "\n") {
		script.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	run := func(t *testing.T, commands map[string]string) string {
		dir := t.TempDir()
		log := filepath.Join(dir, "log")
		for name, body := range commands {
			stub := "#!" + sh + "\necho \"" + name + " $*\" >>" + log + "\n" + body + "\n"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(sh, "-c", script.String())
		cmd.Env = []string{"PATH=" + dir, "LOG=" + log}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the script failed: %v\n%s", err, out)
		}
		got, _ := os.ReadFile(log)
		return string(got)
	}
	cat := "/bin/cat"
	if _, err := os.Stat(cat); err != nil {
		cat = "/usr/bin/cat"
	}
	t.Run("nft", func(t *testing.T) {
		got := run(t, map[string]string{"nft": cat + ` >>"$LOG"`, "iptables": "exit 0", "poweroff": "exit 0"})
		if !strings.Contains(got, "nft -f -") || !strings.Contains(got, "meta skuid != 0 reject") || strings.Contains(got, "iptables") ||
			strings.Contains(got, "poweroff") {
			t.Fatalf("with nft: %q", got)
		}
	})
	t.Run("iptables", func(t *testing.T) {
		got := run(t, map[string]string{"iptables": `case "$2" in -C) exit 1;; esac`, "poweroff": "exit 0"})
		if !strings.Contains(got, "iptables -w -I OUTPUT 1 -d 169.254.169.254/32 -m owner ! --uid-owner 0 -j REJECT") ||
			strings.Contains(got, "poweroff") {
			t.Fatalf("with iptables only: %q", got)
		}
	})
	t.Run("neither", func(t *testing.T) {
		if got := run(t, map[string]string{"poweroff": "exit 0"}); !strings.Contains(got, "poweroff") {
			t.Fatalf("without nft and iptables the VM is not powered off: %q", got)
		}
	})
}
