package worker

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gradient.dev/gradient/workersession"
)

// IDFileName is the worker ID's file under the base directory.
const IDFileName = "worker-id"

// LoadID returns the worker's persistent ID (docs/protocol/worker.md §2.2): fixed when
// given (it must be a UUID), else the content of <baseDir>/worker-id, which
// is created with a new UUIDv7 on first start. Invalid content is an error:
// silently replacing it would make the worker a stranger to its peers.
func LoadID(baseDir, fixed string) (string, error) {
	if fixed != "" {
		id := strings.TrimSpace(fixed)
		if !workersession.ValidUUID(id) {
			return "", fmt.Errorf("worker id %q is not a UUID", fixed)
		}
		return strings.ToLower(id), nil
	}
	path := filepath.Join(baseDir, IDFileName)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !workersession.ValidUUID(id) {
			return "", fmt.Errorf("%s holds %q, not a UUID: fix or delete it (deleting makes this a new worker)", path, truncate(id, 40))
		}
		return strings.ToLower(id), nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read worker id: %w", err)
	}
	id, err := NewUUIDv7()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(baseDir, 0o755); err != nil {
		return "", fmt.Errorf("create base directory: %w", err)
	}
	if err := writeFileAtomic(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("write worker id: %w", err)
	}
	return id, nil
}

// writeFileAtomic writes through a temporary file and a rename, so a crash
// never leaves a half-written ID behind.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// NewUUIDv7 returns a time-ordered UUID (RFC 9562 §5.7).
func NewUUIDv7() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		return "", fmt.Errorf("generate worker id: %w", err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(time.Now().UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return formatUUID(u), nil
}

func formatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
