package wire

import "fmt"

// DecodeErrorKind is one of the decode failures of docs/protocol/wire.md §1.4.
type DecodeErrorKind uint8

const (
	Truncated      DecodeErrorKind = iota + 1 // the frame ended early
	TrailingBytes                             // bytes were left after the message
	VarintOverflow                            // a varint longer than 64 bits
	OutOfRange                                // a u16 or u32 above its range
	InvalidBool                               // a bool or option tag other than 0 and 1
	InvalidUTF8                               // a string that is not UTF-8
	UnknownVariant                            // an enum tag unknown at the agreed version
)

// DecodeError is why a frame could not be decoded. Its text is the
// reference's, so logs of both implementations read alike.
type DecodeError struct {
	Kind    DecodeErrorKind
	N       int    // TrailingBytes: how many
	Type    string // OutOfRange: "u16" or "u32"; UnknownVariant: the enum's name
	Tag     uint64 // UnknownVariant
	Version uint16 // UnknownVariant: the agreed version
	Byte    byte   // InvalidBool
}

func (e *DecodeError) Error() string {
	switch e.Kind {
	case Truncated:
		return "frame ended early"
	case TrailingBytes:
		return fmt.Sprintf("%d bytes left after the message", e.N)
	case VarintOverflow:
		return "varint longer than 64 bits"
	case OutOfRange:
		return fmt.Sprintf("value out of range for %s", e.Type)
	case InvalidBool:
		return fmt.Sprintf("invalid bool byte %d", e.Byte)
	case InvalidUTF8:
		return "invalid UTF-8"
	case UnknownVariant:
		return fmt.Sprintf("unknown variant %d of %s at protocol %d", e.Tag, e.Type, e.Version)
	}
	return "invalid frame"
}

// Is lets errors.Is match on the kind: errors.Is(err, &DecodeError{Kind: Truncated}).
func (e *DecodeError) Is(target error) bool {
	t, ok := target.(*DecodeError)
	return ok && t.Kind == e.Kind
}

// NewerThanPeerError is the encode error for a variant the agreed version
// does not have yet.
type NewerThanPeerError struct {
	Variant string
	Since   uint16
	Version uint16
}

func (e *NewerThanPeerError) Error() string {
	return fmt.Sprintf("%s exists since protocol %d, the peer speaks %d", e.Variant, e.Since, e.Version)
}

// RemovedForPeerError is the encode error for a variant the agreed version
// no longer has (Handover and HandoverDone exist only below 31).
type RemovedForPeerError struct {
	Variant string
	Until   uint16
	Version uint16
}

func (e *RemovedForPeerError) Error() string {
	return fmt.Sprintf("%s was removed in protocol %d, the peer speaks %d", e.Variant, e.Until, e.Version)
}

// InvalidValueError is the encode error for a value that has no wire form:
// a nil enum value or an integer outside its enum's variants.
type InvalidValueError struct {
	Type   string
	Detail string
}

func (e *InvalidValueError) Error() string {
	return fmt.Sprintf("cannot encode %s: %s", e.Type, e.Detail)
}

// UnsupportedVersionError is returned for a protocol version outside
// Supported: a session never agrees on one, so it is a caller's bug.
type UnsupportedVersionError struct {
	Version uint16
}

func (e *UnsupportedVersionError) Error() string {
	return fmt.Sprintf("protocol %d is outside the supported range %s", e.Version, Supported)
}
