package gitsource

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestValidateRepositoryURL(t *testing.T) {
	for _, tc := range []struct {
		url        string
		remote     bool // accepted without allowLocal
		local      bool // accepted with allowLocal
		wantReason string
	}{
		{url: "https://github.com/wavelens/gradient", remote: true, local: true},
		{url: "https://x-access-token:abc@github.com/o/r.git", remote: true, local: true},
		{url: "git+https://example.com/o/r", remote: true, local: true},
		{url: "ssh://git@example.com:2222/o/r.git", remote: true, local: true},
		{url: "git+ssh://git@example.com/o/r", remote: true, local: true},
		{url: "git://example.com/r", remote: true, local: true},
		{url: "git@github.com:o/r.git", remote: true, local: true},
		{url: "example.com:r", remote: true, local: true},
		{url: "file:///srv/git/r", local: true, wantReason: "local repositories are not allowed"},
		{url: "git+file:///srv/git/r", local: true, wantReason: "local repositories are not allowed"},
		{url: "/srv/git/r", local: true, wantReason: "local path"},
		{url: "", wantReason: "empty"},
		{url: "--upload-pack=touch /tmp/x;false", wantReason: "starts with '-'"},
		{url: "-oProxyCommand=touch /tmp/x", wantReason: "starts with '-'"},
		{url: "-oProxyCommand=x", wantReason: "starts with '-'"},
		{url: "ext::sh -c touch% /tmp/x", wantReason: "space or control"},
		{url: "ext::sh", wantReason: "remote helper"},
		{url: "fd::0", wantReason: "remote helper"},
		{url: "fd::0,1", wantReason: "remote helper"},
		{url: "ext::ssh://x/y", wantReason: "remote helper"},
		{url: "ssh://-oProxyCommand=touch/x", wantReason: "host starts with '-'"},
		{url: "ssh://-oProxyCommand=x@host/r", wantReason: "user starts with '-'"},
		{url: "-x@host:r", wantReason: "starts with '-'"},
		{url: "https://-oProxyCommand=x:token@host/r", wantReason: "user starts with '-'"},
		{url: "git@-oProxyCommand=x:r", wantReason: "not a host name"},
		{url: "http://example.com/r", wantReason: `scheme "http" is not allowed`},
		{url: "ftp://example.com/r", wantReason: "not allowed"},
		{url: "https://", wantReason: "no host"},
		{url: "https://example.com", wantReason: "no repository path"},
		{url: "https://example.com/r\n", wantReason: "control character"},
		{url: "https://example.com/a b", wantReason: "space"},
		{url: "relative/dir", wantReason: "neither a URL"},
		{url: "./repo", wantReason: "neither a URL"},
		{url: "repo", wantReason: "neither a URL"},
		{url: "file://host/r", wantReason: "absolute path"},
		{url: "https://example.com/" + strings.Repeat("a", MaxURLLength), wantReason: "longer than"},
		{url: "https://example.com/\xff", wantReason: "not UTF-8"},
	} {
		for _, allowLocal := range []bool{false, true} {
			err := ValidateRepositoryURL(tc.url, allowLocal)
			want := tc.remote || allowLocal && tc.local
			if want && err != nil {
				t.Errorf("ValidateRepositoryURL(%q, local=%v) = %v, want accepted", tc.url, allowLocal, err)
			}
			if !want {
				if err == nil {
					t.Errorf("ValidateRepositoryURL(%q, local=%v) accepted it", tc.url, allowLocal)
					continue
				}
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantReason) {
					t.Errorf("ValidateRepositoryURL(%q, local=%v) = %v, want ErrInvalid saying %q", tc.url, allowLocal, err, tc.wantReason)
				}
			}
		}
	}
}

// A refusal does not repeat the credentials of the URL it refuses.
func TestRefusalsHideCredentials(t *testing.T) {
	for _, u := range []string{"http://user:s3cret@example.com/r", "https://s3cret@example.com/" + strings.Repeat("a", MaxURLLength), "ssh://git:s3cret@example.com"} {
		if err := ValidateRepositoryURL(u, false); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ValidateRepositoryURL(%q) = %v", u, err)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://token@github.com/o/r":       "https://xxxxx@github.com/o/r",
		"git+https://u:secret@host/r.git":    "git+https://xxxxx@host/r.git",
		"ssh://git:secret@host/r.git":        "ssh://git:xxxxx@host/r.git",
		"ssh://git@host/r.git":               "ssh://git@host/r.git",
		"/srv/git/repo":                      "/srv/git/repo",
		"https://github.com/example/project": "https://github.com/example/project",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateCommit(t *testing.T) {
	for _, ok := range []string{
		strings.Repeat("a", 40), strings.Repeat("0123456789abcdef", 4), "ABCDEF" + strings.Repeat("0", 34),
	} {
		if err := ValidateCommit(ok); err != nil {
			t.Errorf("ValidateCommit(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "abc1234", "--upload-pack=touch /tmp/x;false", strings.Repeat("a", 39), strings.Repeat("a", 41),
		strings.Repeat("g", 40), "HEAD", "main", strings.Repeat("a", 38) + "^{", strings.Repeat("a", 63) + "\n",
	} {
		if err := ValidateCommit(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateCommit(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestValidateBranch(t *testing.T) {
	for _, ok := range []string{"main", "release/1.2", "feature/x-y_z", "v1.0", "a.b", "ünïcode", "a@b", "x.lockfile"} {
		if err := ValidateBranch(ok); err != nil {
			t.Errorf("ValidateBranch(%q) = %v", ok, err)
		}
	}
	for bad, reason := range map[string]string{
		"":                       "empty",
		"--upload-pack=x":        "starts with '-'",
		"-b":                     "starts with '-'",
		"/main":                  "'/'",
		"main/":                  "'/'",
		"a//b":                   `"//"`,
		"a..b":                   `".."`,
		"a@{1}":                  `"@{"`,
		"@":                      "not a branch name",
		"HEAD":                   "not a branch name",
		"main.":                  "ends with '.'",
		"main.lock":              `".lock"`,
		"a.lock/b":               `".lock"`,
		".hidden":                "starts with '.'",
		"a/.b":                   "starts with '.'",
		"a b":                    "' '",
		"a\nb":                   `'\n'`,
		"a\x7fb":                 `'\x7f'`,
		"a~1":                    "'~'",
		"a^":                     "'^'",
		"a:b":                    "':'",
		"a?":                     "'?'",
		"a*":                     "'*'",
		"a[b":                    "'['",
		`a\b`:                    `'\\'`,
		"\xff":                   "UTF-8",
		strings.Repeat("a", 256): "longer than",
	} {
		err := ValidateBranch(bad)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), reason) {
			t.Errorf("ValidateBranch(%q) = %v, want ErrInvalid saying %s", bad, err, reason)
		}
	}
}

func TestConfigArgsAllowFileOnlyWhenLocal(t *testing.T) {
	remote := strings.Join(ConfigArgs(false), " ")
	if !strings.HasPrefix(remote, "-c protocol.allow=never ") || strings.Contains(remote, "protocol.file") {
		t.Errorf("ConfigArgs(false) = %s", remote)
	}
	if local := strings.Join(ConfigArgs(true), " "); !strings.Contains(local, "-c protocol.file.allow=always") {
		t.Errorf("ConfigArgs(true) = %s", local)
	}
}

// namesRemoteHelper is git's own test (transport.c): a scheme-like word
// right before "::".
func namesRemoteHelper(url string) bool {
	word, _, ok := strings.Cut(url, "::")
	return ok && regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`).MatchString(word)
}

// The validators never panic and never accept a string that git would
// read as an option or that could end a line.
func FuzzValidators(f *testing.F) {
	for _, s := range []string{"https://h/r", "git@h:r", "fd::0", "-x", "/p", "file:///p", "a..b", "main", "ssh://[::1]:22/r", "%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, allowLocal := range []bool{false, true} {
			if ValidateRepositoryURL(s, allowLocal) == nil {
				if strings.HasPrefix(s, "-") || strings.HasPrefix(Remote(s), "-") || strings.ContainsAny(s, " \n\r\x00") || namesRemoteHelper(Remote(s)) {
					t.Fatalf("accepted repository %q (local=%v)", s, allowLocal)
				}
				if !allowLocal && IsLocal(s) {
					t.Fatalf("accepted local repository %q without allowLocal", s)
				}
			}
		}
		if ValidateBranch(s) == nil && (strings.HasPrefix(s, "-") || strings.ContainsAny(s, " \n\x00:") || strings.Contains(s, "..")) {
			t.Fatalf("accepted branch %q", s)
		}
		if ValidateCommit(s) == nil && (len(s) != 40 && len(s) != 64 || strings.HasPrefix(s, "-")) {
			t.Fatalf("accepted commit %q", s)
		}
	})
}
