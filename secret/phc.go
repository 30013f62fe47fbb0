package secret

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/argon2"
)

// phcArgon2 is a parsed $argon2id$v=19$m=..,t=..,p=..$salt$hash string.
type phcArgon2 struct {
	variant   string // "argon2id" or "argon2i"
	memoryKiB uint32
	time      uint32
	threads   uint8
	salt      []byte
	key       []byte
}

var errMalformedPHC = errors.New("malformed argon2 PHC string")

func parsePHC(s string) (phcArgon2, error) {
	// "", variant, "v=19", "m=..,t=..,p=..", salt, hash
	parts := strings.Split(s, "$")
	if len(parts) != 6 || parts[0] != "" {
		return phcArgon2{}, errMalformedPHC
	}
	var p phcArgon2
	p.variant = parts[1]
	if p.variant != "argon2id" && p.variant != "argon2i" {
		return phcArgon2{}, fmt.Errorf("%w: unsupported variant %q", errMalformedPHC, p.variant)
	}
	if parts[2] != "v="+strconv.Itoa(argon2.Version) {
		return phcArgon2{}, fmt.Errorf("%w: unsupported version %q", errMalformedPHC, parts[2])
	}
	if err := p.parseParams(parts[3]); err != nil {
		return phcArgon2{}, err
	}
	var err error
	if p.salt, err = phcBase64.DecodeString(parts[4]); err != nil || len(p.salt) < 8 {
		return phcArgon2{}, fmt.Errorf("%w: bad salt", errMalformedPHC)
	}
	if p.key, err = phcBase64.DecodeString(parts[5]); err != nil || len(p.key) < 16 || len(p.key) > maxKeyLen {
		return phcArgon2{}, fmt.Errorf("%w: bad hash", errMalformedPHC)
	}
	return p, nil
}

// parseParams reads "m=..,t=..,p=.." in that order, as every argon2
// implementation writes it.
func (p *phcArgon2) parseParams(s string) error {
	fields := strings.Split(s, ",")
	if len(fields) != 3 {
		return fmt.Errorf("%w: want m=,t=,p= parameters", errMalformedPHC)
	}
	values := make([]uint64, 3)
	for i, name := range []string{"m", "t", "p"} {
		v, ok := strings.CutPrefix(fields[i], name+"=")
		if !ok {
			return fmt.Errorf("%w: want parameter %s", errMalformedPHC, name)
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("%w: bad parameter %s", errMalformedPHC, name)
		}
		values[i] = n
	}
	if values[0] > maxMemoryKiB || values[1] > maxTime || values[2] > maxThreads {
		return fmt.Errorf("%w: parameters out of range", errMalformedPHC)
	}
	p.memoryKiB, p.time, p.threads = uint32(values[0]), uint32(values[1]), uint8(values[2])
	return nil
}

func verifyPHC(stored, token string) bool {
	p, err := parsePHC(stored)
	if err != nil {
		return false
	}
	keyLen := uint32(len(p.key))
	var got []byte
	if p.variant == "argon2id" {
		got = argon2.IDKey([]byte(token), p.salt, p.time, p.memoryKiB, p.threads, keyLen)
	} else {
		got = argon2.Key([]byte(token), p.salt, p.time, p.memoryKiB, p.threads, keyLen)
	}
	return subtle.ConstantTimeCompare(got, p.key) == 1
}
