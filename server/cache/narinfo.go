package cache

import (
	"bytes"
	"fmt"
	"strings"

	"gradient.dev/gradient/storage"
)

// Fingerprint is what Nix signs and checks of a narinfo:
// 1;<store path>;<nar hash>;<nar size>;<full reference paths, sorted, comma-separated>.
// References are stored sorted, and full paths sort like base names.
func Fingerprint(p storage.CachePath) []byte {
	refs := make([]string, len(p.References))
	for i, r := range p.References {
		refs[i] = storage.StoreDir + "/" + r
	}
	return fmt.Appendf(nil, "1;%s;%s;%d;%s", p.StorePath, p.NarHash, p.NarSize, strings.Join(refs, ","))
}

// narURL is the narinfo's URL: relative to the cache root.
func narURL(p storage.CachePath) string {
	return "nar/" + p.ObjectKey + ".nar.zst"
}

// renderNarinfo writes the narinfo of docs/protocol/cache.md §7, signed with key. The
// fields were checked on upload; a line break in one is still refused
// here, as the last guard against a value adding a line of its own.
func renderNarinfo(p storage.CachePath, key storage.SigningKey) ([]byte, error) {
	fields := append([]string{p.StorePath, p.ObjectKey, p.Compression, p.FileHash, p.NarHash, p.Deriver, p.CA}, p.References...)
	for _, f := range fields {
		if strings.ContainsAny(f, "\r\n") {
			return nil, fmt.Errorf("narinfo of %q not rendered: a field holds a line break", p.StorePath)
		}
	}
	sig := key.Sign(Fingerprint(p))
	var b bytes.Buffer
	fmt.Fprintf(&b, "StorePath: %s\n", p.StorePath)
	fmt.Fprintf(&b, "URL: %s\n", narURL(p))
	fmt.Fprintf(&b, "Compression: %s\n", p.Compression)
	fmt.Fprintf(&b, "FileHash: %s\n", p.FileHash)
	fmt.Fprintf(&b, "FileSize: %d\n", p.FileSize)
	fmt.Fprintf(&b, "NarHash: %s\n", p.NarHash)
	fmt.Fprintf(&b, "NarSize: %d\n", p.NarSize)
	if len(p.References) > 0 {
		fmt.Fprintf(&b, "References: %s\n", strings.Join(p.References, " "))
	}
	if p.Deriver != "" {
		fmt.Fprintf(&b, "Deriver: %s\n", p.Deriver)
	}
	fmt.Fprintf(&b, "Sig: %s\n", sig)
	if p.CA != "" {
		fmt.Fprintf(&b, "CA: %s\n", p.CA)
	}
	return b.Bytes(), nil
}
