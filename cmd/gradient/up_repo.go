package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"gradient.dev/gradient/examples"
)

// resolveFlake turns the FLAKE argument into the repository URL and commit
// the evaluation fetches, and returns a label for people. Without FLAKE
// the example flake is committed into a repository in the data directory.
func (u *upRun) resolveFlake(ctx context.Context) (string, error) {
	flake := u.opts.flake
	if flake == "" {
		dir := filepath.Join(u.dataDir, "example-flake")
		commit, err := upCommitFiles(ctx, dir, map[string][]byte{"flake.nix": examples.FlakeNix})
		if err != nil {
			return "", fmt.Errorf("writing the example flake: %w", err)
		}
		u.repoURL, u.commit = dir, commit
		return "example", nil
	}
	if st, err := os.Stat(flake); err == nil && st.IsDir() {
		dir, err := filepath.Abs(flake)
		if err != nil {
			return "", err
		}
		commit, err := upGit(ctx, dir, "rev-parse", "--verify", "HEAD^{commit}")
		if err != nil {
			return "", fmt.Errorf("%s is not a git repository with a commit (gradient builds commits): %w", flake, err)
		}
		if status, err := upGit(ctx, dir, "status", "--porcelain", "--untracked-files=no"); err == nil && status != "" {
			fmt.Fprintf(u.stderr, "gradient up: %s has uncommitted changes; building the last commit\n", flake)
		}
		u.repoURL, u.commit = dir, commit
		return dir, nil
	}
	if !strings.Contains(flake, "://") && !strings.Contains(flake, "@") {
		return "", fmt.Errorf("flake %q is neither a local directory nor a git URL", flake)
	}
	out, err := upGit(ctx, "", "ls-remote", flake, "HEAD")
	if err != nil {
		return "", fmt.Errorf("finding the HEAD commit of %s: %w", flake, err)
	}
	fields := strings.Fields(out)
	if len(fields) == 0 {
		return "", fmt.Errorf("%s has no HEAD commit", flake)
	}
	u.repoURL, u.commit = flake, fields[0]
	return flake, nil
}

// upCommitFiles makes dir a git repository whose HEAD commit holds files
// (committing only when they changed) and returns that commit.
func upCommitFiles(ctx context.Context, dir string, files map[string][]byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		if _, err := upGit(ctx, dir, "init", "--quiet"); err != nil {
			return "", err
		}
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return "", err
		}
		if _, err := upGit(ctx, dir, "add", "--", name); err != nil {
			return "", err
		}
	}
	status, err := upGit(ctx, dir, "status", "--porcelain")
	if err != nil {
		return "", err
	}
	if status != "" {
		if _, err := upGit(ctx, dir, "commit", "--quiet", "--no-verify", "-m", "gradient up"); err != nil {
			return "", err
		}
	}
	return upGit(ctx, dir, "rev-parse", "HEAD")
}

// upGit runs git in dir ("" for none) with an identity of its own, so
// commits work on a machine where git was never configured.
func upGit(ctx context.Context, dir string, args ...string) (string, error) {
	full := []string{"-c", "user.name=gradient up", "-c", "user.email=up@gradient.invalid", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"}
	if dir != "" {
		full = append(full, "-C", dir)
	}
	cmd := exec.CommandContext(ctx, "git", append(full, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("git %s: %s", args[0], msg)
	}
	return strings.TrimSpace(stdout.String()), nil
}

// upProjectName derives a valid project name from a flake label.
func upProjectName(label string) string {
	base := strings.TrimSuffix(path.Base(strings.TrimRight(filepath.ToSlash(label), "/")), ".git")
	var b strings.Builder
	for _, c := range base {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			b.WriteRune(c)
		case b.Len() > 0 && (c == '.' || c == '_' || c == '-'):
			b.WriteRune(c)
		}
	}
	name := b.String()
	if name == "" {
		return "flake"
	}
	if len(name) > 60 {
		name = name[:60]
	}
	return name
}

func upShortID(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
