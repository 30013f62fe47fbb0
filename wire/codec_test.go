package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ptr[T any](v T) *T { return &v }

// Golden vectors of docs/protocol/wire.md §1.5 (from the reference's wire_bytes tests).
func TestGoldenVectors(t *testing.T) {
	metrics := &WorkerMetrics{CPUUsagePct: 1.5, RAMFreeMB: 128, DiskSpeedMbps: ptr[float32](-2.0)}
	cases := []struct {
		name     string
		msg      ClientMessage
		versions []uint16
		hex      string
	}{
		{"CacheQuery", &CacheQuery{JobID: "j", QueryID: "q", Paths: []string{"/a", "/b"}, Mode: QueryPull,
			NarSizes: []*uint64{nil, ptr[uint64](300)}, External: true}, []uint16{30, 31, 32, 33},
			"15016a017102022f61022f6201020001ac0201"},
		{"WorkerMetrics before 33", metrics, []uint16{30, 31, 32}, "050000c03f800101000000c00000"},
		{"WorkerMetrics at 33", metrics, []uint16{33}, "050000c03f800101000000c0000000"},
		{"WorkerMetrics with peaks", &WorkerMetrics{CPUUsagePct: 1.5, RAMFreeMB: 128, DiskSpeedMbps: ptr[float32](-2.0),
			BuildPeakRAMMB: &[]Pair[string, uint64]{{"abc", 512}}}, []uint16{33}, "050000c03f800101000000c000000101036162638004"},
		{"InitConnection", &InitConnection{ID: "w1"}, []uint16{31, 32, 33}, "00000000000000027731"},
	}
	for _, c := range cases {
		for _, ver := range c.versions {
			got, err := AppendClientMessage(nil, c.msg, ver)
			if err != nil {
				t.Fatalf("%s v%d: %v", c.name, ver, err)
			}
			if hex.EncodeToString(got) != c.hex {
				t.Errorf("%s v%d: encoded %x, want %s", c.name, ver, got, c.hex)
			}
			back, err := DecodeClientMessage(mustHex(t, c.hex), ver)
			if err != nil {
				t.Fatalf("%s v%d: decode: %v", c.name, ver, err)
			}
			again, _ := AppendClientMessage(nil, back, ver)
			if !bytes.Equal(again, got) {
				t.Errorf("%s v%d: decode+encode gave %x", c.name, ver, again)
			}
		}
	}
	// An older peer leaves the v33 field out: decoding fills nil.
	m, err := DecodeClientMessage(mustHex(t, "050000c03f800101000000c00000"), 32)
	if err != nil || m.(*WorkerMetrics).BuildPeakRAMMB != nil {
		t.Fatalf("v32 WorkerMetrics: %v %+v", err, m)
	}
}

func TestVersionFrameGolden(t *testing.T) {
	if got := hex.EncodeToString(VersionFrame(VersionRange{27, 27})); got != "475241441b001b00" {
		t.Errorf("27..=27 frame %s", got)
	}
	if got := hex.EncodeToString(VersionFrame(VersionRange{31, 33})); got != "475241441f002100" {
		t.Errorf("31..=33 frame %s", got)
	}
	if Supported.String() != "30..=33" {
		t.Errorf("supported range %s, want 30..=33", Supported)
	}
}

// Codec primitives, as the reference tests assert them (docs/protocol/session.md §10, 1–7).
func TestPrimitiveRoundTrips(t *testing.T) {
	e := encoder{ver: 33}
	e.uvarint(math.MaxUint64)
	e.uvarint(300)
	e.i64(-5)
	e.i64(math.MinInt64)
	e.f32(1.5)
	e.bool(true)
	e.str("grüße")
	e.bytes([]byte("nar"))
	d := decoder{buf: e.b, ver: 33}
	if v := d.u64(); v != math.MaxUint64 {
		t.Errorf("u64 max: %d", v)
	}
	if v := d.u16(); v != 300 {
		t.Errorf("u16 300: %d", v)
	}
	if v := d.i64(); v != -5 {
		t.Errorf("i64 -5: %d", v)
	}
	if v := d.i64(); v != math.MinInt64 {
		t.Errorf("i64 min: %d", v)
	}
	if v := d.f32(); v != 1.5 {
		t.Errorf("f32: %v", v)
	}
	if !d.bool() {
		t.Error("bool")
	}
	if v := d.str(); v != "grüße" {
		t.Errorf("str: %q", v)
	}
	if v := d.bytes(); string(v) != "nar" {
		t.Errorf("bytes: %q", v)
	}
	if d.err != nil || d.off != len(d.buf) {
		t.Fatalf("err %v off %d/%d", d.err, d.off, len(d.buf))
	}
}

func TestVarintEncoding(t *testing.T) {
	for v, want := range map[uint64]string{0: "00", 127: "7f", 128: "8001", 300: "ac02", math.MaxUint64: "ffffffffffffffffff01"} {
		e := encoder{}
		e.uvarint(v)
		if hex.EncodeToString(e.b) != want {
			t.Errorf("%d -> %x, want %s", v, e.b, want)
		}
	}
	for v, want := range map[int64]string{0: "00", -1: "01", 1: "02", -5: "09", math.MinInt64: "ffffffffffffffffff01"} {
		e := encoder{}
		e.i64(v)
		if hex.EncodeToString(e.b) != want {
			t.Errorf("zigzag %d -> %x, want %s", v, e.b, want)
		}
	}
	// Non-minimal forms are accepted.
	d := decoder{buf: mustHex(t, "8000")}
	if v := d.u64(); v != 0 || d.err != nil {
		t.Errorf("80 00 -> %d %v", v, d.err)
	}
}

func decodeErr(t *testing.T, frame string, ver uint16, server bool) error {
	t.Helper()
	var err error
	if server {
		_, err = DecodeServerMessage(mustHex(t, frame), ver)
	} else {
		_, err = DecodeClientMessage(mustHex(t, frame), ver)
	}
	if err == nil {
		t.Fatalf("frame %s decoded without error", frame)
	}
	return err
}

// Every decode error kind of docs/protocol/wire.md §1.4, with its text.
func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		frame  string
		ver    uint16
		server bool
		kind   DecodeErrorKind
		text   string
	}{
		{"", 33, false, Truncated, "frame ended early"},
		{"0000000000000002", 33, false, Truncated, "frame ended early"},      // id shorter than its length
		{"0200", 33, false, TrailingBytes, "1 bytes left after the message"}, // ReauthRequest + junk
		{"13ffffffffffffffffff02", 33, false, VarintOverflow, "varint longer than 64 bits"},
		{"13ffffffffffffffffff81", 33, false, VarintOverflow, "varint longer than 64 bits"},
		{"0380a80400", 33, false, OutOfRange, "value out of range for u16"},       // Reject code 70000
		{"0f00808080801000", 33, false, OutOfRange, "value out of range for u32"}, // LogChunk task_index 2^32
		{"00020000000000027731", 33, false, InvalidBool, "invalid bool byte 2"},   // capability flag
		{"08016a0002", 33, false, InvalidBool, "invalid bool byte 2"},             // option tag
		{"000101ff", 33, true, InvalidUTF8, "invalid UTF-8"},                      // AuthChallenge peer "\xff"
		{"1d", 33, false, UnknownVariant, "unknown variant 29 of ClientMessage at protocol 33"},
		{"1c00000100", 31, false, UnknownVariant, "unknown variant 28 of ClientMessage at protocol 31"},
		{"1a0000", 31, true, UnknownVariant, "unknown variant 26 of ServerMessage at protocol 31"},
		{"1303", 33, false, UnknownVariant, "unknown variant 3 of JobKind at protocol 33"},
		{"00ffffffff0f", 33, true, Truncated, "frame ended early"}, // a huge count with nothing behind it
	}
	for _, c := range cases {
		err := decodeErr(t, c.frame, c.ver, c.server)
		var de *DecodeError
		if !errors.As(err, &de) || de.Kind != c.kind {
			t.Errorf("%s: got %v, want kind %d", c.frame, err, c.kind)
			continue
		}
		if err.Error() != c.text {
			t.Errorf("%s: text %q, want %q", c.frame, err.Error(), c.text)
		}
		if !errors.Is(err, &DecodeError{Kind: c.kind}) {
			t.Errorf("%s: errors.Is does not match the kind", c.frame)
		}
	}
}

// Tags 28 (client) and 26 (server) mean different variants per version
// (docs/protocol/wire.md §7.3).
func TestReusedTags(t *testing.T) {
	m, err := DecodeClientMessage([]byte{28}, 30)
	if _, ok := m.(*HandoverDone); !ok || err != nil {
		t.Fatalf("client 28 at 30: %T %v", m, err)
	}
	m, err = DecodeClientMessage(mustHex(t, "1c0161016200"), 32)
	if r, ok := m.(*ImportRequest); !ok || err != nil || r.JobID != "a" || r.RequestID != "b" {
		t.Fatalf("client 28 at 32: %#v %v", m, err)
	}
	s, err := DecodeServerMessage(mustHex(t, "1a026877"), 30)
	if h, ok := s.(*Handover); !ok || err != nil || h.ID != "hw" {
		t.Fatalf("server 26 at 30: %#v %v", s, err)
	}
	s, err = DecodeServerMessage(mustHex(t, "1a0161016200"), 33)
	if r, ok := s.(*ImportResult); !ok || err != nil {
		t.Fatalf("server 26 at 33: %#v %v", s, err)
	} else if _, ok := r.Outcome.(*ImportCompleted); !ok {
		t.Fatalf("outcome %#v", r.Outcome)
	}
}

func TestEncodeErrors(t *testing.T) {
	_, err := AppendClientMessage(nil, &ImportRequest{JobID: "j"}, 31)
	var newer *NewerThanPeerError
	if !errors.As(err, &newer) || err.Error() != "ImportRequest exists since protocol 32, the peer speaks 31" {
		t.Errorf("ImportRequest at 31: %v", err)
	}
	_, err = AppendServerMessage(nil, &ImportResult{Outcome: &ImportCompleted{}}, 30)
	if err == nil || err.Error() != "ImportResult exists since protocol 32, the peer speaks 30" {
		t.Errorf("ImportResult at 30: %v", err)
	}
	_, err = AppendServerMessage(nil, &Handover{ID: "x"}, 32)
	if err == nil || err.Error() != "Handover was removed in protocol 31, the peer speaks 32" {
		t.Errorf("Handover at 32: %v", err)
	}
	if b, err := AppendClientMessage(nil, &HandoverDone{}, 30); err != nil || !bytes.Equal(b, []byte{28}) {
		t.Errorf("HandoverDone at 30: %x %v", b, err)
	}
	dst := []byte("keep")
	out, err := AppendClientMessage(dst, &JobUpdate{JobID: "j"}, 33) // nil Update
	var inv *InvalidValueError
	if !errors.As(err, &inv) || string(out) != "keep" {
		t.Errorf("nil enum: %v, dst %q", err, out)
	}
	_, err = AppendClientMessage(nil, &RequestJob{Kind: 7}, 33)
	if !errors.As(err, &inv) || !strings.Contains(err.Error(), "JobKind") {
		t.Errorf("bad unit value: %v", err)
	}
	_, err = AppendClientMessage(nil, nil, 33)
	if !errors.As(err, &inv) {
		t.Errorf("nil message: %v", err)
	}
	_, err = AppendServerMessage(nil, &AssignJob{Job: (*BuildJob)(nil)}, 33)
	if !errors.As(err, &inv) {
		t.Errorf("nil pointer variant: %v", err)
	}
}

// Decoded byte fields are slices of the frame, never copies.
func TestZeroCopyBytes(t *testing.T) {
	payload := bytes.Repeat([]byte{0xab}, 4096)
	frame, err := AppendServerMessage(nil, &NarPush{JobID: "j", StorePath: "/nix/store/x", Data: payload, IsFinal: true}, 33)
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeServerMessage(frame, 33)
	if err != nil {
		t.Fatal(err)
	}
	data := m.(*NarPush).Data
	start := uintptr(unsafe.Pointer(unsafe.SliceData(frame)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	if p < start || p+uintptr(len(data)) > start+uintptr(len(frame)) {
		t.Fatal("NarPush.Data does not point into the frame")
	}
	if cap(data) != len(data) {
		t.Fatal("the payload slice must not reach into the rest of the frame")
	}
	for _, c := range []struct {
		msg  ClientMessage
		data func(ClientMessage) []byte
	}{
		{&UploadChunk{RequestID: 1, Data: payload}, func(m ClientMessage) []byte { return m.(*UploadChunk).Data }},
		{&LogChunk{JobID: "j", Data: payload}, func(m ClientMessage) []byte { return m.(*LogChunk).Data }},
		{&ClientClusterSignal{Attempt: "a", Payload: payload}, func(m ClientMessage) []byte { return m.(*ClientClusterSignal).Payload }},
	} {
		f, _ := AppendClientMessage(nil, c.msg, 33)
		got, err := DecodeClientMessage(f, 33)
		if err != nil {
			t.Fatal(err)
		}
		d := c.data(got)
		if &d[0] != &f[len(f)-len(payload)-boolTail(c.msg)] {
			t.Errorf("%s payload was copied", c.msg.WireName())
		}
	}
}

// boolTail is how many bytes follow the payload in the frames of
// TestZeroCopyBytes: UploadChunk ends with offset and is_final.
func boolTail(m ClientMessage) int {
	if _, ok := m.(*UploadChunk); ok {
		return 2
	}
	return 0
}

// A sequence count the frame cannot hold fails before allocating.
func TestHugeCountDoesNotAllocate(t *testing.T) {
	frame := mustHex(t, "07ffffffff0f") // RequestJobChunk with 2^32-1 scores
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := DecodeClientMessage(frame, 33); !errors.Is(err, &DecodeError{Kind: Truncated}) {
			t.Fatalf("got %v, want Truncated", err)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 10*1024 {
		t.Errorf("%d bytes allocated for 10 impossible counts", n)
	}
}

func TestEncodeRefusesWhatPeersWouldReject(t *testing.T) {
	_, err := AppendClientMessage(nil, &InitConnection{ID: "\xff"}, 33)
	if err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Errorf("invalid UTF-8 id: %v", err)
	}
	var unsupported *UnsupportedVersionError
	if _, err := AppendClientMessage(nil, &ReauthRequest{}, 29); !errors.As(err, &unsupported) {
		t.Errorf("encode at 29: %v", err)
	}
	if _, err := DecodeServerMessage([]byte{5}, 34); !errors.As(err, &unsupported) {
		t.Errorf("decode at 34: %v", err)
	}
}
