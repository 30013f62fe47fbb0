package zstdbound_test

import (
	"bytes"
	"io"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound"
	"gradient.dev/gradient/internal/zstdbound/zstdboundtest"
)

func decode(t *testing.T, frame []byte, opts ...zstd.DOption) ([]byte, error) {
	t.Helper()
	dec, err := zstd.NewReader(bytes.NewReader(frame), append([]zstd.DOption{zstd.WithDecoderConcurrency(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	return io.ReadAll(dec)
}

// The crafted frames are valid: an unbounded decoder reads their
// content, so a bounded one refusing them refuses only the window.
func TestCraftedFramesAreValid(t *testing.T) {
	content := bytes.Repeat([]byte("nar "), 100_000) // several blocks
	for _, log := range []uint{17, 20, 27} {
		got, err := decode(t, zstdboundtest.WithWindowLog(log, content), zstdbound.DecoderOptions()...)
		if err != nil || !bytes.Equal(got, content) {
			t.Errorf("window log %d: %d bytes, %v", log, len(got), err)
		}
	}
	got, err := decode(t, zstdboundtest.SingleSegment(uint64(len(content)), content), zstdbound.DecoderOptions()...)
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("single segment: %d bytes, %v", len(got), err)
	}
	// 256 MiB: more than MaxWindow, within the library's default (512 MiB).
	if got, err := decode(t, zstdboundtest.WithWindowLog(28, []byte("x"))); err != nil || string(got) != "x" {
		t.Errorf("unbounded decoder: %q, %v", got, err)
	}
}

func TestWindowsBeyondTheBoundAreRefused(t *testing.T) {
	frames := map[string][]byte{
		"256 MiB window":         zstdboundtest.WithWindowLog(28, []byte("x")),
		"2 GiB window":           zstdboundtest.WithWindowLog(31, []byte("x")),
		"2 TiB window":           zstdboundtest.WithWindowLog(41, []byte("x")),
		"3 GiB single segment":   zstdboundtest.SingleSegment(3<<30, []byte("x")),
		"129 MiB single segment": zstdboundtest.SingleSegment(zstdbound.MaxWindow+1<<20, []byte("x")),
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for name, frame := range frames {
		_, err := decode(t, frame, zstdbound.DecoderOptions()...)
		if !zstdbound.Exceeded(err) {
			t.Errorf("%s: %v, want the window refused", name, err)
		}
	}
	// Refused before the window is allocated (a library-default decoder
	// allocates and keeps 256 MiB for the first frame).
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 16<<20 {
		t.Errorf("refusing %d frames allocated %d MiB", len(frames), grown>>20)
	}
}
