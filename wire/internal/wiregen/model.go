package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Kind is the wire shape of a type expression.
type Kind int

const (
	KPrim   Kind = iota // u8 u16 u32 u64 i64 f32 bool str bytes
	KOpt                // *T
	KSeq                // []T
	KPair               // Pair[A,B]
	KStruct             // a named struct
	KSum                // a named interface enum
	KUnit               // a named integer enum of unit variants
)

// Type is one resolved type expression.
type Type struct {
	Kind   Kind
	Prim   string // KPrim
	Elem   *Type  // KOpt, KSeq
	A, B   *Type  // KPair
	Decl   *Decl  // KStruct, KSum, KUnit
	GoExpr string // the Go spelling
}

// Decl is a named wire type.
type Decl struct {
	GoName   string
	WireName string
	Kind     Kind // KStruct, KSum or KUnit
	Fields   []*Field
	Variants []*Variant
	Oldest   int // the type-wide oldest attribute

	oldest, newest int
	computing      bool
	computed       bool
}

// Field is one struct field.
type Field struct {
	GoName   string
	WireName string
	Type     *Type
	Since    int
	Default  bool
}

// Variant is one enum variant.
type Variant struct {
	Tag      int
	Name     string // wire name
	GoType   string // Go type ("*T", "T") or, for unit enums, the constant
	Ptr      bool
	Tuple    bool
	Since    int
	Until    int    // 0 = never removed; else present only below Until
	Class    string // a message's handler after the handshake: "job", "cache" or "" (the session's)
	Bulk     bool   // a message rides the writer's bulk lane
	Payload  *Decl  // the variant's own struct, or the wrapped type for tuples
	Fields   []*Field
	UnitEnum bool // the enum is a unit enum; GoType is a constant
}

// Model is every wire type reachable from the two message enums.
type Model struct {
	Pkg   string
	Decls map[string]*Decl
	Order []*Decl // deterministic emission order
	specs map[string]*spec
}

type spec struct {
	ts  *ast.TypeSpec
	doc []string
}

func load(dir string) (*Model, error) {
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	m := &Model{Decls: map[string]*Decl{}, specs: map[string]*spec{}}
	for _, path := range matches {
		if strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "_gen.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		m.Pkg = f.Name.Name
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				var lines []string
				if doc != nil {
					for _, c := range doc.List {
						if strings.HasPrefix(c.Text, "//wire:") {
							lines = append(lines, strings.TrimPrefix(c.Text, "//wire:"))
						}
					}
				}
				m.specs[ts.Name.Name] = &spec{ts: ts, doc: lines}
			}
		}
	}
	for _, root := range []string{"ClientMessage", "ServerMessage"} {
		if _, err := m.decl(root); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Model) decl(name string) (*Decl, error) {
	if d, ok := m.Decls[name]; ok {
		return d, nil
	}
	sp, ok := m.specs[name]
	if !ok {
		return nil, fmt.Errorf("type %s is used on the wire but not declared", name)
	}
	d := &Decl{GoName: name, WireName: name}
	m.Decls[name] = d
	m.Order = append(m.Order, d)
	isEnum := false
	for _, line := range sp.doc {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		switch words[0] {
		case "enum":
			isEnum = true
			for _, w := range words[1:] {
				k, v, _ := strings.Cut(w, "=")
				switch k {
				case "name":
					d.WireName = v
				case "oldest":
					n, err := strconv.Atoi(v)
					if err != nil {
						return nil, fmt.Errorf("%s: bad oldest %q", name, v)
					}
					d.Oldest = n
				default:
					return nil, fmt.Errorf("%s: unknown enum option %q", name, w)
				}
			}
		case "variant":
			v, err := parseVariant(name, words[1:])
			if err != nil {
				return nil, err
			}
			d.Variants = append(d.Variants, v)
		default:
			return nil, fmt.Errorf("%s: unknown directive //wire:%s", name, words[0])
		}
	}
	switch t := sp.ts.Type.(type) {
	case *ast.StructType:
		if isEnum {
			return nil, fmt.Errorf("%s: //wire:enum on a struct", name)
		}
		d.Kind = KStruct
		for _, f := range t.Fields.List {
			if len(f.Names) != 1 {
				return nil, fmt.Errorf("%s: wire structs need one named field per line", name)
			}
			field, err := m.field(name, f)
			if err != nil {
				return nil, err
			}
			d.Fields = append(d.Fields, field)
		}
	case *ast.InterfaceType:
		if !isEnum {
			return nil, fmt.Errorf("%s: interface without //wire:enum", name)
		}
		d.Kind = KSum
	case *ast.Ident:
		if !isEnum {
			return nil, fmt.Errorf("%s: named integer without //wire:enum", name)
		}
		if t.Name != "uint8" {
			return nil, fmt.Errorf("%s: unit enums are uint8", name)
		}
		d.Kind = KUnit
	default:
		return nil, fmt.Errorf("%s: unsupported declaration", name)
	}
	if d.Kind != KStruct {
		if err := m.resolveVariants(d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func parseVariant(enum string, words []string) (*Variant, error) {
	if len(words) < 3 {
		return nil, fmt.Errorf("%s: variant needs TAG NAME GOTYPE", enum)
	}
	tag, err := strconv.Atoi(words[0])
	if err != nil {
		return nil, fmt.Errorf("%s: bad variant tag %q", enum, words[0])
	}
	v := &Variant{Tag: tag, Name: words[1], GoType: words[2]}
	for _, w := range words[3:] {
		k, val, _ := strings.Cut(w, "=")
		switch k {
		case "tuple":
			v.Tuple = true
		case "job", "cache":
			if v.Class != "" {
				return nil, fmt.Errorf("%s.%s: two classes, %s and %s", enum, v.Name, v.Class, k)
			}
			v.Class = k
		case "bulk":
			v.Bulk = true
		case "since", "until":
			n, err := strconv.Atoi(val)
			if err != nil {
				return nil, fmt.Errorf("%s.%s: bad %s %q", enum, v.Name, k, val)
			}
			if k == "since" {
				v.Since = n
			} else {
				v.Until = n
			}
		default:
			return nil, fmt.Errorf("%s.%s: unknown variant option %q", enum, v.Name, w)
		}
	}
	return v, nil
}

func (m *Model) resolveVariants(d *Decl) error {
	if len(d.Variants) == 0 {
		return fmt.Errorf("%s: enum without variants", d.GoName)
	}
	prevSince := 0
	for i, v := range d.Variants {
		// Variants are append-only: tags follow declaration order, a tag is
		// reused only by a variant added after the one before was removed.
		if i == 0 && v.Tag != 0 {
			return fmt.Errorf("%s: the first variant must have tag 0", d.GoName)
		}
		if i > 0 {
			prev := d.Variants[i-1]
			switch {
			case v.Tag == prev.Tag+1:
			case v.Tag == prev.Tag && prev.Until != 0 && v.Since >= prev.Until:
			default:
				return fmt.Errorf("%s.%s: tag %d breaks append-only order", d.GoName, v.Name, v.Tag)
			}
		}
		if v.Since < prevSince && v.Until == 0 {
			return fmt.Errorf("%s.%s: since %d is older than the variant before (%d)", d.GoName, v.Name, v.Since, prevSince)
		}
		if v.Since > prevSince {
			prevSince = v.Since
		}
		if d.Kind == KUnit {
			v.UnitEnum = true
			continue
		}
		goType := v.GoType
		if strings.HasPrefix(goType, "*") {
			v.Ptr = true
			goType = goType[1:]
		}
		payload, err := m.decl(goType)
		if err != nil {
			return err
		}
		v.Payload = payload
		if v.Tuple {
			v.Fields = []*Field{{GoName: "", WireName: "0", Type: &Type{Kind: payload.Kind, Decl: payload, GoExpr: goType}}}
		} else {
			if payload.Kind != KStruct || !v.Ptr {
				return fmt.Errorf("%s.%s: a struct variant is a *struct; mark wrappers as tuple", d.GoName, v.Name)
			}
			v.Fields = payload.Fields
		}
	}
	return nil
}

func (m *Model) field(owner string, f *ast.Field) (*Field, error) {
	fd := &Field{GoName: f.Names[0].Name}
	if f.Tag == nil {
		return nil, fmt.Errorf("%s.%s: missing wire tag", owner, fd.GoName)
	}
	raw, _ := strconv.Unquote(f.Tag.Value)
	tag, ok := reflect.StructTag(raw).Lookup("wire")
	if !ok {
		return nil, fmt.Errorf("%s.%s: missing wire tag", owner, fd.GoName)
	}
	parts := strings.Split(tag, ",")
	fd.WireName = parts[0]
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "since":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("%s.%s: bad since %q", owner, fd.GoName, v)
			}
			fd.Since = n
		case "default":
			fd.Default = true
		default:
			return nil, fmt.Errorf("%s.%s: unknown wire option %q", owner, fd.GoName, p)
		}
	}
	if fd.Default && fd.Since == 0 {
		return nil, fmt.Errorf("%s.%s: default needs since=N", owner, fd.GoName)
	}
	t, err := m.typeOf(f.Type)
	if err != nil {
		return nil, fmt.Errorf("%s.%s: %w", owner, fd.GoName, err)
	}
	fd.Type = t
	return fd, nil
}

var prims = map[string]string{
	"uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
	"int64": "i64", "float32": "f32", "bool": "bool", "string": "str",
}

func (m *Model) typeOf(e ast.Expr) (*Type, error) {
	switch t := e.(type) {
	case *ast.Ident:
		if p, ok := prims[t.Name]; ok {
			return &Type{Kind: KPrim, Prim: p, GoExpr: t.Name}, nil
		}
		d, err := m.decl(t.Name)
		if err != nil {
			return nil, err
		}
		return &Type{Kind: d.Kind, Decl: d, GoExpr: t.Name}, nil
	case *ast.StarExpr:
		el, err := m.typeOf(t.X)
		if err != nil {
			return nil, err
		}
		return &Type{Kind: KOpt, Elem: el, GoExpr: "*" + el.GoExpr}, nil
	case *ast.ArrayType:
		if t.Len != nil {
			return nil, fmt.Errorf("arrays are not wire types")
		}
		if id, ok := t.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return &Type{Kind: KPrim, Prim: "bytes", GoExpr: "[]byte"}, nil
		}
		el, err := m.typeOf(t.Elt)
		if err != nil {
			return nil, err
		}
		return &Type{Kind: KSeq, Elem: el, GoExpr: "[]" + el.GoExpr}, nil
	case *ast.IndexListExpr:
		if id, ok := t.X.(*ast.Ident); ok && id.Name == "Pair" && len(t.Indices) == 2 {
			a, err := m.typeOf(t.Indices[0])
			if err != nil {
				return nil, err
			}
			b, err := m.typeOf(t.Indices[1])
			if err != nil {
				return nil, err
			}
			return &Type{Kind: KPair, A: a, B: b, GoExpr: "Pair[" + a.GoExpr + ", " + b.GoExpr + "]"}, nil
		}
	}
	return nil, fmt.Errorf("unsupported wire type %T", e)
}

// ---- OLDEST / NEWEST (docs/protocol/wire.md §2.5) ----

func floorAt(n, p int) int {
	if n > p {
		return n
	}
	return 0
}

func typeRange(t *Type) (oldest, newest int) {
	switch t.Kind {
	case KPrim:
		return 0, 0
	case KOpt, KSeq:
		return typeRange(t.Elem)
	case KPair:
		ao, an := typeRange(t.A)
		bo, bn := typeRange(t.B)
		return max(ao, bo), max(an, bn)
	}
	return declRange(t.Decl)
}

func declRange(d *Decl) (int, int) {
	if d.computed || d.computing {
		// A recursive type contributes nothing new on the way back.
		return d.oldest, d.newest
	}
	d.computing = true
	oldest, newest := d.Oldest, d.Oldest
	contribute := func(fields []*Field, presentSince int) {
		for _, f := range fields {
			to, tn := typeRange(f.Type)
			eff := max(f.Since, presentSince)
			if f.Default {
				oldest = max(oldest, floorAt(to, eff))
			} else {
				oldest = max(oldest, floorAt(max(f.Since, to), presentSince))
			}
			newest = max(newest, eff, tn)
		}
	}
	switch d.Kind {
	case KStruct:
		contribute(d.Fields, 0)
	default:
		for _, v := range d.Variants {
			contribute(v.Fields, v.Since)
			newest = max(newest, v.Since)
		}
	}
	d.oldest, d.newest = oldest, newest
	d.computing, d.computed = false, true
	return oldest, newest
}

// ProtoVersions is the supported range computed from the annotations.
func (m *Model) ProtoVersions() (int, int) {
	co, cn := declRange(m.Decls["ClientMessage"])
	so, sn := declRange(m.Decls["ServerMessage"])
	return max(co, so), max(cn, sn)
}

// minSize is a lower bound of the encoded size of t at any version, used to
// reject sequence counts the frame cannot hold before allocating.
func minSize(t *Type) int {
	switch t.Kind {
	case KPrim:
		if t.Prim == "f32" {
			return 4
		}
		return 1
	case KOpt, KSeq, KSum, KUnit:
		return 1
	case KPair:
		return minSize(t.A) + minSize(t.B)
	}
	n := 0
	for _, f := range t.Decl.Fields {
		if !f.Default {
			n += minSize(f.Type)
		}
	}
	return max(n, 1)
}

func sortedDecls(m *Model) []*Decl {
	out := append([]*Decl(nil), m.Order...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].GoName < out[j].GoName })
	return out
}

func mustGetwd() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return wd
}
