package storage

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// SecretSealer seals the secrets the database must hold but must not keep
// in the clear: caches' signing keys. The server passes its sealbox.Box
// (the --dial-key-file key); owner binds a sealed value to its row.
type SecretSealer interface {
	Seal(plaintext, owner []byte) []byte
	Open(sealed, owner []byte) ([]byte, error)
}

// sealedKeyPrefix marks a sealed signing key in caches.secret_key. A key
// name cannot contain a space, so no plaintext NAME:base64 key starts so.
const sealedKeyPrefix = "sealed "

// ErrSealedKey: a cache's signing key is sealed and this server has no
// key to open it with (or the wrong one).
var ErrSealedKey = errors.New("cache signing key is sealed")

// SealSecretsWith makes the database seal caches' signing keys with s from
// now on and open sealed ones with it. Call it once, before serving.
func (db *DB) SealSecretsWith(s SecretSealer) { db.sealer = s }

func signingKeyOwner(cacheID string) []byte { return []byte("cache-signing-key:" + cacheID) }

// storedSigningKey is the secret_key column's form of key: sealed when the
// database has a sealer, Nix's text form otherwise.
func (db *DB) storedSigningKey(cacheID string, key SigningKey) string {
	text := key.SecretKeyText()
	if db.sealer == nil {
		return text
	}
	return sealedKeyPrefix + base64.StdEncoding.EncodeToString(db.sealer.Seal([]byte(text), signingKeyOwner(cacheID)))
}

// openSigningKey reads a secret_key column value.
func (db *DB) openSigningKey(cacheID, stored string) (SigningKey, error) {
	encoded, sealed := strings.CutPrefix(stored, sealedKeyPrefix)
	if !sealed {
		return ParseSigningKey(stored)
	}
	if db.sealer == nil {
		return SigningKey{}, fmt.Errorf("%w (cache %s): start the server with the key file it was sealed with (--dial-key-file)", ErrSealedKey, cacheID)
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return SigningKey{}, fmt.Errorf("stored sealed signing key of cache %s: %w", cacheID, err)
	}
	text, err := db.sealer.Open(raw, signingKeyOwner(cacheID))
	if err != nil {
		return SigningKey{}, fmt.Errorf("%w (cache %s): it does not open with this server's --dial-key-file: %v", ErrSealedKey, cacheID, err)
	}
	return ParseSigningKey(string(text))
}

// SealStoredSigningKeys seals every signing key still stored in the clear
// (caches made before the server had a key file) and returns how many it
// sealed. It needs SealSecretsWith first.
func (db *DB) SealStoredSigningKeys(ctx context.Context) (int, error) {
	if db.sealer == nil {
		return 0, errors.New("seal signing keys: no sealer configured")
	}
	sealed := 0
	err := db.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id, secret_key FROM caches WHERE secret_key NOT LIKE $1`, sealedKeyPrefix+"%")
		type plain struct{ id, text string }
		found, err := collect(rows, err, func(r *sql.Rows) (plain, error) {
			var p plain
			return p, r.Scan(&p.id, &p.text)
		})
		if err != nil {
			return err
		}
		for _, p := range found {
			key, err := ParseSigningKey(p.text)
			if err != nil {
				return fmt.Errorf("signing key of cache %s: %w", p.id, err)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE caches SET secret_key = $1 WHERE id = $2`, db.storedSigningKey(p.id, key), p.id); err != nil {
				return err
			}
			sealed++
		}
		return nil
	})
	return sealed, err
}

// CountSealedSigningKeys is the number of caches whose signing key is
// sealed: a server without the key file cannot sign for them.
func (db *DB) CountSealedSigningKeys(ctx context.Context) (int, error) {
	var n int
	err := db.sql.QueryRowContext(ctx, `SELECT count(*) FROM caches WHERE secret_key LIKE $1`, sealedKeyPrefix+"%").Scan(&n)
	return n, err
}
