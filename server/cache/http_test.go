package cache_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/server"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
)

// cacheEnv is a server with a NAR store and the admin API, over SQLite.
type cacheEnv struct {
	t     *testing.T
	db    *storage.DB
	srv   *server.Server
	store narstore.Store // cfg.NarStore
	url   string
	cache storage.Cache
}

func newCacheEnv(t testing.TB, cfg server.Config) *cacheEnv {
	t.Helper()
	db, err := storage.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "gradient.db"))
	if err != nil {
		t.Fatal(err)
	}
	return newCacheEnvOn(t, db, cfg)
}

// newCacheEnvOn is newCacheEnv on a given database, which it closes.
func newCacheEnvOn(t testing.TB, db *storage.DB, cfg server.Config) *cacheEnv {
	t.Helper()
	tt, _ := t.(*testing.T)  // nil in benchmarks, which never use it
	if cfg.NarStore == nil { // a test may bring its own (S3)
		store, err := narstore.OpenLocal(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.NarStore = store
	}
	logs := &testlog.Buffer{}
	if cfg.Logger == nil { // a benchmark may bring a quiet one
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.AdminTokenHash = servertest.SHA256Hex(servertest.AdminToken)
	srv := server.New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
		db.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	c, err := db.CreateCache(t.Context(), storage.NewCache{Name: "main", Public: true, KeyName: "gradient-test-main"})
	if err != nil {
		t.Fatal(err)
	}
	return &cacheEnv{t: tt, db: db, srv: srv, store: cfg.NarStore, url: hs.URL, cache: c}
}

// upload PUTs a NAR with its metadata through the admin API.
func (e *cacheEnv) upload(cache, storePath string, nar []byte, narHash string, narSize int, refs []string, deriver string) (int, []byte) {
	return e.uploadWith(cache, nar, map[string]string{admin.HeaderStorePath: storePath, admin.HeaderNarHash: narHash,
		admin.HeaderNarSize: strconv.Itoa(narSize), admin.HeaderReferences: strings.Join(refs, " "), admin.HeaderDeriver: deriver})
}

// uploadWith PUTs a NAR with the given X-Nix-* headers.
func (e *cacheEnv) uploadWith(cache string, nar []byte, headers map[string]string) (int, []byte) {
	req, _ := http.NewRequest("PUT", e.url+"/api/v1/caches/"+cache+"/paths", bytes.NewReader(nar))
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// nixStore is a Nix store in a test directory (a chroot store whose
// paths are still /nix/store/...) with an offline configuration.
type nixStore struct {
	t    *testing.T
	root string
	env  []string
}

// newNixStore makes a store; extra lines go into NIX_CONFIG.
func newNixStore(t *testing.T, extra ...string) *nixStore {
	t.Helper()
	if _, err := exec.LookPath("nix"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nix is not installed: .ci/run must install nix-bin")
		}
		t.Skip("nix is not installed (.ci/run installs nix-bin)")
	}
	dir := t.TempDir()
	conf := []string{
		"experimental-features = nix-command flakes",
		"substituters =",
		"flake-registry =",
		"sandbox = false",
		"build-users-group =",
		// A chroot store builds in a namespace: let /bin/sh in.
		"sandbox-paths = /bin /lib /lib64 /usr",
	}
	conf = append(conf, extra...)
	env := append(os.Environ(),
		"NIX_CONFIG="+strings.Join(conf, "\n"),
		"NIX_CONF_DIR="+filepath.Join(dir, "etc"), // no /etc/nix/nix.conf
		"NIX_USER_CONF_FILES=",
		"HOME="+filepath.Join(dir, "home"),
		"XDG_CACHE_HOME="+filepath.Join(dir, "cache"), // narinfo disk cache per test
	)
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	return &nixStore{t: t, root: filepath.Join(dir, "store"), env: env}
}

// run runs a nix command with --store pointing here, returning stdout.
func (s *nixStore) run(args ...string) (string, error) {
	cmd := exec.Command(args[0], append(args[1:], "--store", s.root)...)
	cmd.Env = s.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

func (s *nixStore) must(args ...string) string {
	s.t.Helper()
	out, err := s.run(args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// contents reads a regular-file store path's bytes from this store.
func (s *nixStore) contents(path string) string {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, path))
	if err != nil {
		s.t.Fatal(err)
	}
	return string(b)
}

const testDerivations = `rec {
  hello = builtins.derivation { name = "hello"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo hello > $out"]; };
  greet = builtins.derivation { name = "greet"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo ${hello} > $out"]; };
}`

// pathInfo is nix path-info --json's entry.
type pathInfo struct {
	Path       string   `json:"path"`
	NarHash    string   `json:"narHash"`
	NarSize    int      `json:"narSize"`
	References []string `json:"references"`
	Deriver    string   `json:"deriver"`
}

// buildAndPush builds the test derivations and pushes greet and hello.
func buildAndPush(t *testing.T, e *cacheEnv, src *nixStore, cache string) (hello, greet pathInfo) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "d.nix")
	os.WriteFile(file, []byte(testDerivations), 0o644)
	greetPath := strings.TrimSpace(src.must("nix-build", file, "-A", "greet", "--no-out-link"))
	var infos []pathInfo
	if err := json.Unmarshal([]byte(src.must("nix", "path-info", "--json", "--recursive", greetPath)), &infos); err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		nar := src.must("nix", "store", "dump-path", info.Path)
		if status, body := e.upload(cache, info.Path, []byte(nar), info.NarHash, info.NarSize, info.References, info.Deriver); status != http.StatusCreated {
			t.Fatalf("upload %s: %d %s", info.Path, status, body)
		}
		if strings.HasSuffix(info.Path, "-hello") {
			hello = info
		} else {
			greet = info
		}
	}
	if hello.Path == "" || greet.Path == "" {
		t.Fatalf("closure of greet: %+v", infos)
	}
	return hello, greet
}

func TestNixCopiesFromCacheWithSignatures(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	src := newNixStore(t)
	hello, greet := buildAndPush(t, e, src, "main")
	cacheURL := e.url + "/cache/main"
	trust := []string{"require-sigs = true", "trusted-public-keys = " + e.cache.PublicKey()}

	// (a) nix copy of the closure, signatures checked.
	dst := newNixStore(t, trust...)
	dst.must("nix", "copy", "--from", cacheURL, "--to", dst.root, greet.Path)
	if got, want := dst.contents(greet.Path), hello.Path+"\n"; got != want {
		t.Fatalf("copied greet holds %q, want %q", got, want)
	}
	if got := dst.contents(hello.Path); got != "hello\n" {
		t.Fatalf("copied hello holds %q", got)
	}
	info := dst.must("nix", "path-info", "--json", "--sigs", greet.Path)
	if !strings.Contains(info, "gradient-test-main:") {
		t.Fatalf("copied path lacks the cache's signature: %s", info)
	}

	// (b) the cache as a substituter.
	sub := newNixStore(t, append(trust, "substituters = "+cacheURL)...)
	sub.must("nix-store", "--realise", greet.Path)
	if got := sub.contents(hello.Path); got != "hello\n" {
		t.Fatalf("substituted hello holds %q", got)
	}

	// An untrusted key: Nix refuses the same narinfos.
	other, _ := storage.GenerateSigningKey("someone-else")
	untrusting := newNixStore(t, "require-sigs = true", "trusted-public-keys = "+other.PublicKeyText())
	if _, err := untrusting.run("nix", "copy", "--from", cacheURL, "--to", untrusting.root, greet.Path); err == nil {
		t.Fatal("nix copied paths signed by a key it does not trust")
	}
}

// (c) A narinfo changed after signing is refused.
func TestNixRefusesTamperedNarinfo(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	src := newNixStore(t)
	_, greet := buildAndPush(t, e, src, "main")
	dst := newNixStore(t, "require-sigs = true", "trusted-public-keys = "+e.cache.PublicKey())
	_, err := dst.run("nix", "copy", "--from", tamperingProxy(t, e.url)+"/cache/main", "--to", dst.root, greet.Path)
	if err == nil || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("nix copy of a tampered narinfo: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst.root, greet.Path)); err == nil {
		t.Fatal("the tampered path reached the store")
	}
}

// tamperingProxy serves target's responses with every narinfo's
// References dropped: the signed fingerprint no longer matches.
func tamperingProxy(t *testing.T, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, ".narinfo") || resp.StatusCode != http.StatusOK {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "References:") {
				out = append(out, line)
			}
		}
		tampered := []byte(strings.Join(out, "\n"))
		resp.Body = io.NopCloser(bytes.NewReader(tampered))
		resp.ContentLength = int64(len(tampered))
		resp.Header.Set("Content-Length", strconv.Itoa(len(tampered)))
		resp.Header.Del("ETag")
		return nil
	}
	hs := httptest.NewServer(proxy)
	t.Cleanup(hs.Close)
	return hs.URL
}

func TestUploadRefusesMismatchedNar(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	src := newNixStore(t)
	hello, _ := buildAndPush(t, e, src, "main")
	nar := []byte(src.must("nix", "store", "dump-path", hello.Path))
	const path = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-other"
	corrupt := bytes.Clone(nar)
	corrupt[len(corrupt)-20] ^= 1
	if status, body := e.upload("main", path, corrupt, hello.NarHash, hello.NarSize, nil, ""); status != http.StatusBadRequest || !strings.Contains(string(body), "hash") {
		t.Fatalf("corrupt NAR: %d %s", status, body)
	}
	if status, body := e.upload("main", path, nar, hello.NarHash, hello.NarSize+1, nil, ""); status != http.StatusBadRequest {
		t.Fatalf("wrong size: %d %s", status, body)
	}
	if _, err := e.db.CachePath(t.Context(), e.cache.ID, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr"); err == nil {
		t.Fatal("a refused upload was recorded")
	}
	keys, _ := e.store.(*narstore.Local).Keys()
	if len(keys) != 2 {
		t.Fatalf("objects %v: want only the two pushed paths", keys)
	}
	// The same path again is idempotent.
	if status, body := e.upload("main", hello.Path, nar, hello.NarHash, hello.NarSize, nil, ""); status != http.StatusOK || !strings.Contains(string(body), `"created": false`) {
		t.Fatalf("second upload: %d %s", status, body)
	}
}

// (d) Private caches. Nix 2.8 cannot send a custom Authorization header,
// but it sends netrc credentials as HTTP Basic, which the cache accepts.
func TestPrivateCache(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	private, err := e.db.CreateCache(t.Context(), storage.NewCache{Name: "secret", KeyName: "gradient-test-secret"})
	if err != nil {
		t.Fatal(err)
	}
	src := newNixStore(t)
	hello, _ := buildAndPush(t, e, src, "secret")
	_, key, err := e.db.CreateCacheKey(t.Context(), private.ID)
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := storage.StorePathHash(hello.Path)
	narinfoURL := e.url + "/cache/secret/" + hash + ".narinfo"
	get := func(url, auth string) int {
		req, _ := http.NewRequest("GET", url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	for _, c := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer GRADwrong", http.StatusUnauthorized},
		{"Bearer " + key, http.StatusOK},
		{key, http.StatusOK},
		{"Bearer " + strings.TrimPrefix(key, "GRAD"), http.StatusOK},
		{basic("anyone", key), http.StatusOK},
		{basic("anyone", "GRADwrong"), http.StatusUnauthorized},
	} {
		if got := get(narinfoURL, c.auth); got != c.want {
			t.Errorf("Authorization %.20q: %d, want %d", c.auth, got, c.want)
		}
	}
	if got := get(e.url+"/cache/secret/"+strings.Repeat("0", 32)+".narinfo", "Bearer "+key); got != http.StatusNotFound {
		t.Errorf("unknown path with a key: %d, want 404", got)
	}
	// The private cache's objects are not reachable through the public one.
	p, _ := e.db.CachePath(t.Context(), private.ID, hash)
	if got := get(e.url+"/cache/main/nar/"+p.ObjectKey+".nar.zst", ""); got != http.StatusNotFound {
		t.Errorf("private NAR through the public cache: %d, want 404", got)
	}

	// Nix with a netrc entry.
	netrc := filepath.Join(t.TempDir(), "netrc")
	os.WriteFile(netrc, []byte("machine 127.0.0.1 login gradient password "+key+"\n"), 0o600)
	trust := []string{"require-sigs = true", "trusted-public-keys = " + private.PublicKey()}
	dst := newNixStore(t, append(trust, "netrc-file = "+netrc)...)
	dst.must("nix", "copy", "--from", e.url+"/cache/secret", "--to", dst.root, hello.Path)
	if got := dst.contents(hello.Path); got != "hello\n" {
		t.Fatalf("copied hello holds %q", got)
	}
	without := newNixStore(t, trust...)
	if _, err := without.run("nix", "copy", "--from", e.url+"/cache/secret", "--to", without.root, hello.Path); err == nil {
		t.Fatal("nix copied from a private cache without credentials")
	}
}
