package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/storage"
)

// The settings every server instance sharing a database must agree on,
// by the names the refusal shows (README "Several instances").
const (
	settingDialKey  = "dial key (--dial-key-file, which also seals the caches' signing keys and deploy keys)"
	settingNarStore = "NAR store (--nar-store with --nar-dir or the S3 endpoint, bucket and prefix)"
)

// configFingerprint hashes the settings that must agree: the dial key
// (the caches' signing keys are in the database, sealed under it) and
// where the NARs are. Only hashes leave the process: never the key.
func configFingerprint(opts options) (storage.ConfigFingerprint, error) {
	dial := "none"
	if opts.DialKeyFile != "" {
		content, err := os.ReadFile(opts.DialKeyFile)
		if err != nil {
			return nil, fmt.Errorf("dial key: %w", err)
		}
		key, err := sealbox.ParseKey(content)
		if err != nil {
			return nil, fmt.Errorf("dial key: %w", err)
		}
		dial = "key\x00" + string(key)
	}
	var nars string
	if dir := localNarDir(opts); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("nar store: %w", err)
		}
		nars = "local\x00" + abs
	} else {
		s3 := opts.S3
		nars = "s3\x00" + s3.Endpoint + "\x00" + s3.Region + "\x00" + s3.Bucket + "\x00" + s3.Prefix
	}
	return storage.ConfigFingerprint{
		settingDialKey:  fingerprintHash("dial key", dial),
		settingNarStore: fingerprintHash("nar store", nars),
	}, nil
}

// fingerprintHash is a setting's value hashed under its name.
func fingerprintHash(setting, value string) string {
	sum := sha256.Sum256([]byte("gradient instance fingerprint\x00" + setting + "\x00" + value))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// joinInstances registers this process among the server instances of the
// database, refusing a configuration that differs from theirs.
func joinInstances(ctx context.Context, db *storage.DB, opts options, log *slog.Logger) (*instance.Instance, error) {
	fp, err := configFingerprint(opts)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	inst, err := instance.Join(ctx, instance.Config{
		DB: db, ID: opts.InstanceID, Host: host, Addr: opts.Listen, Version: version(),
		Fingerprint: fp, AcceptConfigChange: opts.AcceptConfigChange,
		RenewEvery: opts.InstanceRenew, Lease: opts.InstanceLease, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("server instance: %w", err)
	}
	return inst, nil
}

// version is the module version the binary was built from ("(devel)" for
// a build from a checkout), for the instance row.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return info.Main.Version
	}
	return ""
}
