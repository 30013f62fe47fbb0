package worker

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HostSystem is the Nix system string of this machine (x86_64-linux,
// aarch64-darwin, …), the default architecture until Nix detection exists.
func HostSystem() string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "riscv64": "riscv64", "arm": "armv7l"}[runtime.GOARCH]
	if arch == "" {
		arch = runtime.GOARCH
	}
	return arch + "-" + runtime.GOOS
}

// memInfo returns MemTotal and MemAvailable from /proc/meminfo in MiB
// (zeros where unavailable: the wire allows them, only scoring suffers).
func memInfo() (totalMB, availableMB uint64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			totalMB = kb / 1024
		case "MemAvailable:":
			availableMB = kb / 1024
		}
	}
	return totalMB, availableMB
}

// cpuSampler turns the cumulative counters of /proc/stat into the busy
// percentage since the previous sample.
type cpuSampler struct {
	mu                sync.Mutex
	lastBusy, lastAll uint64
}

func (c *cpuSampler) usagePct() float32 {
	busy, all, ok := readCPUStat()
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	db, da := busy-c.lastBusy, all-c.lastAll
	first := c.lastAll == 0
	c.lastBusy, c.lastAll = busy, all
	if first || da == 0 || busy < db {
		return 0
	}
	return float32(db) * 100 / float32(da)
}

func readCPUStat() (busy, all uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		all += v
		if i != 3 && i != 4 { // idle and iowait are not busy
			busy += v
		}
	}
	return busy, all, true
}

// CPUCoreScore is a relative single-core speed: SHA-256 throughput of one
// goroutine for 100 ms, in MiB/s. It only needs to rank machines.
func CPUCoreScore() uint32 {
	buf := make([]byte, 64<<10)
	var n uint64
	start := time.Now()
	for time.Since(start) < 100*time.Millisecond {
		sha256.Sum256(buf)
		n += uint64(len(buf))
	}
	return uint32(float64(n) / (1 << 20) / time.Since(start).Seconds())
}
