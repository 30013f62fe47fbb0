package storepath

import (
	"errors"
	"strings"
	"testing"
)

const hash = "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr"

func TestParse(t *testing.T) {
	for _, ok := range []string{
		Dir + "/" + hash + "-hello-2.12",
		Dir + "/" + hash + "-a+b_c?d=e.drv",
		Dir + "/" + hash + "-" + strings.Repeat("x", MaxNameLen),
		Dir + "/" + hash + "-source",
	} {
		h, _, err := Parse(ok)
		if err != nil || h != hash {
			t.Errorf("Parse(%q) = %q, %v", ok, h, err)
		}
	}
	for path, reason := range map[string]string{
		Dir + "/" + hash + "-a b;c":                                "character ' '",
		Dir + "/" + hash + "-" + strings.Repeat("x", MaxNameLen+1): "212 characters",
		Dir + "/" + hash + "-.hidden":                              "starts with '.'",
		Dir + "/" + hash + "-":                                     "empty name",
		Dir + "/" + hash + "-x\nSig: fake":                         `character '\n'`,
		Dir + "/" + hash + "-x/y":                                  "character '/'",
		Dir + "/" + strings.Repeat("e", 32) + "-x":                 "not nix32",
		Dir + "/" + hash[:31] + "-x":                               "not a store path",
		"/gnu/store/" + hash + "-x":                                "not a store path under /nix/store",
		hash + "-x":                                                "not a store path under /nix/store",
	} {
		_, _, err := Parse(path)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), reason) {
			t.Errorf("Parse(%.60q) = %v, want an error about %q", path, err, reason)
		}
	}
}

func TestBaseAndHash(t *testing.T) {
	for _, in := range []string{hash + "-x", Dir + "/" + hash + "-x"} {
		if b, err := Base(in); b != hash+"-x" || err != nil {
			t.Errorf("Base(%q) = %q, %v", in, b, err)
		}
		if h, err := Hash(in); h != hash || err != nil {
			t.Errorf("Hash(%q) = %q, %v", in, h, err)
		}
	}
	for _, bad := range []string{hash + "-a b", "/tmp/" + hash + "-x", Dir + "/" + hash + "-x/bin"} {
		if _, err := Base(bad); err == nil {
			t.Errorf("Base(%q) accepted", bad)
		}
	}
}

func TestCheckCA(t *testing.T) {
	nix32 := strings.Repeat("0", 52)
	for _, ok := range []string{
		"fixed:sha256:" + nix32,
		"fixed:r:sha256:" + nix32,
		"text:sha256:" + nix32,
		"fixed:r:sha256:" + strings.Repeat("a", 64),
		"fixed:sha1:" + strings.Repeat("0", 32),
		"fixed:md5:" + strings.Repeat("0", 26),
		"fixed:sha512:" + strings.Repeat("A", 86) + "==",
	} {
		if err := CheckCA(ok); err != nil {
			t.Errorf("CheckCA(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{
		"garbage ca value: with Sig: fake",
		"",
		"fixed:sha256:" + nix32 + "\nSig: fake",
		"text:sha1:" + strings.Repeat("0", 32),
		"fixed:r:sha3:" + nix32,
		"fixed:sha256:" + nix32[:51],
		"fixed:sha256:" + strings.Repeat("e", 52),
		"fixed:r:r:sha256:" + nix32,
	} {
		if err := CheckCA(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckCA(%.40q) = %v, want refused", bad, err)
		}
	}
}
