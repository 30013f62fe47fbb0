package sqldb

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

// CanonicalUUID validates s as a UUID (any version, either case) and
// returns its lowercase form, so lookups match however a worker spells it.
// what names the value in the ErrInvalid message.
func CanonicalUUID(what, s string) (string, error) {
	if len(s) != 36 {
		return "", Invalid("%s %q is not a UUID", what, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", Invalid("%s %q is not a UUID", what, s)
			}
		default:
			if !isHexDigit(c) {
				return "", Invalid("%s %q is not a UUID", what, s)
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

// NowMillis is the current time as a timestamp column value.
func NowMillis() int64 { return time.Now().UnixMilli() }

// FromMillis reads a timestamp column value.
func FromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// Names appear in URLs and admin commands, so they are slugs: 1-64
// characters of [A-Za-z0-9._-], starting with a letter or digit. A name
// must not read as a UUID: the API takes a name or an ID in the same
// place, so such a name would shadow (or be shadowed by) an ID.
const MaxNameLen = 64

// ValidName checks name by those rules; what ("team", "tenant") names it
// in the ErrInvalid message.
func ValidName(what, name string) error {
	if name == "" {
		return Invalid("%s name is empty", what)
	}
	if len(name) > MaxNameLen {
		return Invalid("%s name %q is longer than %d characters", what, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return Invalid("%s name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", what, name)
		}
	}
	if _, err := CanonicalUUID(what+" name", name); err == nil {
		return Invalid("%s name %q reads as a UUID, which would be taken for an ID", what, name)
	}
	return nil
}
