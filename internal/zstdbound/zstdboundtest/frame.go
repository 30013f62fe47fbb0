// Package zstdboundtest crafts zstd frames for tests of the decoders'
// bounds: valid frames whose header declares any window.
package zstdboundtest

import "encoding/binary"

// magic opens every zstd frame.
var magic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// WithWindowLog is a frame declaring a window of 1<<log bytes (10 ≤ log
// ≤ 41; at least 17 for content over 1 KiB, as its blocks are 128 KiB)
// holding content in raw blocks, without a checksum: a decoder that
// accepts the window decodes it to content.
func WithWindowLog(log uint, content []byte) []byte {
	if log < 10 || log > 41 {
		panic("zstdboundtest: window log out of range")
	}
	// Frame header descriptor 0: no content size, not single segment,
	// no checksum, no dictionary; the window descriptor follows.
	frame := append(append([]byte{}, magic...), 0, byte(log-10)<<3)
	return appendRawBlocks(frame, content)
}

// SingleSegment is a frame without a window descriptor whose declared
// content size (8 bytes) is its window, as the format defines for
// single-segment frames, holding content (shorter than declared: the
// decoder must refuse the window before it notices).
func SingleSegment(declared uint64, content []byte) []byte {
	frame := append(append([]byte{}, magic...), 0xe0) // 8-byte content size, single segment
	frame = binary.LittleEndian.AppendUint64(frame, declared)
	return appendRawBlocks(frame, content)
}

// maxBlock is the largest block the format allows.
const maxBlock = 128 << 10

func appendRawBlocks(frame, content []byte) []byte {
	for first := true; first || len(content) > 0; first = false {
		n := min(len(content), maxBlock)
		header := uint32(n) << 3 // block type 0: raw
		if n == len(content) {
			header |= 1 // last block
		}
		frame = append(frame, byte(header), byte(header>>8), byte(header>>16))
		frame = append(frame, content[:n]...)
		content = content[n:]
	}
	return frame
}
