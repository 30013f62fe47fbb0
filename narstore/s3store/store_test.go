package s3store_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/narstore/storetest"
)

// open connects a store to a fresh versitygw, under a prefix so the tests
// also see that nothing escapes it.
func open(t *testing.T) (*s3store.Store, *s3test.Server, string) {
	t.Helper()
	srv := s3test.Start(t)
	staging := t.TempDir()
	cfg := s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region, Prefix: "gc/",
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: staging}
	s, err := s3store.Open(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv, staging
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		s, srv, staging := open(t)
		return storetest.Fixture{
			Store: s,
			Keys: func(t *testing.T) []string {
				keys, err := s.Keys(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				return keys
			},
			Leftovers: func(t *testing.T) []string {
				var left []string
				for _, k := range srv.Keys(t) {
					if !strings.HasPrefix(k, "gc/nars/") {
						left = append(left, k)
					}
				}
				entries, _ := os.ReadDir(staging)
				for _, e := range entries {
					left = append(left, "staging:"+e.Name())
				}
				return left
			},
		}
	})
}

// Virtual-host addressing (BUCKET.ENDPOINT/KEY), as AWS uses: the store and
// its presigned URLs name the bucket in the host.
func TestVirtualHostAddressing(t *testing.T) {
	srv := s3test.StartVirtualHost(t, "s3.test")
	client := srv.DialAnyHost()
	port := srv.Endpoint[strings.LastIndex(srv.Endpoint, ":"):]
	s, err := s3store.Open(context.Background(), s3store.Config{Endpoint: "http://s3.test" + port, Bucket: srv.Bucket, Region: srv.Region,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir()}, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	nar := storetest.Payload(1, 50<<10)
	obj, err := s.Put(context.Background(), bytes.NewReader(nar), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := storetest.ReadNAR(t, s, obj.Key); !bytes.Equal(got, nar) {
		t.Fatal("read back another NAR")
	}
	url, err := s.PresignGet(context.Background(), obj.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "http://"+srv.Bucket+".s3.test"+port+"/") {
		t.Fatalf("presigned URL %s does not name the bucket in the host", url)
	}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(body, storetest.Compressed(t, nar)) {
		t.Fatalf("presigned GET: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// With a presign endpoint, URLs name the store as workers reach it (here
// "localhost" where the server uses 127.0.0.1), and work there.
func TestPresignEndpoint(t *testing.T) {
	srv := s3test.Start(t)
	public := strings.Replace(srv.Endpoint, "127.0.0.1", "localhost", 1)
	s, err := s3store.Open(context.Background(), s3store.Config{Endpoint: srv.Endpoint, PresignEndpoint: public, Bucket: srv.Bucket,
		Region: srv.Region, PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Put(context.Background(), bytes.NewReader(storetest.Payload(1, 1000)), nil)
	if err != nil {
		t.Fatal(err)
	}
	url, _ := s.PresignGet(context.Background(), obj.Key)
	if !strings.HasPrefix(url, public+"/") {
		t.Fatalf("presigned URL %s does not use the presign endpoint %s", url, public)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET through the presign endpoint: %d", resp.StatusCode)
	}
}

// Staging files a crashed server left are removed when the store opens.
func TestOpenRemovesStagingLeftovers(t *testing.T) {
	srv := s3test.Start(t)
	staging := t.TempDir()
	for _, name := range []string{".s3put-1.tmp", ".s3relay-2.tmp", "keep.me"} {
		os.WriteFile(staging+"/"+name, []byte("x"), 0o600)
	}
	if _, err := s3store.Open(context.Background(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, PathStyle: true,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: staging}, nil, nil); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(staging)
	if len(entries) != 1 || entries[0].Name() != "keep.me" {
		t.Fatalf("staging dir holds %v, want only keep.me", entries)
	}
}
