package s3store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"gradient.dev/gradient/narstore"
)

// Create implements narstore.Store for relayed (Passthrough) uploads: the
// bytes are staged in a local file, checked at Commit and only then sent
// to the bucket under their key.
func (s *Store) Create(ctx context.Context) (narstore.Upload, error) {
	f, err := os.CreateTemp(s.cfg.StagingDir, ".s3relay-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("s3 store: staging: %w", err)
	}
	return &relayUpload{s: s, f: f}, nil
}

type relayUpload struct {
	s    *Store
	f    *os.File
	n    int64
	done bool
}

func (u *relayUpload) Write(p []byte) (int, error) {
	n, err := u.f.Write(p)
	u.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("s3 store: staging: %w", err)
	}
	return n, nil
}

func (u *relayUpload) Written() int64 { return u.n }

func (u *relayUpload) Commit(ctx context.Context, inspect io.Writer, verify func(narstore.Object) error) (narstore.Object, error) {
	if u.done {
		return narstore.Object{}, errors.New("s3 store: upload already finished")
	}
	defer u.Abort()
	obj, err := narstore.Sums(ctx, io.NewSectionReader(u.f, 0, u.n), inspect)
	if err != nil {
		return narstore.Object{}, err
	}
	if verify != nil {
		if err := verify(obj); err != nil {
			return narstore.Object{}, err
		}
	}
	if err := u.s.upload(ctx, obj.Key, u.f, obj.FileSize); err != nil {
		return narstore.Object{}, err
	}
	return obj, nil
}

func (u *relayUpload) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.f.Close()
	os.Remove(u.f.Name())
}
