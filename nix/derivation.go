package nix

import (
	"context"
	"encoding/json"
	"fmt"
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

// Derivations parses several .drv files with one Nix call.
func (n *Nix) Derivations(ctx context.Context, drvPaths ...string) (map[string]*Derivation, error) {
	var drvs map[string]*Derivation
	if err := n.outputJSON(ctx, &drvs, "nix", append([]string{"show-derivation"}, drvPaths...)...); err != nil {
		return nil, err
	}
	for _, p := range drvPaths {
		d := drvs[p]
		if d == nil {
			return nil, fmt.Errorf("nix: show-derivation did not describe %s", p)
		}
		d.Path = p
	}
	return drvs, nil
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

// intAttr reads a number or numeric string; 0 when absent or malformed.
func (d *Derivation) intAttr(name string) int64 {
	v, _ := d.attr(name)
	switch v := v.(type) {
	case string:
		i, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return i
	case float64:
		return int64(v)
	}
	return 0
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

// TimeoutSecs is the `timeout` attribute, 0 when unset.
func (d *Derivation) TimeoutSecs() int64 { return d.intAttr("timeout") }

// MaxSilentSecs is the `maxSilent` attribute, 0 when unset.
func (d *Derivation) MaxSilentSecs() int64 { return d.intAttr("maxSilent") }

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
