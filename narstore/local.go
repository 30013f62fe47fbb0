package narstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Local stores objects as files: <dir>/nars/<2 key chars>/<rest>.nar.zst.
// A put writes <dir>/nars/.put-*.tmp, fsyncs it and renames it into place
// (the same filesystem, so the rename is atomic), so a crash never leaves
// a partial object under its name. The directory belongs to one server.
type Local struct {
	nars string
	// unnamed: staging files are unnamed and linked into place
	// (staging_linux.go), not named temporary files renamed.
	unnamed bool
}

const tempPattern = ".put-*.tmp"

// OpenLocal opens (creating it) the store under dir and removes temporary
// files a crashed put left behind.
func OpenLocal(dir string, log *slog.Logger) (*Local, error) {
	nars := filepath.Join(dir, "nars")
	if err := os.MkdirAll(nars, 0o750); err != nil {
		return nil, fmt.Errorf("nar store: %w", err)
	}
	leftovers, err := filepath.Glob(filepath.Join(nars, tempPattern))
	if err != nil {
		return nil, err
	}
	for _, name := range leftovers {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("nar store: remove leftover: %w", err)
		}
	}
	if len(leftovers) > 0 && log != nil {
		log.Info("nar store: removed unfinished uploads", "dir", nars, "count", len(leftovers))
	}
	return &Local{nars: nars, unnamed: probeUnnamed(nars)}, nil
}

// staged is an object's file before it is visible.
type staged struct {
	f     *os.File
	named bool // a temporary file in the store directory, else unnamed
}

// stage creates the file an object is written to before it is visible.
func (l *Local) stage() (staged, error) {
	if l.unnamed {
		f, err := createUnnamed(l.nars)
		if err == nil {
			return staged{f: f}, nil
		}
	}
	f, err := os.CreateTemp(l.nars, tempPattern)
	return staged{f: f, named: true}, err
}

// publish makes the fsynced file, still open, visible as final; the
// caller closes it and fsyncs final's directory after.
func (s staged) publish(final string) error {
	if s.named {
		return os.Rename(s.f.Name(), final)
	}
	return linkUnnamed(s.f, final)
}

// discard drops the staged file (after close, harmless).
func (s staged) discard() {
	s.f.Close()
	if s.named {
		os.Remove(s.f.Name())
	}
}

func (l *Local) path(key string) string {
	return filepath.Join(l.nars, key[:2], key[2:]+".nar.zst")
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, nar io.Reader, verify func(Object) error) (obj Object, err error) {
	tmp, err := l.stage()
	if err != nil {
		return Object{}, fmt.Errorf("nar store: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.discard()
		}
	}()
	if obj, err = Compress(ctx, tmp.f, nar); err != nil {
		return Object{}, err
	}
	if verify != nil {
		if err = verify(obj); err != nil {
			return Object{}, err
		}
	}
	if err = l.place(tmp, obj.Key); err != nil {
		return Object{}, fmt.Errorf("nar store: %w", err)
	}
	return obj, nil
}

// place makes a staged object durable under key: its bytes fsynced, then
// its name, then its directory fsynced, so a crash leaves either no
// object or a complete one. An existing object has the same bytes (same
// hash): replacing it, or keeping it, is harmless and keeps puts
// idempotent. The staged file is closed when place returns nil.
func (l *Local) place(tmp staged, key string) error {
	if err := tmp.f.Sync(); err != nil {
		return err
	}
	final := l.path(key)
	if err := os.MkdirAll(filepath.Dir(final), 0o750); err != nil {
		return err
	}
	if err := tmp.publish(final); err != nil {
		return err
	}
	if err := tmp.f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(final))
}

// syncDir makes a rename into dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Open implements Store. The reader is the *os.File, so an HTTP response
// can send it with sendfile.
func (l *Local) Open(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	if !validKey(key) {
		return nil, 0, ErrNotFound
	}
	f, err := os.Open(l.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("nar store: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("nar store: %w", err)
	}
	return f, st.Size(), nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, key string) error {
	if !validKey(key) {
		return ErrNotFound
	}
	err := os.Remove(l.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	return err
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if !validKey(key) {
		return ObjectInfo{}, ErrNotFound
	}
	st, err := os.Stat(l.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return ObjectInfo{}, ErrNotFound
	}
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("nar store: %w", err)
	}
	return ObjectInfo{Key: key, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Walk implements Store. Files that are not objects (staged uploads
// under other names) are skipped.
func (l *Local) Walk(ctx context.Context, fn func(ObjectInfo) error) error {
	return filepath.WalkDir(l.nars, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while walking
			}
			return err
		}
		if d.IsDir() {
			return ctx.Err()
		}
		rest, ok := strings.CutSuffix(d.Name(), ".nar.zst")
		key := filepath.Base(filepath.Dir(p)) + rest
		if !ok || !validKey(key) {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return fn(ObjectInfo{Key: key, Size: info.Size(), ModTime: info.ModTime()})
	})
}

// Keys lists the stored objects' keys (for tests and consistency checks).
func (l *Local) Keys() ([]string, error) {
	var keys []string
	err := filepath.WalkDir(l.nars, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rest, ok := strings.CutSuffix(d.Name(), ".nar.zst")
		if ok {
			keys = append(keys, filepath.Base(filepath.Dir(p))+rest)
		}
		return nil
	})
	return keys, err
}
