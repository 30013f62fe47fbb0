// Package forgelink keeps projects' forge links: the credential (a token
// or a GitHub App's private key) and the webhook secret sealed at rest
// under the server's secret key (the one that seals dial tokens and
// deploy keys), opened for the webhook endpoints and the status poster,
// and one forge.Client per project kept while its link is unchanged (a
// GitHub App client caches its installation token).
package forgelink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/storage"
)

// ErrNoSecretKey: the server has no key to seal credentials with.
var ErrNoSecretKey = fmt.Errorf("%w: the server has no secret key to seal forge credentials with: start it with --dial-key-file (GRADIENT_DIAL_KEY_FILE)", storage.ErrInvalid)

// credentialIdentity and secretIdentity bind sealed values to their
// project and purpose, so a value copied to another row does not open.
func credentialIdentity(projectID string) []byte {
	return []byte("gradient forge credential\x00" + projectID)
}

func secretIdentity(projectID string) []byte {
	return []byte("gradient forge webhook secret\x00" + projectID)
}

// Settings is a project's link as the operator sets it.
type Settings struct {
	Link             forge.Link
	Trust            storage.ForgeTrust // "" is approve
	PerBuildStatuses bool
}

// Links seals, stores and opens forge links.
type Links struct {
	db  *storage.DB
	box *sealbox.Box
	hc  *http.Client

	mu      sync.Mutex
	clients map[string]cachedClient // by project ID; one per linked project
}

type cachedClient struct {
	updated time.Time
	client  forge.Client
}

// New opens the links db holds with box; a nil box stores and opens none
// (ErrNoSecretKey). hc is the forges' HTTP client (nil: one with a 30 s
// timeout).
func New(db *storage.DB, box *sealbox.Box, hc *http.Client) *Links {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Links{db: db, box: box, hc: hc, clients: map[string]cachedClient{}}
}

// StatusContext is the context of a project's evaluation status.
func StatusContext(projectName string) string { return "gradient/" + projectName }

// Set stores the project's link, keeping its webhook secret.
func (l *Links) Set(ctx context.Context, p storage.Project, s Settings) error {
	if l.box == nil {
		return ErrNoSecretKey
	}
	if err := s.Link.Validate(); err != nil {
		return fmt.Errorf("%w: %v", storage.ErrInvalid, err)
	}
	if s.Trust == "" {
		s.Trust = storage.ForgeTrustApprove
	}
	row := storage.ForgeLink{
		ProjectID: p.ID, Kind: string(s.Link.Kind), APIURL: s.Link.APIURL, Repository: s.Link.Repository,
		Trust: s.Trust, PerBuildStatuses: s.PerBuildStatuses, StatusContext: StatusContext(p.Name),
	}
	plain := []byte(s.Link.Token)
	if s.Link.App != nil {
		row.AppID, plain = s.Link.App.AppID, s.Link.App.PrivateKeyPEM
	}
	row.CredentialSealed = l.box.Seal(plain, credentialIdentity(p.ID))
	return l.db.SetForgeLink(ctx, row)
}

// Open returns the project's link with its credential opened.
func (l *Links) Open(ctx context.Context, projectID string) (forge.Link, storage.ForgeLink, error) {
	row, err := l.db.ForgeLink(ctx, projectID)
	if err != nil {
		return forge.Link{}, row, err
	}
	if l.box == nil {
		return forge.Link{}, row, ErrNoSecretKey
	}
	plain, err := l.box.Open(row.CredentialSealed, credentialIdentity(row.ProjectID))
	if err != nil {
		return forge.Link{}, row, fmt.Errorf("opening the forge credential of project %s: %w", projectID, err)
	}
	link := forge.Link{Kind: forge.Kind(row.Kind), APIURL: row.APIURL, Repository: row.Repository}
	if row.AppID > 0 {
		link.App = &forge.GitHubApp{AppID: row.AppID, PrivateKeyPEM: plain}
	} else {
		link.Token = string(plain)
	}
	return link, row, nil
}

// Client returns a client of the project's forge, the same one while the
// link is unchanged.
func (l *Links) Client(ctx context.Context, projectID string) (forge.Client, storage.ForgeLink, error) {
	link, row, err := l.Open(ctx, projectID)
	if err != nil {
		return nil, row, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.clients[row.ProjectID]; ok && c.updated.Equal(row.UpdatedAt) {
		return c.client, row, nil
	}
	client, err := forge.NewClient(link, l.hc)
	if err != nil {
		return nil, row, err
	}
	l.clients[row.ProjectID] = cachedClient{updated: row.UpdatedAt, client: client}
	return client, row, nil
}

// Remove deletes the project's link (its webhook secret and unposted
// statuses with it).
func (l *Links) Remove(ctx context.Context, projectID string) error {
	if err := l.db.DeleteForgeLink(ctx, projectID); err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.clients, strings.ToLower(projectID))
	l.mu.Unlock()
	return nil
}

// RotateWebhookSecret generates a new webhook secret for the project,
// stores it sealed and returns it (shown to the operator once).
func (l *Links) RotateWebhookSecret(ctx context.Context, projectID string) (string, error) {
	if l.box == nil {
		return "", ErrNoSecretKey
	}
	row, err := l.db.ForgeLink(ctx, projectID)
	if err != nil {
		return "", err
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	secret := hex.EncodeToString(raw)
	if err := l.db.SetForgeWebhookSecret(ctx, row.ProjectID, l.box.Seal([]byte(secret), secretIdentity(row.ProjectID))); err != nil {
		return "", err
	}
	return secret, nil
}

// WebhookSecret opens the project's webhook secret; nil when it has none.
func (l *Links) WebhookSecret(row storage.ForgeLink) ([]byte, error) {
	if len(row.WebhookSecretSealed) == 0 {
		return nil, nil
	}
	if l.box == nil {
		return nil, ErrNoSecretKey
	}
	return l.box.Open(row.WebhookSecretSealed, secretIdentity(row.ProjectID))
}
