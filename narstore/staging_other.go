//go:build !linux

package narstore

import (
	"errors"
	"os"
)

// Elsewhere staging files are named temporary files, renamed into place.

func createUnnamed(string) (*os.File, error) { return nil, errors.ErrUnsupported }

func linkUnnamed(*os.File, string) error { return errors.ErrUnsupported }

func probeUnnamed(string) bool { return false }
