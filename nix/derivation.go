package nix

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
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

// Derivations parses several .drv files with one Nix call (`nix
// show-derivation`, renamed `nix derivation show` in Nix 2.15).
func (n *Nix) Derivations(ctx context.Context, drvPaths ...string) (map[string]*Derivation, error) {
	v, err := n.Version(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"show-derivation"}
	if v.AtLeast(versionDerivationShow.Major, versionDerivationShow.Minor) {
		args = []string{"derivation", "show"}
	}
	args = append(args, drvPaths...)
	out, err := n.output(ctx, "nix", args...)
	if err != nil {
		return nil, err
	}
	drvs, err := parseDerivationsJSON(out)
	if err != nil {
		return nil, fmt.Errorf("%w (nix %s)", err, strings.Join(args, " "))
	}
	for _, p := range drvPaths {
		if drvs[p] == nil {
			return nil, fmt.Errorf("nix: %s did not describe %s", args[0], p)
		}
	}
	return drvs, nil
}

// derivationJSON is one derivation as any Nix version prints it.
type derivationJSON struct {
	Name      string                          `json:"name"`
	Outputs   map[string]derivationOutputJSON `json:"outputs"`
	InputSrcs []string                        `json:"inputSrcs"`
	InputDrvs map[string]json.RawMessage      `json:"inputDrvs"`
	// Format version 4 groups the inputs.
	Inputs *struct {
		Srcs []string                   `json:"srcs"`
		Drvs map[string]json.RawMessage `json:"drvs"`
	} `json:"inputs"`
	System          string            `json:"system"`
	Builder         string            `json:"builder"`
	Args            []string          `json:"args"`
	Env             map[string]string `json:"env"`
	StructuredAttrs json.RawMessage   `json:"structuredAttrs"`
}

type derivationOutputJSON struct {
	Path     *string         `json:"path"`
	Method   string          `json:"method"`
	HashAlgo string          `json:"hashAlgo"`
	Hash     json.RawMessage `json:"hash"`
}

// parseDerivationsJSON reads `nix show-derivation` / `nix derivation show`
// output of any Nix version, keyed by full .drv path:
//   - 2.8: keyed by full path, inputDrvs {drv: [outputs]}, fixed outputs with
//     hashAlgo "r:sha256" and a base-16 hash;
//   - 2.18 and later: inputDrvs {drv: {"outputs": […], "dynamicOutputs": {}}},
//     outputs with a separate "method";
//   - format version 3: keys and paths as base names;
//   - format version 4: "inputs": {"srcs", "drvs"}, "structuredAttrs" apart
//     from env (kept here as env.__json, as older Nix prints it), hashes
//     possibly as objects; possibly wrapped as {"version", "derivations"}.
func parseDerivationsJSON(data []byte) (map[string]*Derivation, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("nix: decoding derivation JSON: %w", err)
	}
	if inner, ok := top["derivations"]; ok && top["version"] != nil {
		top = nil // Unmarshal would merge into the outer keys
		if err := json.Unmarshal(inner, &top); err != nil {
			return nil, fmt.Errorf("nix: decoding derivation JSON \"derivations\": %w", err)
		}
	}
	drvs := make(map[string]*Derivation, len(top))
	for key, raw := range top {
		var r derivationJSON
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("nix: decoding derivation %s: %w", key, err)
		}
		d := &Derivation{
			Path:      fullStorePath(key),
			Name:      r.Name,
			Outputs:   make(map[string]DerivationOutput, len(r.Outputs)),
			InputDrvs: map[string][]string{},
			System:    r.System,
			Builder:   r.Builder,
			Args:      r.Args,
			Env:       r.Env,
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		if d.Name == "" {
			d.Name = d.Env["name"]
		}
		for name, o := range r.Outputs {
			out, err := o.toOutput()
			if err != nil {
				return nil, fmt.Errorf("nix: derivation %s output %s: %w", d.Path, name, err)
			}
			d.Outputs[name] = out
		}
		srcs, inputDrvs := r.InputSrcs, r.InputDrvs
		if r.Inputs != nil {
			srcs, inputDrvs = r.Inputs.Srcs, r.Inputs.Drvs
		}
		d.InputSrcs = make([]string, len(srcs))
		for i, src := range srcs {
			d.InputSrcs[i] = fullStorePath(src)
		}
		for drv, raw := range inputDrvs {
			outs, err := inputDrvOutputs(raw)
			if err != nil {
				return nil, fmt.Errorf("nix: derivation %s input %s: %w", d.Path, drv, err)
			}
			d.InputDrvs[fullStorePath(drv)] = outs
		}
		if sa := bytes.TrimSpace(r.StructuredAttrs); len(sa) > 0 && string(sa) != "null" {
			d.Env["__json"] = string(sa)
		}
		drvs[d.Path] = d
	}
	return drvs, nil
}

// inputDrvOutputs reads ["out"] (2.8) or {"outputs": ["out"],
// "dynamicOutputs": {}} (2.18 and later; dynamic outputs are not supported
// by this worker and are ignored).
func inputDrvOutputs(raw json.RawMessage) ([]string, error) {
	var outs []string
	if err := json.Unmarshal(raw, &outs); err == nil {
		return outs, nil
	}
	var obj struct {
		Outputs []string `json:"outputs"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	if obj.Outputs == nil {
		obj.Outputs = []string{}
	}
	return obj.Outputs, nil
}

// toOutput normalises an output to the 2.8 form: hashAlgo carries the
// method ("r:sha256" for NAR hashing, "text:sha256"), hash is base 16.
func (o derivationOutputJSON) toOutput() (DerivationOutput, error) {
	var out DerivationOutput
	if o.Path != nil {
		out.Path = fullStorePath(*o.Path)
	}
	hash, err := hashJSON(o.Hash)
	if err != nil {
		return out, err
	}
	algo := o.HashAlgo
	if algo == "" && strings.Contains(hash, "-") { // only in the SRI hash
		algo, _, _ = strings.Cut(hash, "-")
	}
	switch o.Method {
	case "nar":
		algo = "r:" + algo
	case "text":
		algo = "text:" + algo
	}
	out.HashAlgo = algo
	if hash == "" {
		return out, nil
	}
	var digest []byte
	if strings.ContainsAny(hash, "-:") {
		digest, err = decodeHash(hash)
	} else {
		digest, err = decodeDigest(algo[strings.LastIndex(algo, ":")+1:], hash)
	}
	if err != nil {
		return out, err
	}
	out.Hash = hex.EncodeToString(digest)
	return out, nil
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
