package nix

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/nix/daemon"
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/storepath"
)

// What a pulled NAR may make valid in the store (docs/SECURITY.md, "What
// a server can make a worker's store hold"). The daemon is told not to
// check signatures (it knows only nix.conf's keys, not the worker's), so
// this is the only gate: a content-addressed path only when its name is
// the one its CA, name and references make and its content hashes to the
// CA (checked while it streams); an input-addressed path, whose name says
// nothing about its content, only when a trusted key signed its metadata.

// UntrustedPathError: an input-addressed path no trusted key signed. It
// was not added.
type UntrustedPathError struct {
	Path    string
	Signers []string // the key names its signatures claim
	Trusted []string // the trusted keys' names
}

func (e *UntrustedPathError) Error() string {
	signed := "it carries no signature"
	if len(e.Signers) > 0 {
		signed = "its signatures (" + strings.Join(e.Signers, ", ") + ") do not verify under a trusted key"
	}
	trusted := "none is configured"
	if len(e.Trusted) > 0 {
		trusted = "trusted: " + strings.Join(e.Trusted, ", ")
	}
	return fmt.Sprintf("nix: refusing to import %s: it is not content-addressed and %s (%s); "+
		"add the cache's public key to the worker's --trusted-public-keys", e.Path, signed, trusted)
}

// vouch decides whether it may become valid: nil, with the signatures
// to record in imp, or why not. For a content-addressed path it returns
// the verifier its NAR must pass.
func (n *Nix) vouch(ctx context.Context, it NarImport, imp *daemon.Import) (*storepath.Verifier, error) {
	keys := n.trustedKeys(ctx)
	fingerprint := narsig.Fingerprint(it.StorePath, "sha256:"+nixbase32.Encode(imp.NarHash), uint64(it.NarSize), it.References)
	imp.Signatures = keys.Verify(fingerprint, it.Signatures)
	if it.CA != "" {
		ca, err := storepath.ParseCA(it.CA)
		if err != nil {
			return nil, &NarMismatchError{Path: it.StorePath, Message: err.Error()}
		}
		if err := ca.CheckPath(it.StorePath, it.References); err != nil {
			return nil, &NarMismatchError{Path: it.StorePath, Message: err.Error()}
		}
		hash, _, _ := storepath.Parse(it.StorePath)
		for _, ref := range it.References {
			if h, err := storepath.Hash(ref); err == nil && h == hash {
				return storepath.NewSelfVerifier(ca, hash), nil
			}
		}
		if ca.Method == storepath.Recursive && ca.Algo == "sha256" {
			// The address is the NAR's hash, which the import checks
			// anyway: compare now, hash once.
			if !bytes.Equal(ca.Digest, imp.NarHash) {
				return nil, &NarMismatchError{Path: it.StorePath, Message: fmt.Sprintf(
					"content address %s, but the NAR hash announced is sha256:%s", ca, nixbase32.Encode(imp.NarHash))}
			}
			return nil, nil
		}
		return storepath.NewVerifier(ca), nil
	}
	if len(imp.Signatures) > 0 || n.ImportUnsigned {
		return nil, nil
	}
	return nil, &UntrustedPathError{Path: it.StorePath, Signers: narsig.SignerNames(it.Signatures), Trusted: keys.Names()}
}

// trustedKeys are TrustedKeys and the keys of Nix's own
// trusted-public-keys setting (what this host's Nix accepts from any
// substituter anyway), read once.
func (n *Nix) trustedKeys(ctx context.Context) *narsig.Keys {
	c := &n.configKeys
	c.once.Do(func() {
		// Not the caller's cancellation: one job's abort must not leave
		// the worker without the host's keys.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		c.keys = &narsig.Keys{}
		settings, err := n.showConfig(ctx)
		if err != nil {
			n.logger().Warn("nix: cannot read trusted-public-keys; only the worker's own keys vouch for pulled paths", "error", err)
			return
		}
		for _, text := range strings.Fields(settings["trusted-public-keys"]) {
			key, err := narsig.ParsePublicKey(text)
			if err != nil {
				n.logger().Warn("nix: skipping a trusted-public-keys entry", "error", err)
				continue
			}
			c.keys.Add(key)
		}
	})
	return narsig.Merge(n.TrustedKeys, c.keys)
}

// configKeysCache holds the keys of Nix's configuration (see trustedKeys).
type configKeysCache struct {
	once sync.Once
	keys *narsig.Keys
}
