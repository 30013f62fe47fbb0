package s3test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// An object written before a stop is still there after a restart on the
// same address: tests of a store that goes down rely on it.
func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	c := s.Client()
	body := []byte("hello s3")
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("a/b"), Body: bytes.NewReader(body)}); err != nil {
		t.Fatalf("put: %v\n%s", err, s.Log())
	}
	if got := s.Keys(t); !slices.Equal(got, []string{"a/b"}) {
		t.Fatalf("keys = %q", got)
	}
	s.Stop()
	if _, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.Bucket)}); err == nil {
		t.Fatal("a stopped server still answers")
	}
	s.Restart(t)
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("a/b")})
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	got, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if !bytes.Equal(got, body) {
		t.Fatalf("read %q, wrote %q", got, body)
	}
}

// A wrong secret is refused: the server checks signatures, so tests of
// presigned URLs prove something.
func TestWrongSecretRefused(t *testing.T) {
	s := Start(t)
	bad := &Server{Endpoint: s.Endpoint, Region: s.Region, AccessKey: s.AccessKey, SecretKey: "not-the-secret"}
	if _, err := bad.Client().HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: aws.String(s.Bucket)}); err == nil {
		t.Fatal("a wrong secret was accepted")
	}
}
