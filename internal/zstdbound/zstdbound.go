// Package zstdbound holds the limits of every zstd decoder that reads
// another party's bytes (a pulled NAR on the worker, an uploaded one on
// the server). A zstd frame header declares the window its decoder must
// keep; the decoder allocates it before the first block, so an unbounded
// decoder lets a few hostile bytes claim gigabytes.
package zstdbound

import (
	"errors"

	"github.com/klauspost/compress/zstd"
)

// MaxWindow is the largest window a frame may declare: 128 MiB, the
// default limit of the reference decoder (libzstd's
// ZSTD_WINDOWLOG_LIMIT_DEFAULT, window log 27), so every frame `zstd`
// decodes without --long or --memory passes. Our own encoder (level 6)
// and zstd -19 use at most 8 MiB; --long=27 is the largest window a
// producer gets without also raising its decoder's limit.
const MaxWindow = 128 << 20

// DecoderOptions bound a decoder's window and, for streams (which is
// what WithDecoderMaxMemory limits when not decoding to memory), the
// window a single-segment frame derives from its content size.
func DecoderOptions() []zstd.DOption {
	return []zstd.DOption{
		zstd.WithDecoderMaxWindow(MaxWindow),
		zstd.WithDecoderMaxMemory(MaxWindow),
	}
}

// Exceeded reports whether err is a decoder's refusal of a frame whose
// window is beyond the bound.
func Exceeded(err error) bool {
	return errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded)
}
