package storage

import (
	"crypto/rand"
	"fmt"
	"strings"
	"time"
)

// IDs are UUIDs stored as their canonical lowercase text in a TEXT column,
// the one form both engines share; PostgreSQL's uuid type has no SQLite
// counterpart.

// NewID returns a random (version 4) UUID.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// canonicalUUID validates s as a UUID (any version, either case) and
// returns its lowercase form, so lookups match however a worker spells it.
func canonicalUUID(what, s string) (string, error) {
	if len(s) != 36 {
		return "", invalid("%s %q is not a UUID", what, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", invalid("%s %q is not a UUID", what, s)
			}
		default:
			if !isHexDigit(c) {
				return "", invalid("%s %q is not a UUID", what, s)
			}
		}
	}
	return strings.ToLower(s), nil
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// Timestamps are BIGINT unix milliseconds (UTC) in both engines: one
// portable type, sortable, and free of driver time-zone conversions.

func nowMillis() int64 { return time.Now().UnixMilli() }

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
