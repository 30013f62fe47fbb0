package wirejson

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"gradient.dev/gradient/wire"
)

// ---- a random value generator over the registry ----

type gen struct {
	r   *rand.Rand
	ver uint16
}

var interestingU64 = []uint64{0, 1, 127, 128, 300, math.MaxUint16, math.MaxUint32, math.MaxUint64, math.MaxInt64}
var interestingI64 = []int64{0, -1, 1, -5, math.MinInt64, math.MaxInt64}
var interestingF32 = []uint32{
	0x00000000, 0x80000000, // ±0
	0x7f800000, 0xff800000, // ±Inf
	0x7fc00000, 0x7fc00001, 0xffffffff, 0x7f800001, // NaNs with payloads (0x7f800001 is signalling)
	0x00000001, 0x807fffff, // subnormals
	0x7f7fffff, 0x3fc00000, 0xc0000000, // max, 1.5, -2
}

func (g *gen) value(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	g.fill(v)
	return v
}

func (g *gen) fill(v reflect.Value) {
	t := v.Type()
	if info, ok := wire.Enum(t); ok {
		vi := g.variant(info)
		if info.Unit {
			v.SetUint(vi.Value)
			return
		}
		var val reflect.Value
		if vi.Type.Kind() == reflect.Pointer {
			val = reflect.New(vi.Type.Elem())
			g.fill(val.Elem())
		} else {
			val = g.value(vi.Type)
		}
		v.Set(val)
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		v.SetBool(g.r.IntN(2) == 1)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var u uint64
		if g.r.IntN(2) == 0 {
			u = interestingU64[g.r.IntN(len(interestingU64))]
		} else {
			u = g.r.Uint64() >> g.r.IntN(64)
		}
		if t.Bits() < 64 {
			u &= 1<<t.Bits() - 1
		}
		v.SetUint(u)
	case reflect.Int64:
		if g.r.IntN(2) == 0 {
			v.SetInt(interestingI64[g.r.IntN(len(interestingI64))])
		} else {
			v.SetInt(int64(g.r.Uint64()) >> g.r.IntN(64))
		}
	case reflect.Float32:
		if g.r.IntN(2) == 0 {
			v.SetFloat(float64(math.Float32frombits(interestingF32[g.r.IntN(len(interestingF32))])))
		} else {
			v.SetFloat(float64(math.Float32frombits(g.r.Uint32())))
		}
	case reflect.String:
		v.SetString(g.str())
	case reflect.Pointer:
		if g.r.IntN(3) == 0 {
			return
		}
		p := reflect.New(t.Elem())
		g.fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		n := g.r.IntN(4)
		if t.Elem().Kind() == reflect.Uint8 && !isEnum(t.Elem()) {
			n = g.r.IntN(40)
		}
		s := reflect.MakeSlice(t, n, n)
		for i := range n {
			g.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Struct:
		for i := range t.NumField() {
			g.fill(v.Field(i))
		}
	default:
		panic("gen: unsupported " + t.String())
	}
}

func (g *gen) variant(info *wire.EnumInfo) wire.VariantInfo {
	var present []wire.VariantInfo
	for _, vi := range info.Variants {
		if vi.PresentAt(g.ver) {
			present = append(present, vi)
		}
	}
	return present[g.r.IntN(len(present))]
}

var alphabet = []string{"a", "z", "/", "\"", "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "<", ">", "&", "é", "€", "😀", "\u2028", " "}

func (g *gen) str() string {
	var b strings.Builder
	for range g.r.IntN(8) {
		b.WriteString(alphabet[g.r.IntN(len(alphabet))])
	}
	return b.String()
}

// ---- round trips ----

type side struct {
	name      string
	enum      reflect.Type
	encode    func(wire.Message, uint16) ([]byte, error)
	decode    func([]byte, uint16) (wire.Message, error)
	unmarshal func([]byte) (wire.Message, error)
}

var sides = []side{
	{
		name: "client", enum: clientType,
		encode: func(m wire.Message, v uint16) ([]byte, error) {
			return wire.AppendClientMessage(nil, m.(wire.ClientMessage), v)
		},
		decode: func(f []byte, v uint16) (wire.Message, error) { return wire.DecodeClientMessage(f, v) },
		unmarshal: func(d []byte) (wire.Message, error) {
			m, err := UnmarshalClient(d)
			return m, err
		},
	},
	{
		name: "server", enum: serverType,
		encode: func(m wire.Message, v uint16) ([]byte, error) {
			return wire.AppendServerMessage(nil, m.(wire.ServerMessage), v)
		},
		decode: func(f []byte, v uint16) (wire.Message, error) { return wire.DecodeServerMessage(f, v) },
		unmarshal: func(d []byte) (wire.Message, error) {
			m, err := UnmarshalServer(d)
			return m, err
		},
	},
}

// roundTrip checks decode(frame) → Marshal → Unmarshal → encode == frame
// and that the JSON is stable.
func roundTrip(t *testing.T, s side, frame []byte, ver uint16) string {
	t.Helper()
	m, err := s.decode(frame, ver)
	if err != nil {
		t.Fatalf("%s v%d decode %x: %v", s.name, ver, frame, err)
	}
	j, err := Marshal(m)
	if err != nil {
		t.Fatalf("%s v%d Marshal %x: %v", s.name, ver, frame, err)
	}
	if !json.Valid(j) || bytes.ContainsAny(j, "\n\r") {
		t.Fatalf("%s v%d: not one line of valid JSON: %s", s.name, ver, j)
	}
	m2, err := s.unmarshal(j)
	if err != nil {
		t.Fatalf("%s v%d Unmarshal %s: %v", s.name, ver, j, err)
	}
	frame2, err := s.encode(m2, ver)
	if err != nil {
		t.Fatalf("%s v%d encode %s: %v", s.name, ver, j, err)
	}
	if !bytes.Equal(frame, frame2) {
		t.Fatalf("%s v%d: frame changed\n in  %x\n out %x\n json %s", s.name, ver, frame, frame2, j)
	}
	j2, err := Marshal(m2)
	if err != nil || !bytes.Equal(j, j2) {
		t.Fatalf("%s v%d: JSON not stable (%v)\n %s\n %s", s.name, ver, err, j, j2)
	}
	return string(j)
}

func TestRoundTripEveryVariant(t *testing.T) {
	for _, s := range sides {
		info, _ := wire.Enum(s.enum)
		for _, vi := range info.Variants {
			for ver := wire.OldestVersion; ver <= wire.NewestVersion; ver++ {
				if !vi.PresentAt(ver) {
					continue
				}
				g := &gen{r: rand.New(rand.NewPCG(uint64(ver), vi.Tag)), ver: ver}
				for range 40 {
					m := reflect.New(vi.Type.Elem())
					g.fill(m.Elem())
					frame, err := s.encode(m.Interface().(wire.Message), ver)
					if err != nil {
						t.Fatalf("%s %s v%d encode: %v", s.name, vi.Name, ver, err)
					}
					roundTrip(t, s, frame, ver)
				}
			}
		}
	}
}

func TestGoldenJSON(t *testing.T) {
	cases := []struct {
		side  side
		ver   uint16
		frame string
		json  string
	}{
		{sides[0], 30, "15016a017102022f61022f6201020001ac0201",
			`{"CacheQuery":{"job_id":"j","query_id":"q","paths":["/a","/b"],"mode":"Pull","nar_sizes":[null,300],"external":true}}`},
		{sides[0], 32, "050000c03f800101000000c00000",
			`{"WorkerMetrics":{"cpu_usage_pct":1.5,"ram_free_mb":128,"disk_speed_mbps":-2,"upload_speed_mbps":null,"download_speed_mbps":null,"build_peak_ram_mb":null}}`},
		{sides[0], 33, "050000c03f800101000000c0000000",
			`{"WorkerMetrics":{"cpu_usage_pct":1.5,"ram_free_mb":128,"disk_speed_mbps":-2,"upload_speed_mbps":null,"download_speed_mbps":null,"build_peak_ram_mb":null}}`},
		{sides[0], 33, "050000c03f800101000000c000000101036162638004",
			`{"WorkerMetrics":{"cpu_usage_pct":1.5,"ram_free_mb":128,"disk_speed_mbps":-2,"upload_speed_mbps":null,"download_speed_mbps":null,"build_peak_ram_mb":[["abc",512]]}}`},
		{sides[0], 33, "050000c03f800101000000c000000100",
			`{"WorkerMetrics":{"cpu_usage_pct":1.5,"ram_free_mb":128,"disk_speed_mbps":-2,"upload_speed_mbps":null,"download_speed_mbps":null,"build_peak_ram_mb":[]}}`},
		{sides[0], 31, "00000000000000027731",
			`{"InitConnection":{"capabilities":{"core":false,"federate":false,"fetch":false,"eval":false,"build":false,"cache":false},"id":"w1"}}`},
		{sides[0], 33, "02", `"ReauthRequest"`},
		{sides[0], 30, "1c", `"HandoverDone"`},
		{sides[0], 33, "0f016a0503deadbe", `{"LogChunk":{"job_id":"j","task_index":5,"data":"deadbe"}}`},
		{sides[0], 33, "09016a01610b01", `{"JobUpdate":{"job_id":"j","assignment_id":"a","update":{"Stage":"Build"}}}`},
		{sides[0], 33, "09016a016100", `{"JobUpdate":{"job_id":"j","assignment_id":"a","update":"Fetching"}}`},
		{sides[1], 33, "05", `"Draining"`},
		{sides[1], 33, "170700", `{"UploadGrant":{"request_id":7,"target":"Skip"}}`},
		{sides[1], 33, "170703017502010170",
			`{"UploadGrant":{"request_id":7,"target":{"Multipart":{"upload_id":"u","part_size":2,"part_urls":["p"]}}}}`},
		{sides[1], 30, "1a0178", `{"Handover":{"id":"x"}}`},
	}
	for _, c := range cases {
		frame, err := hex.DecodeString(c.frame)
		if err != nil {
			t.Fatal(err)
		}
		if got := roundTrip(t, c.side, frame, c.ver); got != c.json {
			t.Errorf("%s v%d %s:\n got  %s\n want %s", c.side.name, c.ver, c.frame, got, c.json)
		}
	}
}

func TestTupleAndNestedEnums(t *testing.T) {
	m := &wire.AssignJob{
		JobID: "j", AssignmentID: "a",
		Job: &wire.FlakeJob{
			Steps:  []wire.FlakeStep{wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateDerivations},
			Source: &wire.FlakeSourceRepository{URL: "https://x", Commit: "c"},
		},
	}
	j, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"AssignJob":{"job_id":"j","assignment_id":"a","job":{"Flake":{"steps":["FetchFlake","EvaluateDerivations"],"source":{"Repository":{"url":"https://x","commit":"c"}},"wildcards":[],"timeout_secs":null,"input_overrides":[],"input_update":null}},"cluster":null}}`
	if string(j) != want {
		t.Errorf("got  %s\nwant %s", j, want)
	}
	back, err := UnmarshalServer(j)
	if err != nil {
		t.Fatal(err)
	}
	if fj := back.(*wire.AssignJob).Job.(*wire.FlakeJob); fj.Source.(*wire.FlakeSourceRepository).Commit != "c" || len(fj.Steps) != 2 {
		t.Errorf("lost data: %+v", fj)
	}
}

func TestEmptyVariantObjectAccepted(t *testing.T) {
	m, err := UnmarshalClient([]byte(`{"ReauthRequest":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.(*wire.ReauthRequest); !ok {
		t.Fatalf("got %T", m)
	}
	s, err := UnmarshalServer([]byte(` {"UploadGrant":{"target":{"Skip":{}}}} `))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*wire.UploadGrant).Target.(*wire.GrantSkip); !ok {
		t.Fatalf("got %T", s.(*wire.UploadGrant).Target)
	}
}

func TestMissingFieldsAreZero(t *testing.T) {
	m, err := UnmarshalClient([]byte(`{"WorkerCapabilities":{"cpu_count":4}}`))
	if err != nil {
		t.Fatal(err)
	}
	wc := m.(*wire.WorkerCapabilities)
	if wc.CPUCount != 4 || wc.Zone != nil || len(wc.Architectures) != 0 {
		t.Errorf("got %+v", wc)
	}
}

func TestExtremes(t *testing.T) {
	nanPayload := math.Float32frombits(0x7fc00001)
	negZero := math.Float32frombits(0x80000000)
	inf := float32(math.Inf(-1))
	m := &wire.WorkerMetrics{
		CPUUsagePct:       nanPayload,
		RAMFreeMB:         math.MaxUint64,
		DiskSpeedMbps:     &negZero,
		UploadSpeedMbps:   &inf,
		DownloadSpeedMbps: new(float32(math.MaxFloat32)),
	}
	j, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"WorkerMetrics":{"cpu_usage_pct":"0x7fc00001","ram_free_mb":18446744073709551615,"disk_speed_mbps":-0,"upload_speed_mbps":"0xff800000","download_speed_mbps":3.4028235e+38,"build_peak_ram_mb":null}}`
	if string(j) != want {
		t.Errorf("got  %s\nwant %s", j, want)
	}
	back, err := UnmarshalClient(j)
	if err != nil {
		t.Fatal(err)
	}
	wm := back.(*wire.WorkerMetrics)
	if math.Float32bits(wm.CPUUsagePct) != 0x7fc00001 || wm.RAMFreeMB != math.MaxUint64 ||
		math.Float32bits(*wm.DiskSpeedMbps) != 0x80000000 || math.Float32bits(*wm.UploadSpeedMbps) != 0xff800000 ||
		*wm.DownloadSpeedMbps != math.MaxFloat32 {
		t.Errorf("got %+v", wm)
	}

	u := &wire.JobUpdate{Update: &wire.JobUpdateBuildOutput{Outputs: []wire.BuildOutput{{NarSize: new(int64(math.MinInt64))}}}}
	j, err = Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"nar_size":-9223372036854775808`) {
		t.Errorf("min int64 lost: %s", j)
	}
	back, err = UnmarshalClient(j)
	if err != nil {
		t.Fatal(err)
	}
	if got := *back.(*wire.JobUpdate).Update.(*wire.JobUpdateBuildOutput).Outputs[0].NarSize; got != math.MinInt64 {
		t.Errorf("nar_size %d", got)
	}
}

func TestUnmarshalErrors(t *testing.T) {
	cases := []struct {
		client bool
		in     string
		want   string
	}{
		{false, `{"AssignJob":{"job":{"Build":{"builds":[{"kind":"Foo"}]}}}}`,
			`AssignJob.job.Build.builds[0].kind: unknown variant "Foo" of BuildSpecKind`},
		{true, `{"Nope":{}}`, `unknown variant "Nope" of ClientMessage`},
		{true, `"Nope"`, `unknown variant "Nope" of ClientMessage`},
		{true, `{"InitConnection":{"idd":"x"}}`, `InitConnection: unknown field "idd" of InitConnection`},
		{true, `{"InitConnection":{"id":5}}`, `InitConnection.id: expected a string, got the number 5`},
		{true, `{"InitConnection":{"capabilities":{"core":1}}}`, `InitConnection.capabilities.core: expected a bool, got the number 1`},
		{true, `{"Reject":{"code":65536}}`, `Reject.code: 65536 is not a u16`},
		{true, `{"UploadCancel":{"request_id":18446744073709551616}}`, `UploadCancel.request_id: 18446744073709551616 is not a u64`},
		{true, `{"UploadCancel":{"request_id":-1}}`, `UploadCancel.request_id: -1 is not a u64`},
		{true, `{"UploadCancel":{"request_id":1.5}}`, `UploadCancel.request_id: 1.5 is not a u64`},
		{true, `{"UploadCancel":{"request_id":"1"}}`, `UploadCancel.request_id: expected an integer, got "1"`},
		{true, `{"WorkerMetrics":{"cpu_usage_pct":1e39}}`, `WorkerMetrics.cpu_usage_pct: 1e39 is not a finite f32`},
		{true, `{"WorkerMetrics":{"cpu_usage_pct":"NaN"}}`, `WorkerMetrics.cpu_usage_pct: "NaN" is not an f32 bit pattern`},
		{true, `{"LogChunk":{"data":"abc"}}`, `LogChunk.data: invalid hex`},
		{true, `{"AuthResponse":{"tokens":[["a"]]}}`, `AuthResponse.tokens[0]: expected an array of 2 elements, got an array`},
		{true, `{"AuthResponse":{"tokens":[["a",2]]}}`, `AuthResponse.tokens[0][1]: expected a string, got the number 2`},
		{true, `"InitConnection"`, `variant InitConnection of ClientMessage carries a value`},
		{true, `{"InitConnection":{},"LogChunk":{}}`, `exactly one key`},
		{true, `{"ReauthRequest":{"x":1}}`, `ReauthRequest: variant ReauthRequest of ClientMessage has no fields`},
		{true, `{"JobUpdate":{"update":{"Stage":"Later"}}}`, `JobUpdate.update.Stage: unknown variant "Later" of BuildStage`},
		{true, `{"JobUpdate":{"update":null}}`, `JobUpdate.update: expected a JobUpdateKind`},
		{true, `{"RequestJob":{"kind":0}}`, `RequestJob.kind: expected a JobKind name, got the number 0`},
		{true, `{"ReauthRequest":{}} x`, `invalid JSON`},
		{true, `{"ReauthRequest":`, `invalid JSON`},
		{true, ``, `invalid JSON`},
		{true, `[]`, `expected a ClientMessage`},
		{false, `"ReauthRequest"`, `unknown variant "ReauthRequest" of ServerMessage`},
	}
	for _, c := range cases {
		var err error
		if c.client {
			_, err = UnmarshalClient([]byte(c.in))
		} else {
			_, err = UnmarshalServer([]byte(c.in))
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want %q", c.in, err, c.want)
		}
	}
}

func TestMarshalErrors(t *testing.T) {
	cases := []struct {
		m    wire.Message
		want string
	}{
		{nil, "no message"},
		{(*wire.InitConnection)(nil), "nil InitConnection of ClientMessage"},
		{&wire.JobUpdate{}, "JobUpdate.update: no JobUpdateKind value"},
		{&wire.RequestJob{Kind: 9}, "RequestJob.kind: 9 is not a variant of JobKind"},
		{&wire.InitConnection{ID: "\xff"}, "InitConnection.id: invalid UTF-8"},
		{&wire.AssignJob{Job: (*wire.BuildJob)(nil)}, "AssignJob.job: nil Build of Job"},
	}
	for _, c := range cases {
		_, err := Marshal(c.m)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%#v: got error %v, want %q", c.m, err, c.want)
		}
	}
}

func TestFloat32Shortest(t *testing.T) {
	for _, bits := range interestingF32 {
		f := math.Float32frombits(bits)
		var w writer
		w.float32(f)
		var j any
		dec := json.NewDecoder(bytes.NewReader(w.b))
		dec.UseNumber()
		if err := dec.Decode(&j); err != nil {
			t.Fatalf("%08x: %s is not JSON: %v", bits, w.b, err)
		}
		got, err := readFloat32(j, "")
		if err != nil || math.Float32bits(got) != bits {
			t.Errorf("%08x: %s read back as %08x (%v)", bits, w.b, math.Float32bits(got), err)
		}
	}
}
