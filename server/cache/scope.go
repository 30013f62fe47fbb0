package cache

import (
	"bytes"
	"fmt"
	"io"
	"slices"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storepath"
	"gradient.dev/gradient/wire"
)

// Which uploads a session may make (issue 14 §5): a worker may upload only
// what its own running job produces, into the caches of that job's
// project. A build job produces its derivation's outputs; a fetch or an
// evaluation produces paths that are not known before they are made, but
// Nix content-addresses every one of them (sources, locked inputs, .drv
// files, builtins.toFile), so such a path must certify itself: its CA
// field must give its store path, and the NAR must hash to the CA's
// digest. A worker without a job may write only the caches it is a cache
// peer of, whose owner registered it for them.

// WriteScope is where, and what, one upload or Push query may write.
type WriteScope struct {
	JobID  string
	Caches []storage.Cache
	// Job is what the held job produces; nil: no job is held, and the
	// caches are those the worker is a cache peer of, for any path.
	Job *JobProducts
}

// JobProducts is what a running job may upload, as the job loop knows it
// (authority.JobProducts without the project, which picked the caches).
type JobProducts struct {
	// What names the job in refusals ("build of /nix/store/…drv").
	What string
	// Outputs are a build job's output paths, known before it runs.
	Outputs []string
	// ContentAddressed: the job may also upload self-certifying paths,
	// whose content the cache checks against their CA field.
	ContentAddressed bool
}

// refusal is why path may not be uploaded at all, or "". It needs only
// the path, so it is decided before the grant.
func (s WriteScope) refusal(path string) string {
	switch {
	case s.Job == nil && len(s.Caches) == 0 && s.JobID == "":
		return fmt.Sprintf("no running job of this session produces %s: the upload names no job", path)
	case s.Job == nil && len(s.Caches) == 0:
		return fmt.Sprintf("no running job of this session produces %s: job %q is not running on this session", path, s.JobID)
	case len(s.Caches) == 0:
		return fmt.Sprintf("job %s may write no cache: its project has none, or this worker no longer serves it", s.JobID)
	case s.Job != nil && !slices.Contains(s.Job.Outputs, path) && !s.Job.ContentAddressed:
		return fmt.Sprintf("%s is not an output of job %s (%s)", path, s.JobID, s.Job.What)
	}
	return ""
}

// contentCheck is the check of an upload whose path must certify itself.
type contentCheck struct {
	ca storepath.ContentAddress
	// verifier hashes the NAR during the commit; nil when the NAR hash is
	// the CA's digest (recursive SHA-256), which the commit has anyway.
	verifier *storepath.Verifier
}

// certify returns the content check path needs, nil if it needs none (a
// build's output, a cache peer's upload), or why the path is refused.
// It checks the store path against the CA field now; the content is
// checked by contentCheck.verify once the NAR is read.
func (s WriteScope) certify(path string, meta *wire.NarUploadMetadata) (*contentCheck, error) {
	if s.Job == nil || slices.Contains(s.Job.Outputs, path) {
		return nil, nil
	}
	if meta.CA == nil {
		return nil, fmt.Errorf("%s is not content-addressed (no CA field), and job %s (%s) produces only content-addressed paths besides its outputs", path, s.JobID, s.Job.What)
	}
	ca, err := storepath.ParseCA(*meta.CA)
	if err != nil {
		return nil, err
	}
	if err := ca.CheckPath(path, meta.References); err != nil {
		return nil, err
	}
	check := &contentCheck{ca: ca}
	hash, _ := storepath.Hash(path)
	for _, r := range meta.References {
		if h, _ := storepath.Hash(r); h == hash {
			// Hashed modulo its own hash part (content-addressed
			// derivations' outputs); CheckPath refused other methods.
			check.verifier = storepath.NewSelfVerifier(ca, hash)
			return check, nil
		}
	}
	if ca.Method != storepath.Recursive || ca.Algo != "sha256" {
		check.verifier = storepath.NewVerifier(ca)
	}
	return check, nil
}

// inspect is what Commit streams the NAR to, if anything.
func (c *contentCheck) inspect() io.Writer {
	if c == nil || c.verifier == nil {
		return nil
	}
	return c.verifier
}

// verify compares the committed NAR with the content address.
func (c *contentCheck) verify(o narstore.Object) error {
	switch {
	case c == nil:
		return nil
	case c.verifier != nil:
		if err := c.verifier.Check(); err != nil {
			return fmt.Errorf("%w: %v", errUploadMismatch, err)
		}
	case !bytes.Equal(o.NarHash[:], c.ca.Digest):
		return fmt.Errorf("%w: the NAR hash is %s, the CA field says %s", errUploadMismatch, o.NarHashText(), c.ca)
	}
	return nil
}
