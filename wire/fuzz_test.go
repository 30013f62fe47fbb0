package wire

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// Seeds: the golden vectors and one frame of every variant at every version.
func addSeeds(f *testing.F, server bool) {
	for _, h := range []string{"15016a017102022f61022f6201020001ac0201", "050000c03f800101000000c0000000",
		"00000000000000027731", "1c0161016200", "1a0161016200", "0001ff"} {
		b, _ := hex.DecodeString(h)
		f.Add(b, uint8(3))
	}
	for ver := OldestVersion; ver <= NewestVersion; ver++ {
		info, _ := Enum(messageType[server])
		for _, vi := range info.Variants {
			if !vi.PresentAt(ver) {
				continue
			}
			g := &valueGen{r: newRand(uint64(ver)), ver: ver}
			frame, err := encodeAny(g.message(vi), server, ver)
			if err == nil {
				f.Add(frame, uint8(ver-OldestVersion))
			}
		}
	}
}

// fuzzDecode: any input either fails with a DecodeError or decodes to a
// message that re-encodes to a canonical frame, which decodes to the same
// canonical frame again. Never a panic, never a hang.
func fuzzDecode(t *testing.T, frame []byte, v uint8, server bool) {
	ver := OldestVersion + uint16(v)%(NewestVersion-OldestVersion+1)
	m, err := decodeAny(frame, server, ver)
	if err != nil {
		if _, ok := err.(*DecodeError); !ok {
			t.Fatalf("decode error of type %T: %v", err, err)
		}
		return
	}
	canon, err := encodeAny(m, server, ver)
	if err != nil {
		t.Fatalf("a decoded %s does not encode: %v", m.WireName(), err)
	}
	m2, err := decodeAny(canon, server, ver)
	if err != nil {
		t.Fatalf("canonical frame %x does not decode: %v", canon, err)
	}
	again, _ := encodeAny(m2, server, ver)
	if !bytes.Equal(canon, again) {
		t.Fatalf("canonical frame is not stable: %x then %x", canon, again)
	}
}

func FuzzDecodeClientMessage(f *testing.F) {
	addSeeds(f, false)
	f.Fuzz(func(t *testing.T, frame []byte, v uint8) { fuzzDecode(t, frame, v, false) })
}

func FuzzDecodeServerMessage(f *testing.F) {
	addSeeds(f, true)
	f.Fuzz(func(t *testing.T, frame []byte, v uint8) { fuzzDecode(t, frame, v, true) })
}
