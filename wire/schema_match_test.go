package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// An independent reader of the schema text (docs/protocol/wire.md §2.6): it checks that a
// frame follows the canonical shape without using any generated code, so
// the encoder is tested against the files rather than against itself.

type shapeNode struct {
	kind     string // prim name, "opt", "seq", "pair", "fields", "enum"
	children []*shapeNode
	tags     []uint64 // enum: the tag of each child
}

type schemaSide map[uint64]*shapeNode // top-level tag → fields

func parseSchemaFile(t *testing.T, ver uint16) map[string]schemaSide {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("schema", fmt.Sprintf("v%d.txt", ver)))
	if err != nil {
		t.Fatal(err)
	}
	sides := map[string]schemaSide{}
	var cur schemaSide
	for _, line := range strings.Split(strings.TrimSuffix(string(text), "\n"), "\n") {
		if line == "client" || line == "server" {
			cur = schemaSide{}
			sides[line] = cur
			continue
		}
		tag, rest, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseUint(tag, 10, 64)
		p := &shapeParser{s: rest}
		node := p.shape()
		if p.err != nil || p.pos != len(p.s) {
			t.Fatalf("v%d: cannot parse %q: %v", ver, line, p.err)
		}
		cur[n] = node
	}
	return sides
}

type shapeParser struct {
	s   string
	pos int
	err error
}

func (p *shapeParser) eat(tok string) bool {
	if strings.HasPrefix(p.s[p.pos:], tok) {
		p.pos += len(tok)
		return true
	}
	return false
}

func (p *shapeParser) shape() *shapeNode {
	switch {
	case p.eat("opt<"):
		n := &shapeNode{kind: "opt", children: []*shapeNode{p.shape()}}
		p.eat(">")
		return n
	case p.eat("seq<"):
		n := &shapeNode{kind: "seq", children: []*shapeNode{p.shape()}}
		p.eat(">")
		return n
	case p.eat("("):
		a := p.shape()
		p.eat(",")
		b := p.shape()
		p.eat(")")
		return &shapeNode{kind: "pair", children: []*shapeNode{a, b}}
	case p.eat("{"):
		n := &shapeNode{kind: "fields"}
		for !p.eat("}") {
			if p.err != nil || p.pos >= len(p.s) {
				p.err = fmt.Errorf("unterminated fields")
				return n
			}
			n.children = append(n.children, p.shape())
			p.eat(",")
		}
		return n
	case p.eat("["):
		n := &shapeNode{kind: "enum"}
		for !p.eat("]") {
			end := strings.IndexByte(p.s[p.pos:], ':')
			if end < 0 {
				p.err = fmt.Errorf("bad enum")
				return n
			}
			tag, _ := strconv.ParseUint(p.s[p.pos:p.pos+end], 10, 64)
			p.pos += end + 1
			n.tags = append(n.tags, tag)
			n.children = append(n.children, p.shape())
			p.eat(",")
		}
		return n
	}
	for _, prim := range []string{"u8", "u16", "u32", "u64", "i64", "f32", "bool", "str", "bytes"} {
		if p.eat(prim) {
			return &shapeNode{kind: prim}
		}
	}
	p.err = fmt.Errorf("unknown shape at %q", p.s[p.pos:])
	p.pos = len(p.s)
	return &shapeNode{kind: "?"}
}

// match walks frame along the shapes and requires it to end exactly.
func (s schemaSide) match(frame []byte) error {
	r := &shapeReader{b: frame}
	tag := r.varint()
	node, ok := s[tag]
	if !ok {
		return fmt.Errorf("tag %d is not in the schema", tag)
	}
	r.walk(node)
	if r.err != nil {
		return r.err
	}
	if r.pos != len(frame) {
		return fmt.Errorf("%d bytes left", len(frame)-r.pos)
	}
	return nil
}

type shapeReader struct {
	b   []byte
	pos int
	err error
}

func (r *shapeReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	r.pos = len(r.b)
}

func (r *shapeReader) byte1() byte {
	if r.pos >= len(r.b) {
		r.fail("ended early")
		return 0
	}
	r.pos++
	return r.b[r.pos-1]
}

func (r *shapeReader) varint() uint64 {
	var v uint64
	for shift := 0; shift < 70; shift += 7 {
		c := r.byte1()
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	r.fail("varint too long")
	return 0
}

func (r *shapeReader) walk(n *shapeNode) {
	switch n.kind {
	case "u8":
		r.byte1()
	case "u16", "u32", "u64", "i64":
		v := r.varint()
		if (n.kind == "u16" && v > 0xffff) || (n.kind == "u32" && v > 0xffffffff) {
			r.fail("%d does not fit %s", v, n.kind)
		}
	case "f32":
		for range 4 {
			r.byte1()
		}
	case "bool":
		if b := r.byte1(); b > 1 {
			r.fail("bool byte %d", b)
		}
	case "str", "bytes":
		l := r.varint()
		if l > uint64(len(r.b)-r.pos) {
			r.fail("length %d beyond the frame", l)
			return
		}
		r.pos += int(l)
	case "opt":
		switch r.byte1() {
		case 0:
		case 1:
			r.walk(n.children[0])
		default:
			r.fail("bad option tag")
		}
	case "seq":
		count := r.varint()
		for i := uint64(0); i < count && r.err == nil; i++ {
			r.walk(n.children[0])
		}
	case "pair", "fields":
		for _, c := range n.children {
			r.walk(c)
		}
	case "enum":
		tag := r.varint()
		for i, t := range n.tags {
			if t == tag {
				r.walk(n.children[i])
				return
			}
		}
		r.fail("enum tag %d not in the schema", tag)
	default:
		r.fail("unknown shape %s", n.kind)
	}
}

func TestSchemaReaderRejectsWrongShape(t *testing.T) {
	shapes := parseSchemaFile(t, 33)
	// RequestJob with kind 2: JobKind has only 0 and 1.
	if err := shapes["client"].match([]byte{19, 2}); err == nil {
		t.Fatal("the schema reader accepted an unknown enum tag")
	}
	if err := shapes["client"].match([]byte{19, 1}); err != nil {
		t.Fatal(err)
	}
}
