package nix

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// The JSON that `nix show-derivation` (`nix derivation show` since 2.15)
// prints, read by tests as the oracle the ATerm parser is checked
// against, for 2.8 and the documented formats of newer Nix.

// showDerivations runs the CLI on drvPaths.
func (n *Nix) showDerivations(ctx context.Context, drvPaths ...string) (map[string]*Derivation, error) {
	v, err := n.Version(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"show-derivation"}
	if v.AtLeast(2, 15) {
		args = []string{"derivation", "show"}
	}
	out, err := n.output(ctx, "nix", append(args, drvPaths...)...)
	if err != nil {
		return nil, err
	}
	return parseDerivationsJSON(out)
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

// fullStorePath turns a base name (newer JSON formats drop the store
// directory) into a full store path; full paths are kept.
func fullStorePath(p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	return storeDir + "/" + p
}

// hashJSON reads a hash written as a string ("sha256-…", "sha256:…") or, in
// format version 2, as {"algorithm", "format", "hash"}; the result is a
// string in the form Nix printed, or SRI for the object form.
func hashJSON(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var h struct {
		Algorithm string `json:"algorithm"`
		Format    string `json:"format"`
		Hash      string `json:"hash"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", err
	}
	digest, err := decodeDigest(h.Algorithm, h.Hash)
	if err != nil {
		return "", err
	}
	return h.Algorithm + "-" + base64.StdEncoding.EncodeToString(digest), nil
}
