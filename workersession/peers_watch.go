package workersession

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"time"
)

// watchPeersFile polls the peers file and calls changed with the new tokens
// whenever its content changes. Polling the content (a few hundred bytes)
// needs no inotify dependency and also sees a file replaced by a rename,
// as configuration managers do.
func watchPeersFile(ctx context.Context, file string, interval time.Duration, log *slog.Logger, changed func(map[string]string)) {
	last, lastErr := os.ReadFile(file)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := os.ReadFile(file)
		if (err == nil) == (lastErr == nil) && bytes.Equal(b, last) {
			continue
		}
		last, lastErr = b, err
		log.Info("peers file changed", "file", file)
		changed(LoadPeers(file, "", log))
	}
}
