// Package gitsource holds the rules for the git sources Gradient fetches:
// which repository URLs, commits and branch names are accepted, and the
// git options that restrict the transports git may use. Every string
// that reaches a git command line from a project, a job or a peer passes
// these checks first, on the server (API, branch poller) and on the
// worker alike: a string starting with "-" would be read as an option
// (`--upload-pack=…` runs a command), and a remote helper URL
// (`ext::sh -c …`) runs one by design.
package gitsource

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"
)

// MaxURLLength bounds a repository URL (a token in an https URL fits).
const MaxURLLength = 2048

// MaxBranchLength bounds a branch name (git's own limit is the file
// system's name length per component).
const MaxBranchLength = 255

// ErrInvalid wraps every refusal, so callers can map it to their error
// kind (HTTP 400, a permanent job failure) with errors.Is.
var ErrInvalid = errors.New("invalid git source")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// ValidateRepositoryURL accepts what git may fetch from: https://,
// ssh://, git:// and scp-like user@host:path URLs, each also in the
// flake style git+https:// etc.; file:// URLs and absolute local paths
// only when allowLocal (they let a project read any repository on the
// machine's disk). Remote helpers (<name>::…), other schemes, a leading
// "-", control characters and spaces are refused.
func ValidateRepositoryURL(raw string, allowLocal bool) error {
	shown := Redact(raw)
	switch {
	case raw == "":
		return invalid("repository URL is empty")
	case len(raw) > MaxURLLength:
		return invalid("repository URL is longer than %d bytes", MaxURLLength)
	case !utf8.ValidString(raw):
		return invalid("repository URL %q is not UTF-8", shown)
	case strings.HasPrefix(raw, "-"):
		return invalid("repository URL %q starts with '-'", shown)
	}
	for _, r := range raw {
		if r <= ' ' || r == 0x7f {
			return invalid("repository URL %q contains a space or control character", shown)
		}
	}
	remote := Remote(raw)
	if strings.HasPrefix(remote, "/") {
		if !allowLocal {
			return invalid("repository %q is a local path: local repositories are not allowed here", shown)
		}
		return nil
	}
	scheme, rest, isURL := strings.Cut(remote, "://")
	if !isURL {
		return validateSCPLike(shown, remote)
	}
	if strings.Contains(scheme, "::") {
		return invalid("repository URL %q names a git remote helper", shown)
	}
	switch strings.ToLower(scheme) {
	case "https", "ssh", "git":
	case "file":
		if !strings.HasPrefix(rest, "/") {
			return invalid("repository URL %q: a file:// URL needs an absolute path", shown)
		}
		if !allowLocal {
			return invalid("repository %q is a file:// URL: local repositories are not allowed here", shown)
		}
		return nil
	default:
		return invalid("repository URL %q: scheme %q is not allowed (use https, ssh or git)", shown, scheme)
	}
	u, err := url.Parse(remote)
	if err != nil {
		return invalid("repository URL %q does not parse: %v", shown, err)
	}
	if u.Host == "" || u.Hostname() == "" {
		return invalid("repository URL %q names no host", shown)
	}
	if strings.HasPrefix(u.Hostname(), "-") {
		return invalid("repository URL %q: the host starts with '-'", shown)
	}
	if u.User != nil && strings.HasPrefix(u.User.Username(), "-") {
		return invalid("repository URL %q: the user starts with '-'", shown)
	}
	if u.Path == "" || u.Path == "/" {
		return invalid("repository URL %q names no repository path", shown)
	}
	return nil
}

// validateSCPLike accepts [user@]host:path, git's short form of ssh://.
func validateSCPLike(shown, remote string) error {
	colon := strings.IndexByte(remote, ':')
	if colon < 0 || strings.IndexByte(remote[:colon], '/') >= 0 {
		// git reads "a/b:c" and "a" as local paths; only absolute ones
		// are allowed (above), relative ones depend on the working
		// directory.
		return invalid("repository %q is neither a URL (https://, ssh://, git://) nor user@host:path", shown)
	}
	userHost, path := remote[:colon], remote[colon+1:]
	if strings.HasPrefix(path, ":") {
		return invalid("repository URL %q names a git remote helper", shown)
	}
	if path == "" {
		return invalid("repository URL %q names no repository path", shown)
	}
	user, host, hasUser := strings.Cut(userHost, "@")
	if !hasUser {
		host, user = user, ""
	}
	if hasUser && !validSCPPart(user) {
		return invalid("repository URL %q: the user %q is not a plain name", shown, user)
	}
	if !validSCPPart(host) {
		return invalid("repository URL %q: the host %q is not a host name", shown, host)
	}
	return nil
}

// validSCPPart: a user or host name of letters, digits, '.', '_' and
// '-', not starting with '-' (ssh would read it as an option).
func validSCPPart(s string) bool {
	if s == "" || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Redact hides credentials in a repository URL for messages and logs: a
// password, and over HTTP(S) the user too (often a token).
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	switch strings.TrimPrefix(u.Scheme, "git+") {
	case "http", "https":
		u.User = url.User("xxxxx")
		return u.String()
	}
	return u.Redacted()
}

// Remote is the URL as git takes it: flake-style URLs lose their "git+"
// (git+https://… is https://… to git).
func Remote(raw string) string {
	return strings.TrimPrefix(strings.TrimSpace(raw), "git+")
}

// IsLocal reports whether a (valid) repository URL is on this machine's
// disk: a file:// URL or an absolute path.
func IsLocal(raw string) bool {
	remote := Remote(raw)
	return strings.HasPrefix(remote, "/") || strings.HasPrefix(strings.ToLower(remote), "file://")
}

// ValidateCommit accepts a full object id in hex: 40 digits (SHA-1) or
// 64 (SHA-256), either case. Abbreviations are refused: they are
// ambiguous, and anything else could be an option or a revision
// expression.
func ValidateCommit(s string) error {
	if len(s) != 40 && len(s) != 64 {
		return invalid("commit %q is not a full 40- or 64-digit hex object id", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return invalid("commit %q is not a full 40- or 64-digit hex object id", s)
		}
	}
	return nil
}

// ValidateBranch accepts a branch name by `git check-ref-format --branch`
// rules, bounded to MaxBranchLength bytes.
func ValidateBranch(s string) error {
	bad := func(why string) error { return invalid("branch %q: %s", s, why) }
	switch {
	case s == "":
		return invalid("branch is empty")
	case len(s) > MaxBranchLength:
		return invalid("branch is longer than %d bytes", MaxBranchLength)
	case !utf8.ValidString(s):
		return bad("not UTF-8")
	case s == "@" || s == "HEAD":
		return bad("not a branch name")
	case strings.HasPrefix(s, "-"):
		return bad("starts with '-'")
	case strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/"):
		return bad("starts or ends with '/'")
	case strings.HasSuffix(s, "."):
		return bad("ends with '.'")
	case strings.Contains(s, ".."):
		return bad(`contains ".."`)
	case strings.Contains(s, "@{"):
		return bad(`contains "@{"`)
	case strings.Contains(s, "//"):
		return bad(`contains "//"`)
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) {
			return bad(fmt.Sprintf("contains %q", r))
		}
	}
	for _, part := range strings.Split(s, "/") {
		if strings.HasPrefix(part, ".") {
			return bad("a component starts with '.'")
		}
		if strings.HasSuffix(part, ".lock") {
			return bad(`a component ends with ".lock"`)
		}
	}
	return nil
}

// ConfigArgs are the options to put right after "git" so that it speaks
// only https, ssh and git (and file when allowLocal): whatever a URL
// says, git's other transports and remote helpers (ext::, fd::) stay off.
func ConfigArgs(allowLocal bool) []string {
	args := []string{
		"-c", "protocol.allow=never",
		"-c", "protocol.https.allow=always",
		"-c", "protocol.ssh.allow=always",
		"-c", "protocol.git.allow=always",
	}
	if allowLocal {
		args = append(args, "-c", "protocol.file.allow=always")
	}
	return args
}
