package wire

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"sync"
)

// FrameTag is the variant tag a frame opens with (its first varint).
func FrameTag(frame []byte) (uint64, bool) {
	tag, n := binary.Uvarint(frame)
	return tag, n > 0
}

// SameServerEncoding reports whether the server message variant tag is
// encoded byte for byte alike at versions a and b (same tag, same shape
// in the version's schema), so a frame received at a may be sent
// unchanged at b: the proxy relays bulk chunks that way
// (docs/protocol/federation.md "Passthrough").
func SameServerEncoding(tag uint64, a, b uint16) bool {
	return sameShape(serverShapes(), tag, a, b)
}

// SameClientEncoding is SameServerEncoding for worker→server messages.
func SameClientEncoding(tag uint64, a, b uint16) bool {
	return sameShape(clientShapes(), tag, a, b)
}

// shapes are each supported version's variant shapes by tag, taken from
// the schema lines ("tag:shape").
type shapes map[uint16]map[uint64]string

func sameShape(s shapes, tag uint64, a, b uint16) bool {
	sa, okA := s[a][tag]
	sb, okB := s[b][tag]
	return okA && okB && sa == sb
}

var (
	serverShapes = sync.OnceValue(func() shapes { return parseShapes(schemaLinesServerMessage) })
	clientShapes = sync.OnceValue(func() shapes { return parseShapes(schemaLinesClientMessage) })
)

func parseShapes(lines func([]byte, uint16) []byte) shapes {
	out := shapes{}
	for ver := Supported.Oldest; ver <= Supported.Newest; ver++ {
		byTag := map[uint64]string{}
		for line := range bytes.Lines(lines(nil, ver)) {
			tag, shape, ok := bytes.Cut(bytes.TrimSuffix(line, []byte("\n")), []byte(":"))
			if !ok {
				continue
			}
			t, err := strconv.ParseUint(string(tag), 10, 64)
			if err != nil {
				continue
			}
			byTag[t] = string(shape)
		}
		out[ver] = byTag
	}
	return out
}
