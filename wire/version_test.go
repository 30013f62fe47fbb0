package wire

import (
	"errors"
	"testing"
)

func TestAgree(t *testing.T) {
	cases := []struct {
		ours, peer VersionRange
		want       uint16
		refusal    string
	}{
		{VersionRange{27, 30}, VersionRange{28, 31}, 30, ""},
		{VersionRange{28, 31}, VersionRange{27, 30}, 30, ""},
		{Supported, VersionRange{31, 33}, 33, ""},
		{Supported, VersionRange{30, 30}, 30, ""},
		{Supported, VersionRange{31, 40}, 33, ""},
		{VersionRange{27, 27}, VersionRange{30, 31}, 0, "no shared protocol version: ours 27..=27, peer 30..=31"},
		{Supported, VersionRange{34, 35}, 0, "no shared protocol version: ours 30..=33, peer 34..=35"},
		{Supported, VersionRange{27, 29}, 0, "no shared protocol version: ours 30..=33, peer 27..=29"},
	}
	for _, c := range cases {
		got, err := Agree(c.ours, VersionFrame(c.peer))
		if c.refusal == "" {
			if err != nil || got != c.want {
				t.Errorf("ours %s peer %s: got %d %v, want %d", c.ours, c.peer, got, err, c.want)
			}
			continue
		}
		var refusal *RefusalError
		if !errors.As(err, &refusal) || err.Error() != c.refusal {
			t.Errorf("ours %s peer %s: got %v, want refusal %q", c.ours, c.peer, err, c.refusal)
		}
	}
}

// A first frame without GRAD came from a peer older than the agreement frame.
func TestAgreeWithoutGRAD(t *testing.T) {
	for _, frame := range [][]byte{
		append([]byte{0, 1}, "rkyv-greeting"...),
		[]byte("GRAD"),
		[]byte("GRAD\x1e\x00\x21\x00\x00"), // one byte too many
		[]byte("grad\x1e\x00\x21\x00"),
		nil,
	} {
		_, err := Agree(VersionRange{27, 28}, frame)
		if err == nil || err.Error() != "peer protocol is older than 27" {
			t.Errorf("frame %q: %v", frame, err)
		}
	}
	_, err := Agree(Supported, []byte("rkyv"))
	if err == nil || err.Error() != "peer protocol is older than 30" {
		t.Errorf("rkyv: %v", err)
	}
}

func TestParseVersionFrame(t *testing.T) {
	r, ok := ParseVersionFrame(VersionFrame(Supported))
	if !ok || r != Supported {
		t.Fatalf("got %v %v", r, ok)
	}
}
