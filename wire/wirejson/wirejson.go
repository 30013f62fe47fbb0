// Package wirejson is a JSON form of protocol messages, for the protocol
// debugger (`gradient wire decode|encode`) and tests. It walks the message
// types by reflection, guided by wire.Enum and the `wire` struct tags, so it
// follows the Go declarations without generated code; it is tooling and
// never on the codec path.
//
// The format is fixed:
//
//   - A message, and every value of an interface enum (Job, JobUpdateKind,
//     GrantTarget, ...), is externally tagged like Rust serde: an object with
//     exactly one key, the variant's wire name:
//     {"InitConnection":{"capabilities":{"core":false,...},"id":"w1"}}.
//     A variant whose struct has no fields is the bare string
//     "ReauthRequest" ({"ReauthRequest":{}} is accepted on input). A tuple
//     variant wraps its one value: {"Flake":{...FlakeJob fields...}},
//     {"Stage":"Build"}.
//   - An integer enum (JobPhase, QueryMode, ...) is its variant name: "Pull".
//   - A struct is an object keyed by the snake_case names of its `wire`
//     tags, in declaration order. Unknown keys are an error; missing keys
//     take the zero value. Every field is written whatever its since=N: the
//     JSON form does not depend on the protocol version.
//   - An option (pointer) is null or the value; *[]T keeps null and []
//     distinct. A nil slice is written as [].
//   - wire.Pair is a 2-element array [first, second].
//   - []byte is a lowercase hex string.
//   - Integers are JSON numbers, exact over the whole uint64 and int64 range
//     (never read through float64).
//   - A finite float32 is the shortest number that parses back to the same
//     float32 (-0 stays -0). A NaN or ±Inf is the string "0x" followed by 8
//     hex digits of its IEEE-754 bits, so every bit pattern (NaN payloads
//     too) round-trips. Such a string is accepted for any float32 on input.
//
// Marshal writes compact JSON on one line without a trailing newline.
// Errors name the path of the offending value, for example
// `AssignJob.job.Build.builds[0].kind: unknown variant "Foo" of BuildSpecKind`.
package wirejson

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"gradient.dev/gradient/wire"
)

// Error is a value that has no JSON form (Marshal) or JSON that does not
// describe a message (Unmarshal). Path locates the value, empty for the
// top level.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

func errorf(path, format string, args ...any) error {
	return &Error{Path: path, Msg: fmt.Sprintf(format, args...)}
}

var (
	clientType = reflect.TypeFor[wire.ClientMessage]()
	serverType = reflect.TypeFor[wire.ServerMessage]()
	bytesType  = reflect.TypeFor[[]byte]()
)

// Marshal returns the JSON form of a ClientMessage or ServerMessage.
func Marshal(m wire.Message) ([]byte, error) {
	if m == nil {
		return nil, errorf("", "no message")
	}
	v := reflect.ValueOf(m)
	// The message enums share wire names (Reject, Draining, ClusterSignal),
	// so the variant is found by Go type, not by WireName.
	for _, et := range []reflect.Type{clientType, serverType} {
		if !v.Type().Implements(et) {
			continue
		}
		var w writer
		if err := w.enum(v, et, ""); err != nil {
			return nil, err
		}
		return w.b, nil
	}
	return nil, errorf("", "%T is not a ClientMessage or ServerMessage", m)
}

// UnmarshalClient reads the JSON form of a ClientMessage.
func UnmarshalClient(data []byte) (wire.ClientMessage, error) {
	v, err := unmarshal(data, clientType)
	if err != nil {
		return nil, err
	}
	return v.Interface().(wire.ClientMessage), nil
}

// UnmarshalServer reads the JSON form of a ServerMessage.
func UnmarshalServer(data []byte) (wire.ServerMessage, error) {
	v, err := unmarshal(data, serverType)
	if err != nil {
		return nil, err
	}
	return v.Interface().(wire.ServerMessage), nil
}

func unmarshal(data []byte, t reflect.Type) (reflect.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // integers must not pass through float64
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return reflect.Value{}, errorf("", "invalid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return reflect.Value{}, errorf("", "invalid JSON: data after the message")
	}
	v := reflect.New(t).Elem()
	if err := read(tree, v, ""); err != nil {
		return reflect.Value{}, err
	}
	return v, nil
}

// ---- Go value → JSON ----

type writer struct{ b []byte }

func (w *writer) value(v reflect.Value, path string) error {
	t := v.Type()
	if info, ok := wire.Enum(t); ok {
		if info.Unit {
			return w.unit(v, info, path)
		}
		return w.enum(v, t, path)
	}
	switch t.Kind() {
	case reflect.Bool:
		w.b = strconv.AppendBool(w.b, v.Bool())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		w.b = strconv.AppendUint(w.b, v.Uint(), 10)
	case reflect.Int64:
		w.b = strconv.AppendInt(w.b, v.Int(), 10)
	case reflect.Float32:
		w.float32(float32(v.Float()))
	case reflect.String:
		return w.str(v.String(), path)
	case reflect.Pointer:
		if v.IsNil() {
			w.b = append(w.b, "null"...)
			return nil
		}
		return w.value(v.Elem(), path)
	case reflect.Slice:
		if t == bytesType || t.Elem().Kind() == reflect.Uint8 && !isEnum(t.Elem()) {
			w.b = append(w.b, '"')
			w.b = hex.AppendEncode(w.b, v.Bytes())
			w.b = append(w.b, '"')
			return nil
		}
		w.b = append(w.b, '[')
		for i := range v.Len() {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			if err := w.value(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		w.b = append(w.b, ']')
	case reflect.Struct:
		if isPair(t) {
			w.b = append(w.b, '[')
			if err := w.value(v.Field(0), path+"[0]"); err != nil {
				return err
			}
			w.b = append(w.b, ',')
			if err := w.value(v.Field(1), path+"[1]"); err != nil {
				return err
			}
			w.b = append(w.b, ']')
			return nil
		}
		return w.fields(v, path)
	default:
		return errorf(path, "unsupported Go type %s", t)
	}
	return nil
}

func (w *writer) fields(v reflect.Value, path string) error {
	w.b = append(w.b, '{')
	for i, f := range fieldsOf(v.Type()) {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.b = strconv.AppendQuote(w.b, f.name) // snake_case ASCII: Go and JSON quoting agree
		w.b = append(w.b, ':')
		if err := w.value(v.Field(f.index), join(path, f.name)); err != nil {
			return err
		}
	}
	w.b = append(w.b, '}')
	return nil
}

func (w *writer) unit(v reflect.Value, info *wire.EnumInfo, path string) error {
	n := v.Uint()
	for _, vi := range info.Variants {
		if vi.Value == n {
			w.b = strconv.AppendQuote(w.b, vi.Name)
			return nil
		}
	}
	return errorf(path, "%d is not a variant of %s", n, info.Name)
}

// enum writes a value of the interface enum et (or of a message enum).
func (w *writer) enum(v reflect.Value, et reflect.Type, path string) error {
	info, _ := wire.Enum(et)
	if v.Kind() == reflect.Interface {
		if v.IsNil() {
			return errorf(path, "no %s value", info.Name)
		}
		v = v.Elem()
	}
	var vi *wire.VariantInfo
	for i := range info.Variants {
		if info.Variants[i].Type == v.Type() {
			vi = &info.Variants[i]
			break
		}
	}
	if vi == nil {
		return errorf(path, "%s is not a variant of %s", v.Type(), info.Name)
	}
	inner := v
	if inner.Kind() == reflect.Pointer {
		if inner.IsNil() {
			return errorf(path, "nil %s of %s", vi.Name, info.Name)
		}
		inner = inner.Elem()
	}
	if !vi.Tuple && inner.Kind() == reflect.Struct && inner.NumField() == 0 {
		w.b = strconv.AppendQuote(w.b, vi.Name)
		return nil
	}
	w.b = append(w.b, '{')
	w.b = strconv.AppendQuote(w.b, vi.Name)
	w.b = append(w.b, ':')
	if err := w.value(inner, join(path, vi.Name)); err != nil {
		return err
	}
	w.b = append(w.b, '}')
	return nil
}

func (w *writer) float32(f float32) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		w.b = fmt.Appendf(w.b, `"0x%08x"`, math.Float32bits(f))
		return
	}
	w.b = strconv.AppendFloat(w.b, float64(f), 'g', -1, 32)
}

// str writes a JSON string. HTML characters are kept as they are (unlike
// encoding/json) so the debugger output stays readable.
func (w *writer) str(s string, path string) error {
	if !utf8.ValidString(s) {
		return errorf(path, "invalid UTF-8 in string")
	}
	const hexDigits = "0123456789abcdef"
	w.b = append(w.b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			w.b = append(w.b, '\\', c)
		case c == '\n':
			w.b = append(w.b, '\\', 'n')
		case c == '\r':
			w.b = append(w.b, '\\', 'r')
		case c == '\t':
			w.b = append(w.b, '\\', 't')
		case c < 0x20:
			w.b = append(w.b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			w.b = append(w.b, c)
		}
	}
	w.b = append(w.b, '"')
	return nil
}

// ---- JSON tree → Go value ----

// read fills v (settable, zero) from the JSON tree j.
func read(j any, v reflect.Value, path string) error {
	t := v.Type()
	if info, ok := wire.Enum(t); ok {
		if info.Unit {
			return readUnit(j, v, info, path)
		}
		return readEnum(j, v, info, path)
	}
	switch t.Kind() {
	case reflect.Bool:
		b, ok := j.(bool)
		if !ok {
			return wrongType(path, "a bool", j)
		}
		v.SetBool(b)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := j.(json.Number)
		if !ok {
			return wrongType(path, "an integer", j)
		}
		u, err := strconv.ParseUint(string(n), 10, t.Bits())
		if err != nil {
			return errorf(path, "%s is not a u%d", n, t.Bits())
		}
		v.SetUint(u)
	case reflect.Int64:
		n, ok := j.(json.Number)
		if !ok {
			return wrongType(path, "an integer", j)
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return errorf(path, "%s is not an i64", n)
		}
		v.SetInt(i)
	case reflect.Float32:
		f, err := readFloat32(j, path)
		if err != nil {
			return err
		}
		v.SetFloat(float64(f))
	case reflect.String:
		s, ok := j.(string)
		if !ok {
			return wrongType(path, "a string", j)
		}
		v.SetString(s)
	case reflect.Pointer:
		if j == nil {
			return nil
		}
		p := reflect.New(t.Elem())
		if err := read(j, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Slice:
		if t == bytesType || t.Elem().Kind() == reflect.Uint8 && !isEnum(t.Elem()) {
			s, ok := j.(string)
			if !ok {
				return wrongType(path, "a hex string", j)
			}
			b, err := hex.DecodeString(s)
			if err != nil {
				return errorf(path, "invalid hex: %v", err)
			}
			v.SetBytes(b)
			return nil
		}
		a, ok := j.([]any)
		if !ok {
			return wrongType(path, "an array", j)
		}
		s := reflect.MakeSlice(t, len(a), len(a))
		for i, e := range a {
			if err := read(e, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Struct:
		if isPair(t) {
			a, ok := j.([]any)
			if !ok || len(a) != 2 {
				return wrongType(path, "an array of 2 elements", j)
			}
			if err := read(a[0], v.Field(0), path+"[0]"); err != nil {
				return err
			}
			return read(a[1], v.Field(1), path+"[1]")
		}
		o, ok := j.(map[string]any)
		if !ok {
			return wrongType(path, "an object", j)
		}
		return readFields(o, v, path)
	default:
		return errorf(path, "unsupported Go type %s", t)
	}
	return nil
}

func readFields(o map[string]any, v reflect.Value, path string) error {
	fs := fieldsOf(v.Type())
	byName := make(map[string]int, len(fs))
	for _, f := range fs {
		byName[f.name] = f.index
	}
	// Sorted so the reported unknown field does not depend on map order.
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := byName[k]; !ok {
			return errorf(path, "unknown field %q of %s", k, typeName(v.Type()))
		}
	}
	for _, f := range fs {
		if j, ok := o[f.name]; ok {
			if err := read(j, v.Field(f.index), join(path, f.name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func readUnit(j any, v reflect.Value, info *wire.EnumInfo, path string) error {
	s, ok := j.(string)
	if !ok {
		return wrongType(path, "a "+info.Name+" name", j)
	}
	for _, vi := range info.Variants {
		if vi.Name == s {
			v.SetUint(vi.Value)
			return nil
		}
	}
	return errorf(path, "unknown variant %q of %s", s, info.Name)
}

func readEnum(j any, v reflect.Value, info *wire.EnumInfo, path string) error {
	var name string
	var inner any
	bare := false
	switch j := j.(type) {
	case string:
		name, bare = j, true
	case map[string]any:
		if len(j) != 1 {
			return errorf(path, "a %s must be an object with exactly one key (the variant name), got %d keys", info.Name, len(j))
		}
		for k, x := range j {
			name, inner = k, x
		}
	default:
		return wrongType(path, "a "+info.Name+" (variant name or one-key object)", j)
	}
	vi := variantByName(info, name)
	if vi == nil {
		return errorf(path, "unknown variant %q of %s", name, info.Name)
	}
	vpath := join(path, name)
	var val reflect.Value
	if vi.Type.Kind() == reflect.Pointer {
		val = reflect.New(vi.Type.Elem())
	} else {
		val = reflect.New(vi.Type).Elem()
	}
	target := reflect.Indirect(val)
	empty := !vi.Tuple && target.Kind() == reflect.Struct && target.NumField() == 0
	switch {
	case bare && !empty:
		return errorf(path, "variant %s of %s carries a value: write {%q:...}", name, info.Name, name)
	case empty:
		// Both "Name" and {"Name":{}} describe a fieldless variant.
		if !bare {
			if o, ok := inner.(map[string]any); !ok || len(o) != 0 {
				return errorf(vpath, "variant %s of %s has no fields: expected {}", name, info.Name)
			}
		}
	default:
		if err := read(inner, target, vpath); err != nil {
			return err
		}
	}
	v.Set(val)
	return nil
}

// variantByName picks the variant named name. Two variants never share a
// name (retired ones keep theirs), so the first match is the only one.
func variantByName(info *wire.EnumInfo, name string) *wire.VariantInfo {
	for i := range info.Variants {
		if info.Variants[i].Name == name {
			return &info.Variants[i]
		}
	}
	return nil
}

func readFloat32(j any, path string) (float32, error) {
	switch j := j.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(j), 32)
		if err != nil {
			return 0, errorf(path, "%s is not a finite f32", j)
		}
		return float32(f), nil
	case string:
		if len(j) == 10 && strings.HasPrefix(j, "0x") {
			if u, err := strconv.ParseUint(j[2:], 16, 32); err == nil {
				return math.Float32frombits(uint32(u)), nil
			}
		}
		return 0, errorf(path, "%q is not an f32 bit pattern (\"0x\" and 8 hex digits)", j)
	}
	return 0, wrongType(path, "a number or \"0x\" bit pattern", j)
}

func wrongType(path, want string, j any) error {
	return errorf(path, "expected %s, got %s", want, jsonKind(j))
}

func jsonKind(j any) string {
	switch j := j.(type) {
	case nil:
		return "null"
	case bool:
		return "a bool"
	case json.Number:
		return "the number " + string(j)
	case string:
		return strconv.Quote(j)
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", j)
}

// ---- reflection helpers ----

type field struct {
	name  string
	index int
}

// fieldsOf lists the wire fields of a struct in declaration order.
func fieldsOf(t reflect.Type) []field {
	fs := make([]field, 0, t.NumField())
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("wire")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		fs = append(fs, field{name, i})
	}
	return fs
}

func isPair(t reflect.Type) bool {
	return t.PkgPath() == "gradient.dev/gradient/wire" && strings.HasPrefix(t.Name(), "Pair[")
}

func isEnum(t reflect.Type) bool {
	_, ok := wire.Enum(t)
	return ok
}

func typeName(t reflect.Type) string {
	if t.Name() != "" {
		return t.Name()
	}
	return t.String()
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
