package nix

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/nix/wildcard"
)

// walkLinePrefix starts the stderr line walker.nix prints per attribute.
const walkLinePrefix = "trace: gradient-walk "

// rssPoll is how often an evaluating process's memory is read.
var rssPoll = 100 * time.Millisecond

// stderrKept bounds the non-walk stderr kept for an error message.
const stderrKept = 64 << 10

// shardWalk runs the walker over one shard of the attribute tree: one
// Nix process, replaced by a new one resuming the walk whenever it
// grows past maxRSS.
type shardWalk struct {
	n             *Nix
	flakeRef      string
	patterns      [][]wildcard.Segment
	shard, shards int
	maxRSS        int64 // bytes; 0: unbounded
	found         func(path []string, drvPath string, failed bool)
	done          map[string]bool // builtins.toJSON of the paths printed so far
	replaced      int
}

// walkLine is one attribute walker.nix printed.
type walkLine struct {
	Attr    json.RawMessage `json:"a"` // as Nix encoded it: the key of done
	DrvPath string          `json:"d"`
	Failed  bool            `json:"f"`
}

func (w *shardWalk) run(ctx context.Context) error {
	w.done = map[string]bool{}
	for {
		printed, overMemory, err := w.process(ctx)
		if !overMemory {
			return err
		}
		if printed == 0 {
			return fmt.Errorf("nix: evaluation failed: an evaluating process grew past the memory bound of %d MiB before finding any attribute", w.maxRSS>>20)
		}
		w.replaced++
		w.n.logger().Info("nix: evaluating process past its memory bound; a new one resumes the walk",
			"flake", w.flakeRef, "shard", w.shard, "found", len(w.done), "max_mib", w.maxRSS>>20, "replaced", w.replaced)
	}
}

// process runs one walking process to its end; overMemory says it was
// killed for its memory.
func (w *shardWalk) process(ctx context.Context) (printed int, overMemory bool, err error) {
	args := map[string]any{"flakeRef": w.flakeRef, "patterns": w.patterns, "shard": w.shard, "shards": w.shards}
	argsExpr := ""
	if len(w.done) == 0 {
		b, err := json.Marshal(args)
		if err != nil {
			return 0, false, err
		}
		argsExpr = "builtins.fromJSON " + nixString(string(b))
	} else {
		// The done set may be far larger than one argument may be
		// (128 KiB): it goes through a file.
		done := make(map[string]bool, len(w.done))
		for k := range w.done {
			done[k] = true
		}
		args["done"] = done
		b, err := json.Marshal(args)
		if err != nil {
			return 0, false, err
		}
		dir, err := os.MkdirTemp("", "gradient-walk-")
		if err != nil {
			return 0, false, err
		}
		defer os.RemoveAll(dir)
		file := filepath.Join(dir, "args.json")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			return 0, false, err
		}
		argsExpr = "builtins.fromJSON (builtins.readFile " + nixString(file) + ")"
	}
	expr := fmt.Sprintf("(%s) (%s)", walkerExpr, argsExpr)
	cmd := w.n.command(ctx, "nix", "eval", "--json", "--impure", "--expr", expr)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, false, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, false, fmt.Errorf("nix: running nix eval: %w", err)
	}
	var killed atomic.Bool
	watchDone := make(chan struct{})
	if w.maxRSS > 0 {
		go func() {
			t := time.NewTicker(rssPoll)
			defer t.Stop()
			for {
				select {
				case <-watchDone:
					return
				case <-t.C:
				}
				if rss, err := processRSS(cmd.Process.Pid); err == nil && rss > w.maxRSS {
					killed.Store(true)
					_ = cmd.Process.Kill()
					return
				}
			}
		}()
	}
	kept := &tailBuffer{max: stderrKept}
	r := bufio.NewReaderSize(stderr, 64<<10)
	for {
		line, rerr := r.ReadString('\n')
		if rest, ok := strings.CutPrefix(line, walkLinePrefix); ok {
			var l walkLine
			if err := json.Unmarshal([]byte(rest), &l); err == nil {
				var path []string
				if err := json.Unmarshal(l.Attr, &path); err == nil {
					key := string(l.Attr)
					if !w.done[key] {
						w.done[key] = true
						printed++
						w.found(path, l.DrvPath, l.Failed || l.DrvPath == "")
					}
					line = ""
				}
			}
		}
		_, _ = kept.Write([]byte(line))
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				_, _ = io.Copy(io.Discard, r)
			}
			break
		}
	}
	err = cmd.Wait()
	close(watchDone)
	w.n.logger().Debug("nix: ran", "cmd", "nix eval (walker)", "shard", w.shard, "took", time.Since(start), "found", printed, "err", err)
	if killed.Load() && ctx.Err() == nil {
		return printed, true, nil
	}
	if err != nil {
		return printed, false, evalError(commandError(ctx, cmd, err, kept.String()))
	}
	return printed, false, nil
}

// processRSS reads a process's resident set size from /proc.
func processRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}
