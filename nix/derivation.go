package nix

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// DerivationOutput is one output of a derivation.
type DerivationOutput struct {
	Path     string `json:"path"` // empty for floating content-addressed outputs
	HashAlgo string `json:"hashAlgo,omitempty"`
	Hash     string `json:"hash,omitempty"` // set for fixed-output derivations
}

// Derivation is a parsed .drv file (`nix show-derivation`, 2.8 spelling;
// newer Nix: `nix derivation show`).
type Derivation struct {
	Path      string                      `json:"-"`
	Name      string                      `json:"name,omitempty"` // env.name in Nix 2.8
	Outputs   map[string]DerivationOutput `json:"outputs"`
	InputSrcs []string                    `json:"inputSrcs"`
	InputDrvs map[string][]string         `json:"inputDrvs"` // .drv → output names used
	System    string                      `json:"system"`
	Builder   string                      `json:"builder"`
	Args      []string                    `json:"args"`
	Env       map[string]string           `json:"env"`
}

// Derivation reads and parses a .drv from the store.
func (n *Nix) Derivation(ctx context.Context, drvPath string) (*Derivation, error) {
	drvs, err := n.Derivations(ctx, drvPath)
	if err != nil {
		return nil, err
	}
	return drvs[drvPath], nil
}

// Derivations reads and parses .drv files from the store: each one's
// NAR through the daemon (a .drv is a regular file), its ATerm text by
// ParseDerivation. A path the store lacks is an error. Up to
// derivationReaders are read at once, each over its own daemon
// connection, so an evaluation's closure walk does not wait for one round
// trip per .drv in turn.
func (n *Nix) Derivations(ctx context.Context, drvPaths ...string) (map[string]*Derivation, error) {
	var todo []string
	seen := make(map[string]bool, len(drvPaths))
	for _, p := range drvPaths {
		if seen[p] {
			continue
		}
		seen[p] = true
		if err := checkStorePath(p); err != nil || !strings.HasSuffix(p, ".drv") {
			return nil, fmt.Errorf("nix: reading derivation %q: not a store path of a .drv", p)
		}
		todo = append(todo, p)
	}
	read := make([]*Derivation, len(todo))
	errs := make([]error, len(todo))
	var next atomic.Int64
	var failed atomic.Bool // the readers stop taking paths
	var wg sync.WaitGroup
	for range min(derivationReaders, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var nar bytes.Buffer
			for {
				i := int(next.Add(1)) - 1
				if i >= len(todo) || failed.Load() {
					return
				}
				read[i], errs[i] = n.readDerivation(ctx, todo[i], &nar)
				if errs[i] != nil {
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	drvs := make(map[string]*Derivation, len(todo))
	for i, p := range todo {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if read[i] == nil { // not read: a later path failed first
			for _, err := range errs[i:] {
				if err != nil {
					return nil, err
				}
			}
			return nil, fmt.Errorf("nix: reading derivation %s: not read", p)
		}
		drvs[p] = read[i]
	}
	return drvs, nil
}

// derivationReaders is how many .drv files Derivations reads at once: the
// daemon client's default pool.
const derivationReaders = 4

// readDerivation reads and parses one .drv, using nar as its buffer.
func (n *Nix) readDerivation(ctx context.Context, p string, nar *bytes.Buffer) (*Derivation, error) {
	nar.Reset()
	if _, err := n.daemonClient().NarFromPath(ctx, p, &cappedWriter{w: nar, left: maxDerivationBytes + 1024}); err != nil {
		return nil, fmt.Errorf("nix: reading derivation %s: %w", p, daemonError(ctx, err))
	}
	text, err := narRegularFile(nar.Bytes())
	if err != nil {
		return nil, fmt.Errorf("nix: reading derivation %s: %w", p, err)
	}
	d, err := ParseDerivation(p, text)
	if err != nil {
		return nil, fmt.Errorf("nix: %w", err)
	}
	return d, nil
}

// cappedWriter fails once more than left bytes were written.
type cappedWriter struct {
	w    io.Writer
	left int64
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, fmt.Errorf("larger than %d bytes", maxDerivationBytes)
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

// narRegularFile returns the contents of a NAR holding one regular,
// non-executable file (what a .drv's NAR is).
func narRegularFile(nar []byte) ([]byte, error) {
	head := narStrings("nix-archive-1", "(", "type", "regular", "contents")
	tail := narStrings(")")
	if !bytes.HasPrefix(nar, head) || len(nar) < len(head)+8+len(tail) {
		return nil, errors.New("not the NAR of a regular file")
	}
	rest := nar[len(head):]
	size := binary.LittleEndian.Uint64(rest)
	rest = rest[8:]
	padded := (size + 7) &^ 7
	if size > maxDerivationBytes || uint64(len(rest)) != padded+uint64(len(tail)) {
		return nil, fmt.Errorf("NAR of %d bytes holds no file of %d bytes", len(nar), size)
	}
	if !bytes.Equal(rest[padded:], tail) || !allZero(rest[size:padded]) {
		return nil, errors.New("malformed NAR of a regular file")
	}
	return rest[:size], nil
}

// narStrings is the NAR encoding of strings: each a little-endian u64
// length, the bytes, zeros up to a multiple of 8.
func narStrings(ss ...string) []byte {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
		b = append(b, make([]byte, (8-len(s)%8)%8)...)
	}
	return b
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// DrvClosure returns every .drv reachable from drvPaths (themselves
// included) and the non-derivation sources they reference, both sorted:
// what must be uploaded before the derivations are reported.
func (n *Nix) DrvClosure(ctx context.Context, drvPaths ...string) (drvs, sources []string, err error) {
	// A .drv's references are its input .drvs and sources, so its
	// requisites are exactly the build-time closure of derivation files.
	all, err := n.Closure(ctx, drvPaths...)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range all {
		if strings.HasSuffix(p, ".drv") {
			drvs = append(drvs, p)
		} else {
			sources = append(sources, p)
		}
	}
	sort.Strings(drvs)
	sort.Strings(sources)
	return drvs, sources, nil
}

// OutputPaths maps output names to paths, leaving out floating outputs.
func (d *Derivation) OutputPaths() map[string]string {
	paths := map[string]string{}
	for name, out := range d.Outputs {
		if out.Path != "" {
			paths[name] = out.Path
		}
	}
	return paths
}

// IsFixedOutput reports whether any output has a fixed hash.
func (d *Derivation) IsFixedOutput() bool {
	for _, out := range d.Outputs {
		if out.Hash != "" {
			return true
		}
	}
	return false
}

// structuredAttrs returns the __json attributes, or nil.
func (d *Derivation) structuredAttrs() map[string]json.RawMessage {
	raw, ok := d.Env["__json"]
	if !ok {
		return nil
	}
	var attrs map[string]json.RawMessage
	if json.Unmarshal([]byte(raw), &attrs) != nil {
		return nil
	}
	return attrs
}

// attr returns an attribute from __structuredAttrs or the plain env.
func (d *Derivation) attr(name string) (value any, ok bool) {
	if attrs := d.structuredAttrs(); attrs != nil {
		raw, ok := attrs[name]
		if !ok {
			return nil, false
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return nil, false
		}
		return v, true
	}
	v, ok := d.Env[name]
	return v, ok
}

// RequiredSystemFeatures is requiredSystemFeatures (space-separated in the
// env, a list in structured attrs).
func (d *Derivation) RequiredSystemFeatures() []string {
	v, _ := d.attr("requiredSystemFeatures")
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var features []string
		for _, f := range v {
			if s, ok := f.(string); ok {
				features = append(features, s)
			}
		}
		return features
	}
	return nil
}

// limitAttr reads a limit in seconds, a number or numeric string; nil when
// absent, malformed or negative, so that an explicit 0 ("no limit") stays
// apart from an unset attribute (the server's default).
func (d *Derivation) limitAttr(name string) *uint64 {
	v, _ := d.attr(name)
	var n uint64
	switch v := v.(type) {
	case string:
		u, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil
		}
		n = u
	case float64:
		if v < 0 || v != math.Trunc(v) || v > math.MaxInt64 {
			return nil
		}
		n = uint64(v)
	default:
		return nil
	}
	return &n
}

// boolAttr reads Nix's env encoding ("1"/"" ) or a JSON value.
func (d *Derivation) boolAttr(name string, absent bool) bool {
	v, ok := d.attr(name)
	if !ok {
		return absent
	}
	switch v := v.(type) {
	case string:
		return v == "1" || v == "true"
	case bool:
		return v
	case float64:
		return v != 0
	}
	return absent
}

// TimeoutSecs is the `timeout` attribute: nil when unset, 0 for no limit.
func (d *Derivation) TimeoutSecs() *uint64 { return d.limitAttr("timeout") }

// MaxSilentSecs is the `maxSilent` attribute: nil when unset, 0 for no
// limit.
func (d *Derivation) MaxSilentSecs() *uint64 { return d.limitAttr("maxSilent") }

// PreferLocalBuild is the `preferLocalBuild` attribute.
func (d *Derivation) PreferLocalBuild() bool { return d.boolAttr("preferLocalBuild", false) }

// AllowSubstitutes is the `allowSubstitutes` attribute (true when absent).
func (d *Derivation) AllowSubstitutes() bool { return d.boolAttr("allowSubstitutes", true) }

// Pname is `pname`, else `name` without a trailing -<version> (the part
// after the last '-' starting with a digit).
func (d *Derivation) Pname() string {
	if v, _ := d.attr("pname"); v != nil {
		if s, ok := v.(string); ok && s != "" {
			return s
		}
	}
	name, _ := d.attr("name")
	s, _ := name.(string)
	if i := strings.LastIndex(s, "-"); i > 0 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
		return s[:i]
	}
	return s
}
