package s3store

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// However a Config is printed or logged, the secret stays out.
func TestConfigNeverShowsCredentials(t *testing.T) {
	c := Config{Endpoint: "https://s3.example.com", Bucket: "b", AccessKey: "AKIDEXAMPLE", SecretKey: "very-secret", SessionToken: "tok"}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("store", "config", c)
	for _, out := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), logged.String()} {
		if strings.Contains(out, "very-secret") || strings.Contains(out, "tok") || strings.Contains(out, "AKIDEXAMPLE") {
			t.Fatalf("credentials shown: %s", out)
		}
		if !strings.Contains(out, "bucket b") {
			t.Fatalf("the bucket is not named: %s", out)
		}
	}
}
