package nix

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"gradient.dev/gradient/nixbase32"
)

// storeDir is the logical store directory; chroot stores keep it.
const storeDir = "/nix/store"

// fullStorePath turns a base name (newer JSON formats drop the store
// directory) into a full store path; full paths are kept.
func fullStorePath(p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	return storeDir + "/" + p
}

// pathInfoJSON is one entry of `nix path-info --json` in any Nix version.
// Hashes and content addresses are strings up to format version 1 and
// objects in version 2.
type pathInfoJSON struct {
	Path             string          `json:"path"`
	NarHash          json.RawMessage `json:"narHash"`
	NarSize          int64           `json:"narSize"`
	References       []string        `json:"references"`
	Deriver          *string         `json:"deriver"`
	CA               json.RawMessage `json:"ca"`
	Signatures       json.RawMessage `json:"signatures"`
	RegistrationTime *int64          `json:"registrationTime"`
	Ultimate         bool            `json:"ultimate"`
	Valid            *bool           `json:"valid"`
}

// parsePathInfoJSON reads `nix path-info --json` from any Nix version:
//   - 2.8 to 2.18: an array of objects with "path", an invalid path as
//     {"path": …, "valid": false};
//   - 2.19 and later: an object keyed by store path, null for an invalid path;
//   - with --json-format 2: {"version": 2, "info": {…}} keyed by base name,
//     hashes and content addresses as objects.
//
// Paths come back in full (/nix/store/…); invalid paths have Valid false.
func parsePathInfoJSON(data []byte) ([]PathInfo, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("nix: empty path-info output")
	}
	var raws []pathInfoJSON
	var keys []string // path per raw entry when keyed
	var nulls []bool
	switch data[0] {
	case '[':
		if err := json.Unmarshal(data, &raws); err != nil {
			return nil, fmt.Errorf("nix: decoding path-info array: %w", err)
		}
		keys = make([]string, len(raws))
		nulls = make([]bool, len(raws))
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(data, &obj); err != nil {
			return nil, fmt.Errorf("nix: decoding path-info object: %w", err)
		}
		if info, ok := obj["info"]; ok && obj["version"] != nil {
			obj = nil // Unmarshal would merge into the outer keys
			if err := json.Unmarshal(info, &obj); err != nil {
				return nil, fmt.Errorf("nix: decoding path-info \"info\": %w", err)
			}
		}
		for key, raw := range obj {
			var r pathInfoJSON
			isNull := string(bytes.TrimSpace(raw)) == "null"
			if !isNull {
				if err := json.Unmarshal(raw, &r); err != nil {
					return nil, fmt.Errorf("nix: decoding path-info of %s: %w", key, err)
				}
			}
			raws, keys, nulls = append(raws, r), append(keys, key), append(nulls, isNull)
		}
	default:
		return nil, fmt.Errorf("nix: path-info output is neither a JSON array nor an object: %.40q", data)
	}

	infos := make([]PathInfo, 0, len(raws))
	for i, r := range raws {
		p := r.Path
		if p == "" {
			p = keys[i]
		}
		info := PathInfo{Path: fullStorePath(p), NarSize: r.NarSize, Ultimate: r.Ultimate}
		if info.Path == "" {
			return nil, fmt.Errorf("nix: path-info entry %d has no path", i)
		}
		if nulls[i] || (r.Valid != nil && !*r.Valid) {
			invalid := false
			info.Valid = &invalid
			infos = append(infos, info)
			continue
		}
		var err error
		if info.NarHash, err = hashJSON(r.NarHash); err != nil {
			return nil, fmt.Errorf("nix: path-info of %s: narHash: %w", info.Path, err)
		}
		if info.CA, err = caJSON(r.CA); err != nil {
			return nil, fmt.Errorf("nix: path-info of %s: ca: %w", info.Path, err)
		}
		info.References = make([]string, len(r.References))
		for j, ref := range r.References {
			info.References[j] = fullStorePath(ref)
		}
		if r.Deriver != nil {
			info.Deriver = fullStorePath(*r.Deriver)
		}
		if r.RegistrationTime != nil {
			info.RegistrationTime = *r.RegistrationTime
		}
		info.Signatures = signaturesJSON(r.Signatures)
		infos = append(infos, info)
	}
	return infos, nil
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

// caJSON reads a content address: a string up to format version 1, an
// object {"method": "nar"|"flat"|"text", "hash": …} in version 2, which is
// turned back into the string form (e.g. "fixed:r:sha256:<nix32>").
func caJSON(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var ca struct {
		Method string          `json:"method"`
		Hash   json.RawMessage `json:"hash"`
	}
	if err := json.Unmarshal(raw, &ca); err != nil {
		return "", err
	}
	sri, err := hashJSON(ca.Hash)
	if err != nil {
		return "", err
	}
	algo, _, _ := strings.Cut(sri, "-")
	digest, err := decodeHash(sri)
	if err != nil {
		return "", err
	}
	h := algo + ":" + nixbase32.Encode(digest)
	switch ca.Method {
	case "nar":
		return "fixed:r:" + h, nil
	case "flat":
		return "fixed:" + h, nil
	case "text":
		return "text:" + h, nil
	}
	return "", fmt.Errorf("unknown content-address method %q", ca.Method)
}

func signaturesJSON(raw json.RawMessage) []string {
	var sigs []string
	if json.Unmarshal(raw, &sigs) == nil {
		return sigs
	}
	return nil // a future structured form: signatures are optional here
}

// NarHashNix32 returns the NAR hash as sha256:<nix32> (the narinfo and
// Gradient cache form), whichever form Nix printed.
func (p PathInfo) NarHashNix32() (string, error) {
	if !strings.HasPrefix(p.NarHash, "sha256") {
		return "", fmt.Errorf("nix: NAR hash of %s is not SHA-256: %q", p.Path, p.NarHash)
	}
	digest, err := decodeHash(p.NarHash)
	if err != nil {
		return "", fmt.Errorf("nix: NAR hash of %s: %w", p.Path, err)
	}
	return "sha256:" + nixbase32.Encode(digest), nil
}

// decodeHash reads "<algo>-<base64>" (SRI) or "<algo>:<nix32|hex|base64>".
func decodeHash(s string) ([]byte, error) {
	i := strings.IndexAny(s, "-:")
	if i < 0 {
		return nil, fmt.Errorf("hash %q has no algorithm prefix", s)
	}
	algo, encoded := s[:i], s[i+1:]
	if s[i] == '-' {
		digest, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			return nil, fmt.Errorf("hash %q: %w", s, err)
		}
		if want := digestSize(algo); want == 0 || len(digest) != want {
			return nil, fmt.Errorf("hash %q has %d bytes", s, len(digest))
		}
		return digest, nil
	}
	return decodeDigest(algo, encoded)
}

// decodeDigest reads a digest in any of Nix's encodings, told apart by
// length as Nix does.
func decodeDigest(algo, encoded string) ([]byte, error) {
	size := digestSize(algo)
	if size == 0 {
		return nil, fmt.Errorf("unknown hash algorithm %q", algo)
	}
	var digest []byte
	var err error
	switch len(encoded) {
	case hex.EncodedLen(size):
		digest, err = hex.DecodeString(encoded)
	case nixbase32.EncodedLen(size):
		digest, err = nixbase32.Decode(encoded)
	case base64.StdEncoding.EncodedLen(size):
		digest, err = base64.StdEncoding.DecodeString(encoded)
	default:
		return nil, fmt.Errorf("%s hash %q has an unexpected length", algo, encoded)
	}
	if err != nil {
		return nil, fmt.Errorf("%s hash %q: %w", algo, encoded, err)
	}
	if len(digest) != size {
		return nil, fmt.Errorf("%s hash %q has %d bytes", algo, encoded, len(digest))
	}
	return digest, nil
}

func digestSize(algo string) int {
	switch algo {
	case "md5":
		return 16
	case "sha1":
		return 20
	case "sha256", "blake3":
		return 32
	case "sha512":
		return 64
	}
	return 0
}

// baseName is a store path's file name (what narinfo files list).
func baseName(p string) string { return path.Base(p) }
