package narstore

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Staging files (the bytes of an object before its commit) are unnamed
// on Linux: open(O_TMPFILE) in the store directory, and linkat(2) into
// the object's directory once fsynced. Against a named temporary file
// renamed into place, that spares per object a directory entry created
// and removed in the one directory every upload shares, the rename, and
// the write of that directory an fsync of a newly named file makes on
// ext4. A crash leaves nothing named behind. Filesystems without
// O_TMPFILE get the named files (probeUnnamed).

// createUnnamed opens an unnamed file in dir.
func createUnnamed(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return nil, &os.PathError{Op: "open O_TMPFILE", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, "(unnamed)")), nil
}

// linkUnnamed gives f the name final. An object already there has the
// same key, so the same bytes: it stays.
func linkUnnamed(f *os.File, final string) error {
	// Through /proc, since linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH.
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, final, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return &os.LinkError{Op: "linkat", Old: f.Name(), New: final, Err: err}
	}
	return nil
}

// probeUnnamed reports whether dir's filesystem takes unnamed files and
// links them (and /proc is there to link them through).
func probeUnnamed(dir string) bool {
	f, err := createUnnamed(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	// Named like a temporary file, so a crash here leaves one OpenLocal
	// removes.
	probe := filepath.Join(dir, ".put-probe-"+strconv.Itoa(os.Getpid())+".tmp")
	os.Remove(probe)
	if err := linkUnnamed(f, probe); err != nil {
		return false
	}
	return os.Remove(probe) == nil
}
