package s3store_test

import (
	"context"
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
