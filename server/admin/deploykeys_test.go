package admin_test

import (
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"golang.org/x/crypto/ssh"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/deploykeys"
)

func TestAdminDeployKeys(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, p, _ := e.Seed()
	path := servertest.ProjectPath("ops/web") + "/deploy-key"

	var key admin.DeployKeyView
	e.Must(200, "POST", path, nil, &key)
	if key.Project != "ops/web" || !strings.HasPrefix(key.PublicKey, "ssh-ed25519 ") || !strings.HasSuffix(key.PublicKey, " gradient-ops-web") {
		t.Fatalf("generated %+v", key)
	}
	pub, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(key.PublicKey))
	if err != nil || comment != "gradient-ops-web" {
		t.Fatalf("public key %q does not parse as an authorized_keys line: %v", key.PublicKey, err)
	}
	var shown admin.ProjectView
	e.Must(200, "GET", servertest.ProjectPath("ops/web"), nil, &shown)
	if shown.DeployKey != key.PublicKey {
		t.Fatalf("project shows deploy key %q, want %q", shown.DeployKey, key.PublicKey)
	}

	// The job loop opens the private half: an OpenSSH key of the public one.
	keys := deploykeys.New(e.DB, e.DialKey)
	private, err := keys.Private(t.Context(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(private), "-----BEGIN OPENSSH PRIVATE KEY-----") {
		t.Fatalf("private key is not in OpenSSH form: %.40q", private)
	}
	signer, err := ssh.ParsePrivateKey(private)
	if err != nil || string(signer.PublicKey().Marshal()) != string(pub.Marshal()) {
		t.Fatalf("private key does not match the public one: %v", err)
	}
	stored, err := e.DB.DeployKey(t.Context(), p.ID)
	if err != nil || strings.Contains(string(stored.PrivateSealed), "PRIVATE KEY") {
		t.Fatalf("stored key: %v; it must be sealed", err)
	}
	other, _ := sealbox.New(sealbox.NewKey())
	if _, err := deploykeys.New(e.DB, other).Private(t.Context(), p.ID); err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("opening with another server key: %v", err)
	}

	// Generating again rotates the key.
	var rotated admin.DeployKeyView
	e.Must(200, "POST", path, nil, &rotated)
	if rotated.PublicKey == key.PublicKey {
		t.Fatal("a second generation kept the key")
	}
	e.Must(204, "DELETE", path, nil, nil)
	e.Fails(404, "deploy key", "DELETE", path, nil)
	var after admin.ProjectView
	e.Must(200, "GET", servertest.ProjectPath("ops/web"), nil, &after)
	if after.DeployKey != "" {
		t.Fatalf("deleted deploy key still shown: %q", after.DeployKey)
	}
	if private, err := keys.Private(t.Context(), p.ID); err != nil || private != nil {
		t.Fatalf("private key of a project without one: %q, %v", private, err)
	}
	e.Fails(404, "", "POST", servertest.ProjectPath("ops/nosuch")+"/deploy-key", nil)
	if strings.Contains(e.Logs.String(), "PRIVATE KEY") {
		t.Error("a private key appears in the server log")
	}
}

func TestAdminDeployKeyNeedsSecretKey(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnvWith(t, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
	e.Seed()
	e.Fails(400, "--dial-key-file", "POST", servertest.ProjectPath("ops/web")+"/deploy-key", nil)
}
