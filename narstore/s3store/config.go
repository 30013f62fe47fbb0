package s3store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// Config describes an S3-compatible bucket. Credentials are never logged:
// Config's String and LogValue leave them out.
type Config struct {
	// Endpoint is the store's base URL as the server reaches it
	// (https://s3.example.com). Empty means AWS for Region.
	Endpoint string
	// PresignEndpoint, if set, is the base URL put into presigned URLs, for
	// a store that workers reach under another name than the server does.
	PresignEndpoint string
	Bucket          string
	Region          string
	// Prefix is put before every key ("gradient/" keeps objects under
	// gradient/); a missing trailing slash is added.
	Prefix string
	// PathStyle addresses the bucket as <endpoint>/<bucket>/<key> instead
	// of <bucket>.<endpoint>/<key>.
	PathStyle bool

	AccessKey    string
	SecretKey    string
	SessionToken string

	// PartSize is the part size of multipart uploads, the server's own
	// and the presigned ones (default and minimum 64 MiB, the protocol's
	// floor for workers; tests lower it with MinPartSizeForTests).
	PartSize int64
	// PresignTTL is how long presigned URLs are valid (default 1 h).
	PresignTTL time.Duration
	// StagingDir keeps objects a server-side Put or a relayed upload
	// stages before they go to the bucket (default os.TempDir();
	// gradient-server uses <nar dir>/s3-staging). Open removes what a
	// crash left there.
	StagingDir string
}

// DefaultPartSize is the protocol's minimum multipart part size.
const DefaultPartSize = 64 << 20

// s3MinPart is S3's own lower bound for every part but the last.
const s3MinPart = 5 << 20

// String names the bucket without the credentials.
func (c Config) String() string {
	ep := c.Endpoint
	if ep == "" {
		ep = "aws"
	}
	return fmt.Sprintf("s3 %s bucket %s prefix %q region %s", ep, c.Bucket, c.Prefix, c.Region)
}

// GoString keeps %#v from printing the credentials too.
func (c Config) GoString() string { return c.String() }

// LogValue keeps slog from logging the credentials.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

func (c *Config) normalise() error {
	if c.Bucket == "" {
		return errors.New("s3 store: no bucket configured")
	}
	if c.Region == "" {
		c.Region = "us-east-1"
	}
	if c.Prefix != "" && !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	c.Prefix = strings.TrimPrefix(c.Prefix, "/")
	for _, ep := range []*string{&c.Endpoint, &c.PresignEndpoint} {
		if *ep == "" {
			continue
		}
		u, err := url.Parse(*ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("s3 store: endpoint %q is not an http(s) URL", *ep)
		}
		*ep = strings.TrimSuffix(*ep, "/")
	}
	if c.AccessKey == "" || c.SecretKey == "" {
		return errors.New("s3 store: no credentials (a credentials file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	}
	if c.PartSize == 0 {
		c.PartSize = DefaultPartSize
	}
	if c.PartSize < s3MinPart {
		return fmt.Errorf("s3 store: part size %d is below S3's 5 MiB", c.PartSize)
	}
	if c.PresignTTL <= 0 {
		c.PresignTTL = time.Hour
	}
	if c.StagingDir == "" {
		c.StagingDir = os.TempDir()
	}
	return nil
}

// CredentialsFromEnv fills empty credentials from the standard AWS
// variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
func (c *Config) CredentialsFromEnv(getenv func(string) string) {
	if c.AccessKey == "" && c.SecretKey == "" {
		c.AccessKey = getenv("AWS_ACCESS_KEY_ID")
		c.SecretKey = getenv("AWS_SECRET_ACCESS_KEY")
		c.SessionToken = getenv("AWS_SESSION_TOKEN")
	}
}

// LoadCredentialsFile reads credentials from a file in the AWS shared
// credentials form (the [default] section, or lines before any section):
//
//	aws_access_key_id = …
//	aws_secret_access_key = …
//	aws_session_token = …   (optional)
func (c *Config) LoadCredentialsFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("s3 store: credentials file: %w", err)
	}
	section := "default"
	sc := bufio.NewScanner(bytes.NewReader(data))
	var key, secret, token string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = strings.TrimSpace(line[1 : len(line)-1])
			continue
		}
		if section != "default" {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "aws_access_key_id":
			key = strings.TrimSpace(value)
		case "aws_secret_access_key":
			secret = strings.TrimSpace(value)
		case "aws_session_token":
			token = strings.TrimSpace(value)
		}
	}
	if key == "" || secret == "" {
		return fmt.Errorf("s3 store: credentials file %s has no aws_access_key_id and aws_secret_access_key in [default]", path)
	}
	c.AccessKey, c.SecretKey, c.SessionToken = key, secret, token
	return nil
}

// ParseURL reads the URL form of the configuration:
//
//	s3://BUCKET/PREFIX?endpoint=http://host:port&region=R&path-style=true
//
// Fields the URL leaves out keep their values in c.
func (c *Config) ParseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return fmt.Errorf("s3 store: %q is not s3://bucket[/prefix][?endpoint=…&region=…&path-style=…]", raw)
	}
	if u.User != nil {
		return errors.New("s3 store: put credentials in a credentials file or the AWS variables, not in the URL")
	}
	c.Bucket = u.Host
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		c.Prefix = p
	}
	q := u.Query()
	if v := q.Get("endpoint"); v != "" {
		c.Endpoint = v
	}
	if v := q.Get("presign-endpoint"); v != "" {
		c.PresignEndpoint = v
	}
	if v := q.Get("region"); v != "" {
		c.Region = v
	}
	if v := q.Get("path-style"); v != "" {
		c.PathStyle = v == "true" || v == "1"
	}
	return nil
}

// LocalOnlyWarning explains why workers on other machines could not use the
// presigned URLs when they name a loopback or link-local address, and is
// empty otherwise. Workers on the server's own host can, so it is a
// warning the operator sees, not an error.
func (c Config) LocalOnlyWarning() string {
	ep := c.PresignEndpoint
	if ep == "" {
		ep = c.Endpoint
	}
	if ep == "" {
		return ""
	}
	u, err := url.Parse(ep)
	if err != nil {
		return ""
	}
	host := u.Hostname()
	local := host == "localhost" || strings.HasSuffix(host, ".localhost")
	if ip := net.ParseIP(host); ip != nil {
		local = ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified()
	}
	if !local {
		return ""
	}
	return fmt.Sprintf("presigned URLs name %s, a loopback or link-local address: workers on other machines cannot reach it (set the presign endpoint to an address they can reach)", host)
}
