package wire

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// encoder appends the wire form of values to b for one agreed version. The
// first error sticks; later writes still happen but the result is discarded.
type encoder struct {
	b   []byte
	ver uint16
	err error
}

func (e *encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

func (e *encoder) u8(v uint8) { e.b = append(e.b, v) }

func (e *encoder) i64(v int64) { e.uvarint(uint64(v<<1) ^ uint64(v>>63)) }

func (e *encoder) f32(v float32) { e.b = binary.LittleEndian.AppendUint32(e.b, math.Float32bits(v)) }

func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) str(s string) {
	if !utf8.ValidString(s) {
		// The peer would refuse the whole frame; fail here, naming why.
		e.fail(&InvalidValueError{Type: "str", Detail: "invalid UTF-8"})
	}
	e.uvarint(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) bytes(p []byte) {
	e.uvarint(uint64(len(p)))
	e.b = append(e.b, p...)
}

// decoder reads values from one received frame at the agreed version. The
// first error sticks and moves the read position to the end, so every later
// read fails fast and loops bounded by the frame size end at once.
type decoder struct {
	buf []byte
	off int
	ver uint16
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.off = len(d.buf)
}

func (d *decoder) truncated() { d.fail(&DecodeError{Kind: Truncated}) }

func (d *decoder) unknownVariant(ty string, tag uint64) {
	d.fail(&DecodeError{Kind: UnknownVariant, Type: ty, Tag: tag, Version: d.ver})
}

func (d *decoder) uvarint() uint64 {
	if d.off < len(d.buf) {
		if b := d.buf[d.off]; b < 0x80 {
			d.off++
			return uint64(b)
		}
	}
	return d.uvarintSlow()
}

func (d *decoder) uvarintSlow() uint64 {
	var v uint64
	for i := 0; i < 10; i++ {
		if d.off >= len(d.buf) {
			d.truncated()
			return 0
		}
		b := d.buf[d.off]
		d.off++
		if i == 9 && b > 1 {
			d.fail(&DecodeError{Kind: VarintOverflow})
			return 0
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v
		}
	}
	return v // unreachable: the 10th byte is 0 or 1
}

func (d *decoder) u8() uint8 {
	if d.off >= len(d.buf) {
		d.truncated()
		return 0
	}
	b := d.buf[d.off]
	d.off++
	return b
}

func (d *decoder) u16() uint16 {
	v := d.uvarint()
	if v > math.MaxUint16 {
		d.fail(&DecodeError{Kind: OutOfRange, Type: "u16"})
		return 0
	}
	return uint16(v)
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail(&DecodeError{Kind: OutOfRange, Type: "u32"})
		return 0
	}
	return uint32(v)
}

func (d *decoder) u64() uint64 { return d.uvarint() }

func (d *decoder) i64() int64 {
	raw := d.uvarint()
	return int64(raw>>1) ^ -int64(raw&1)
}

func (d *decoder) f32() float32 {
	if len(d.buf)-d.off < 4 {
		d.truncated()
		return 0
	}
	v := binary.LittleEndian.Uint32(d.buf[d.off:])
	d.off += 4
	return math.Float32frombits(v)
}

// flag reads a bool byte or an option tag; both accept only 0 and 1.
func (d *decoder) flag() bool {
	b := d.u8()
	switch b {
	case 0:
		return false
	case 1:
		return true
	}
	if d.err == nil {
		d.fail(&DecodeError{Kind: InvalidBool, Byte: b})
	}
	return false
}

func (d *decoder) bool() bool { return d.flag() }

// present reads the tag of an opt<T>.
func (d *decoder) present() bool { return d.flag() }

// span reads a length and returns that many bytes of the frame.
func (d *decoder) span() []byte {
	n := d.uvarint()
	if n > uint64(len(d.buf)-d.off) {
		d.truncated()
		return nil
	}
	if n == 0 {
		return nil
	}
	end := d.off + int(n)
	p := d.buf[d.off:end:end]
	d.off = end
	return p
}

func (d *decoder) str() string {
	p := d.span()
	if len(p) == 0 {
		return ""
	}
	if !utf8.Valid(p) {
		d.fail(&DecodeError{Kind: InvalidUTF8})
		return ""
	}
	return string(p)
}

// bytes returns a sub-slice of the frame (zero-copy). Its capacity ends at
// its length, so appending to it never overwrites the rest of the frame.
func (d *decoder) bytes() []byte { return d.span() }

// count reads a sequence length. Every element takes at least minSize bytes,
// so a count the rest of the frame cannot hold is Truncated before anything
// is allocated for it.
func (d *decoder) count(minSize int) int {
	n := d.uvarint()
	if n > uint64((len(d.buf)-d.off)/minSize) {
		d.truncated()
		return 0
	}
	return int(n)
}
