package cache

import (
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// The renderer refuses a field with a line break even if one got past
// the checks (a row written by an older server, say).
func TestNarinfoRefusesLineBreaks(t *testing.T) {
	t.Parallel()
	db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.CreateCache(t.Context(), storage.NewCache{Name: "main", Public: true, KeyName: "gradient-test-main"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := db.CacheSigningKey(t.Context(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	p := storage.CachePath{StorePath: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", NarHash: "sha256:" + strings.Repeat("0", 52), NarSize: 1,
		FileHash: "sha256:" + strings.Repeat("0", 52), FileSize: 1, Compression: "zstd", ObjectKey: strings.Repeat("0", 52)}
	if _, err := renderNarinfo(p, key); err != nil {
		t.Fatalf("good narinfo: %v", err)
	}
	for name, spoil := range map[string]func(*storage.CachePath){
		"CA":         func(p *storage.CachePath) { p.CA = "fixed:sha256:x\nSig: fake" },
		"deriver":    func(p *storage.CachePath) { p.Deriver = "x\r\nSig: fake" },
		"references": func(p *storage.CachePath) { p.References = []string{"a", "b\nSig: fake"} },
		"store path": func(p *storage.CachePath) { p.StorePath += "\n" },
	} {
		bad := p
		spoil(&bad)
		if body, err := renderNarinfo(bad, key); err == nil {
			t.Errorf("%s with a line break rendered:\n%s", name, body)
		}
	}
}
