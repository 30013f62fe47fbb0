package worker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
)

// selfSignedCert writes a loopback certificate and key and returns their
// files and a pool trusting the certificate.
func selfSignedCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "worker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestServerDialedOverTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSignedCert(t)
	db := openSQLite(t)
	r, cfg, url := dialedWorkerSetup(t, db)
	// The server of dialedWorkerSetup trusts only the system roots: restart
	// it trusting the worker's certificate.
	r.stop()
	r.cfg.DialTLS = &tls.Config{RootCAs: pool}
	r.start("127.0.0.1:0")
	cfg.Session.InsecureListen = false
	cfg.Session.TLSCertFile, cfg.Session.TLSKeyFile = certFile, keyFile
	url = "wss" + strings.TrimPrefix(url, "ws")
	token := r.registerDialed(r.project.ID, cfg.Session.WorkerID, url)
	cfg.Session.ServerTokens = LoadServerTokens(writeAcceptedTokens(t, r.project.ID+":"+sha256Hex(token)), cfg.Session.WorkerID, cfg.Session.Logger)
	startWorker(t, cfg)
	waitfor.True(t, "the dialed TLS session", func() bool {
		st := r.srv.WorkerStatus(cfg.Session.WorkerID)
		return st.Live && st.DialedURL == url && slices.Equal(st.Projects, []string{r.project.ID})
	})
}
