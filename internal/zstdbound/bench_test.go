package zstdbound_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound"
)

// BenchmarkStreamDecode decodes a 16 MiB NAR-like stream (level 6, as
// narstore writes them) with a pooled-style reused decoder, with the
// library's defaults and with the bound: the bound costs nothing.
func BenchmarkStreamDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	plain := make([]byte, 16<<20)
	for i := range plain {
		plain[i] = byte(r.IntN(16))
	}
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(6)), zstd.WithEncoderConcurrency(1))
	zst := enc.EncodeAll(plain, nil)
	enc.Close()
	for _, c := range []struct {
		name string
		opts []zstd.DOption
	}{
		{"defaults", nil},
		{"bounded", zstdbound.DecoderOptions()},
	} {
		b.Run(c.name, func(b *testing.B) {
			dec, err := zstd.NewReader(nil, append(c.opts, zstd.WithDecoderConcurrency(1))...)
			if err != nil {
				b.Fatal(err)
			}
			defer dec.Close()
			b.SetBytes(int64(len(plain)))
			b.ReportAllocs()
			for b.Loop() {
				if err := dec.Reset(bytes.NewReader(zst)); err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, dec); err != nil || n != int64(len(plain)) {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}
