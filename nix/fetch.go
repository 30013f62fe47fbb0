package nix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gradient.dev/gradient/gitsource"
)

// FetchedFlake is a flake source brought into the store.
type FetchedFlake struct {
	// SourcePath is the store path of the flake's source tree; evaluate it
	// as "path:" + SourcePath.
	SourcePath string
	// InputPaths are the store paths of every locked input, transitively,
	// sorted; upload them along with SourcePath.
	InputPaths []string
}

// archivedFlake is the output of `nix flake archive --json`.
type archivedFlake struct {
	Path   string                   `json:"path"`
	Inputs map[string]archivedFlake `json:"inputs"`
}

// FetchOptions adjust a flake fetch.
type FetchOptions struct {
	// SSHKey is a private key for git over SSH (a project's deploy key,
	// from the server's Credential). It is written to a file only this
	// process can read, used for the fetch, and removed.
	SSHKey []byte
	// SSH is the ssh program ("" means ssh from PATH).
	SSH string
	// AllowLocal lets the repository be a file:// URL or a local path
	// (the worker operator's --allow-local-repositories); otherwise git
	// may use only https, ssh and git.
	AllowLocal bool
}

// FetchFlake clones repoURL, checks out commit, and copies the flake source
// and its locked inputs into the store (`nix flake archive`). The URL and
// commit are checked by the gitsource rules first (they come from the
// server, which the worker does not trust); a refusal wraps
// gitsource.ErrInvalid and runs nothing.
func (n *Nix) FetchFlake(ctx context.Context, repoURL, commit string, opts FetchOptions) (*FetchedFlake, error) {
	if err := gitsource.ValidateRepositoryURL(repoURL, opts.AllowLocal); err != nil {
		return nil, fmt.Errorf("nix: not fetching: %w", err)
	}
	if err := gitsource.ValidateCommit(commit); err != nil {
		return nil, fmt.Errorf("nix: not fetching: %w", err)
	}
	n.logger().Info("nix: fetching flake", "repo", gitsource.Redact(repoURL), "commit", commit, "ssh_key", len(opts.SSHKey) > 0)
	dir, err := os.MkdirTemp(n.WorkDir, "gradient-flake-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if len(opts.SSHKey) > 0 {
		keyFile := filepath.Join(dir, "ssh-key")
		if err := os.WriteFile(keyFile, opts.SSHKey, 0o600); err != nil {
			return nil, fmt.Errorf("nix: writing the SSH key: %w", err)
		}
		ssh := opts.SSH
		if ssh == "" {
			ssh = "ssh"
		}
		// git and Nix's git fetcher both honour GIT_SSH_COMMAND.
		ctx = withEnv(ctx, "GIT_SSH_COMMAND="+ssh+" -i "+keyFile+
			" -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
	}
	checkout := filepath.Join(dir, "checkout")
	if err := n.cloneAt(ctx, repoURL, commit, checkout, opts.AllowLocal); err != nil {
		return nil, err
	}
	if !opts.AllowLocal {
		// Nix reads local inputs itself, whatever git allows.
		if err := refuseLocalInputs(checkout); err != nil {
			return nil, fmt.Errorf("nix: not fetching the inputs of %s: %w", gitsource.Redact(repoURL), err)
		}
	}
	ref := (&url.URL{Scheme: "git+file", Path: checkout, RawQuery: "rev=" + url.QueryEscape(commit)}).String()
	return n.ArchiveFlake(ctx, ref)
}

// refuseLocalInputs refuses a flake whose lock file names an input on the
// machine's disk (a path input, a file:// URL): archiving it would copy
// whatever the worker can read into the store and on to the cache.
func refuseLocalInputs(checkout string) error {
	raw, err := os.ReadFile(filepath.Join(checkout, "flake.lock"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no locked inputs
	}
	if err != nil {
		return err
	}
	var lock struct {
		Nodes map[string]struct {
			Locked, Original map[string]any
		}
	}
	if err := json.Unmarshal(raw, &lock); err != nil {
		return fmt.Errorf("reading flake.lock: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(lock.Nodes)) {
		node := lock.Nodes[name]
		for _, attrs := range []map[string]any{node.Locked, node.Original} {
			typ, _ := attrs["type"].(string)
			u, _ := attrs["url"].(string)
			u = strings.TrimPrefix(u, "git+")
			if typ == "path" || strings.HasPrefix(u, "file:") || strings.HasPrefix(u, "/") {
				return fmt.Errorf("%w: flake input %q is local (%s %s): local repositories are not allowed here",
					gitsource.ErrInvalid, name, typ, u)
			}
		}
	}
	return nil
}

type envKey struct{}

// withEnv adds variables to the environment of the Nix and git commands
// run with ctx (per-call settings such as a fetch's SSH key).
func withEnv(ctx context.Context, env ...string) context.Context {
	prev, _ := ctx.Value(envKey{}).([]string)
	return context.WithValue(ctx, envKey{}, append(slices.Clone(prev), env...))
}

// ArchiveFlake copies a flake reference's source and locked inputs into the
// store.
func (n *Nix) ArchiveFlake(ctx context.Context, flakeRef string) (*FetchedFlake, error) {
	fetched, err := n.archive(ctx, flakeRef, false)
	if err != nil {
		return nil, err
	}
	n.logger().Info("nix: flake archived", "source", fetched.SourcePath, "inputs", len(fetched.InputPaths))
	return fetched, nil
}

// LockedInputPaths lists the store paths of a flake's locked inputs
// (transitively) without fetching them: Nix computes each from the lock
// file's narHash. A flake whose source is in the store but whose inputs
// are not can have them brought from elsewhere (a cache) before it is
// evaluated.
func (n *Nix) LockedInputPaths(ctx context.Context, flakeRef string) ([]string, error) {
	fetched, err := n.archive(ctx, flakeRef, true)
	if err != nil {
		return nil, err
	}
	return fetched.InputPaths, nil
}

// archive runs nix flake archive (with --dry-run: copies nothing).
func (n *Nix) archive(ctx context.Context, flakeRef string, dryRun bool) (*FetchedFlake, error) {
	args := []string{"flake", "archive", "--json"}
	if dryRun {
		args = append(args, "--dry-run")
	}
	var archived archivedFlake
	if err := n.outputJSON(ctx, &archived, "nix", append(args, flakeRef)...); err != nil {
		return nil, err
	}
	if archived.Path == "" {
		return nil, fmt.Errorf("nix: flake archive of %s named no source path", flakeRef)
	}
	fetched := &FetchedFlake{SourcePath: archived.Path}
	seen := map[string]bool{}
	var collect func(inputs map[string]archivedFlake)
	collect = func(inputs map[string]archivedFlake) {
		for _, in := range inputs {
			if in.Path != "" && !seen[in.Path] {
				seen[in.Path] = true
				fetched.InputPaths = append(fetched.InputPaths, in.Path)
			}
			collect(in.Inputs)
		}
	}
	collect(archived.Inputs)
	sort.Strings(fetched.InputPaths)
	return fetched, nil
}

// cloneAt makes dir a git checkout of repoURL at commit. The commit is
// fetched explicitly in case no branch reaches it (servers may refuse).
// Every git call speaks only the allowed transports, and every argument
// that came from outside follows --end-of-options.
func (n *Nix) cloneAt(ctx context.Context, repoURL, commit, dir string, allowLocal bool) error {
	git := func(args ...string) error {
		_, err := n.output(ctx, "git", append(gitsource.ConfigArgs(allowLocal), args...)...)
		return err
	}
	if err := git("clone", "--quiet", "--no-checkout", "--end-of-options", gitsource.Remote(repoURL), dir); err != nil {
		return fmt.Errorf("nix: cloning %s: %w", gitsource.Redact(repoURL), err)
	}
	if err := git("-C", dir, "cat-file", "-e", "--end-of-options", commit+"^{commit}"); err != nil {
		if err := git("-C", dir, "fetch", "--quiet", "--end-of-options", "origin", commit); err != nil {
			return fmt.Errorf("nix: fetching commit %s of %s: %w", commit, gitsource.Redact(repoURL), err)
		}
	}
	if err := git("-C", dir, "switch", "--quiet", "--detach", "--end-of-options", commit); err != nil {
		return fmt.Errorf("nix: checking out %s of %s: %w", commit, gitsource.Redact(repoURL), err)
	}
	return nil
}
