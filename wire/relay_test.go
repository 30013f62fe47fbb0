package wire

import (
	"bytes"
	"testing"
)

// The proxy relays a frame unchanged only where both versions encode its
// variant alike (SameServerEncoding); check the answer against the codec.
func TestSameEncodingMatchesTheCodec(t *testing.T) {
	push := &NarPush{JobID: "j", StorePath: "/nix/store/x", Data: []byte("zstd"), Offset: 7, IsFinal: true}
	for a := Supported.Oldest; a <= Supported.Newest; a++ {
		for b := Supported.Oldest; b <= Supported.Newest; b++ {
			fa, err := AppendServerMessage(nil, push, a)
			if err != nil {
				t.Fatal(err)
			}
			fb, _ := AppendServerMessage(nil, push, b)
			tag, ok := FrameTag(fa)
			if !ok || tag != 14 {
				t.Fatalf("NarPush tag %d, %v", tag, ok)
			}
			if got := SameServerEncoding(tag, a, b); got != bytes.Equal(fa, fb) {
				t.Errorf("SameServerEncoding(NarPush, %d, %d) = %v, the codec's frames equal: %v", a, b, got, bytes.Equal(fa, fb))
			}
			if !SameClientEncoding(25, a, b) {
				t.Errorf("UploadChunk (25) differs between %d and %d", a, b)
			}
		}
	}
	// WorkerMetrics (client 5) gained a field in 33.
	if SameClientEncoding(5, 32, 33) {
		t.Error("WorkerMetrics encodes alike at 32 and 33")
	}
	if !SameClientEncoding(5, 32, 32) {
		t.Error("WorkerMetrics differs from itself at 32")
	}
	// Server tag 26 is Handover below 31 and ImportResult from 32.
	if SameServerEncoding(26, 30, 32) {
		t.Error("Handover and ImportResult encode alike")
	}
	if SameServerEncoding(14, 29, 30) || SameServerEncoding(14, 30, 34) || SameServerEncoding(999, 33, 33) {
		t.Error("an unsupported version or unknown tag encodes alike")
	}
	if _, ok := FrameTag(nil); ok {
		t.Error("an empty frame has a tag")
	}
}
