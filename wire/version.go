package wire

import (
	"encoding/binary"
	"fmt"
)

// VersionRange is an inclusive range of protocol versions.
type VersionRange struct {
	Oldest, Newest uint16
}

// Supported is the range this implementation speaks, computed by the
// generator from the annotations.
var Supported = VersionRange{OldestVersion, NewestVersion}

// String prints the range the way the reference does: "30..=33".
func (r VersionRange) String() string { return fmt.Sprintf("%d..=%d", r.Oldest, r.Newest) }

// Contains reports whether ver lies in r.
func (r VersionRange) Contains(ver uint16) bool { return ver >= r.Oldest && ver <= r.Newest }

// VersionFrameSize is the size of the version agreement frame.
const VersionFrameSize = 8

// VersionFrame is the 8-byte frame each side sends before its first
// message: "GRAD", then oldest and newest as little-endian u16. Its format
// never changes.
func VersionFrame(r VersionRange) []byte {
	b := make([]byte, VersionFrameSize)
	copy(b, "GRAD")
	binary.LittleEndian.PutUint16(b[4:], r.Oldest)
	binary.LittleEndian.PutUint16(b[6:], r.Newest)
	return b
}

// ParseVersionFrame reads a peer's version frame. A frame that is not
// exactly "GRAD" and 4 more bytes came from a peer older than the frame
// (protocol 26 or older).
func ParseVersionFrame(frame []byte) (VersionRange, bool) {
	if len(frame) != VersionFrameSize || string(frame[:4]) != "GRAD" {
		return VersionRange{}, false
	}
	return VersionRange{
		Oldest: binary.LittleEndian.Uint16(frame[4:]),
		Newest: binary.LittleEndian.Uint16(frame[6:]),
	}, true
}

// RefusalError is why version agreement failed. Its text is the close
// reason sent with WebSocket close code 1002.
type RefusalError struct {
	Reason string
}

func (e *RefusalError) Error() string { return e.Reason }

// Agree runs the agreement rule of one side: ours is this side's range,
// peerFrame the first binary message the peer sent. The agreed version is
// the lower of both newest versions, if both ranges share it.
func Agree(ours VersionRange, peerFrame []byte) (uint16, error) {
	peer, ok := ParseVersionFrame(peerFrame)
	if !ok {
		return 0, &RefusalError{Reason: fmt.Sprintf("peer protocol is older than %d", ours.Oldest)}
	}
	ver := min(ours.Newest, peer.Newest)
	if ver < max(ours.Oldest, peer.Oldest) {
		return 0, &RefusalError{Reason: fmt.Sprintf("no shared protocol version: ours %s, peer %s", ours, peer)}
	}
	return ver, nil
}
