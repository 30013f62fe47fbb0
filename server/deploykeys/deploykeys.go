// Package deploykeys keeps projects' SSH deploy keys: an Ed25519 key pair
// the server generates per project. The operator adds the public half to
// the repository host; the private half is sealed at rest with the
// server's secret key (the one that seals dial tokens) and sent to the
// worker that fetches the project, in a Credential right before the
// AssignJob (docs/protocol/jobs.md §5.2), and used by the branch poller.
package deploykeys

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage"
)

// ErrNoSecretKey: the server has no key to seal deploy keys with.
var ErrNoSecretKey = fmt.Errorf("%w: the server has no secret key to seal deploy keys with: start it with --dial-key-file (GRADIENT_DIAL_KEY_FILE)", storage.ErrInvalid)

// deployKeyIdentity binds a sealed deploy key to its project, so a value
// copied to another project's row does not open.
func deployKeyIdentity(projectID string) []byte {
	return []byte("gradient deploy key\x00" + projectID)
}

// newDeployKey generates a key pair: the public key as an authorized_keys
// line ending in comment, the private key in OpenSSH's PEM form (what
// ssh -i reads).
func newDeployKey(comment string) (public string, private []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return "", nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", nil, err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " " + comment
	return line, pem.EncodeToMemory(block), nil
}

// Keys generates and opens the deploy keys a database holds.
type Keys struct {
	db  *storage.DB
	box *sealbox.Box
}

// New opens the keys db holds with box (the server's secret key); a nil
// box, like a nil *Keys, generates and opens none (ErrNoSecretKey).
func New(db *storage.DB, box *sealbox.Box) *Keys {
	return &Keys{db: db, box: box}
}

// Generate makes a new deploy key for the project, replacing any earlier
// one, and returns its public half.
func (k *Keys) Generate(ctx context.Context, p storage.Project, comment string) (string, error) {
	if k == nil || k.box == nil {
		return "", ErrNoSecretKey
	}
	public, private, err := newDeployKey(comment)
	if err != nil {
		return "", err
	}
	sealed := k.box.Seal(private, deployKeyIdentity(p.ID))
	clear(private)
	if err := k.db.SetDeployKey(ctx, p.ID, public, sealed); err != nil {
		return "", err
	}
	return public, nil
}

// Private returns the project's private deploy key, or nil when the
// project has none. A key sealed under another secret key is an error.
func (k *Keys) Private(ctx context.Context, projectID string) ([]byte, error) {
	if k == nil || k.box == nil {
		return nil, ErrNoSecretKey
	}
	key, err := k.db.DeployKey(ctx, projectID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	private, err := k.box.Open(key.PrivateSealed, deployKeyIdentity(projectID))
	if err != nil {
		return nil, fmt.Errorf("the deploy key of project %s does not open with this server's secret key (generate a new one): %w", projectID, err)
	}
	return private, nil
}
