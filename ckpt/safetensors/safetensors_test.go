package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func f32le(vals ...float32) []byte {
	var b []byte
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// TestUpstreamGoldenBytes checks Encode against the byte arrays asserted by
// the upstream Rust tests (safetensors/src/tensor.rs: test_serialization,
// test_empty, test_serialization_forced_alignement).
func TestUpstreamGoldenBytes(t *testing.T) {
	data := f32le(0, 1, 2, 3, 4, 5)
	cases := []struct {
		name    string
		tensors map[string]Tensor
		meta    map[string]string
		want    []byte
	}{
		{"test_serialization", map[string]Tensor{"attn.0": {F32, []int{1, 2, 3}, data}}, nil, []byte{
			64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
			116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
			58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
			101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
			0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64}},
		{"test_empty", map[string]Tensor{}, nil, []byte{8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}},
		{"test_empty_metadata", map[string]Tensor{}, map[string]string{"framework": "pt"}, []byte{
			40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
			95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
			116, 34, 125, 125, 32, 32, 32, 32, 32}},
		{"test_serialization_forced_alignement", map[string]Tensor{"attn0": {F32, []int{1, 1, 2, 3}, data}}, nil, []byte{
			72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116,
			121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58,
			91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102,
			115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32,
			32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0,
			160, 64}},
	}
	// From the Python bindings' tests (bindings/python/tests/test_simple.py):
	// save({"test": np.zeros((2, 2), np.int32)}) after data[1, 1] = 1.
	i32 := make([]byte, 16)
	i32[12] = 1
	cases = append(cases,
		struct {
			name    string
			tensors map[string]Tensor
			meta    map[string]string
			want    []byte
		}{"python test_serialization", map[string]Tensor{"test": {I32, []int{2, 2}, i32}}, nil,
			[]byte("@\x00\x00\x00\x00\x00\x00\x00{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}   " +
				" \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00")},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			n, err := Encode(&buf, c.tensors, c.meta)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), c.want) || n != int64(len(c.want)) {
				t.Fatalf("Encode = %d bytes %q\nwant %q", n, buf.Bytes(), c.want)
			}
			f, err := Parse(c.name, buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Infos()) != len(c.tensors) {
				t.Fatalf("parsed %d tensors, want %d", len(f.Infos()), len(c.tensors))
			}
		})
	}
}

// fixtureTensors reads testdata/fixture.json, written with the fixture by
// tools/golden/safetensors_fixture.py.
func fixtureTensors(t *testing.T) map[string]Tensor {
	t.Helper()
	raw, err := os.ReadFile("testdata/fixture.json")
	if err != nil {
		t.Fatal(err)
	}
	var desc map[string]struct {
		DType string `json:"dtype"`
		Shape []int  `json:"shape"`
		Hex   string `json:"hex"`
	}
	if err := json.Unmarshal(raw, &desc); err != nil {
		t.Fatal(err)
	}
	m := map[string]Tensor{}
	for name, d := range desc {
		dt, err := ParseDType(d.DType)
		if err != nil {
			t.Fatal(err)
		}
		data, err := hex.DecodeString(d.Hex)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = Tensor{dt, d.Shape, data}
	}
	return m
}

func equalTensor(a, b Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && bytes.Equal(a.Data, b.Data)
}

// TestFixtureByteExact checks that Encode reproduces, byte for byte, the
// file the Python script laid out with upstream's rules, and that Open and
// ReadFile read every tensor back.
func TestFixtureByteExact(t *testing.T) {
	want, err := os.ReadFile("testdata/fixture.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	tensors := fixtureTensors(t)
	var buf bytes.Buffer
	if _, err := Encode(&buf, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("Encode differs from fixture:\n got %q\nwant %q", buf.Bytes(), want)
	}
	for _, open := range []func(string) (*File, error){Open, ReadFile} {
		f, err := open("testdata/fixture.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Metadata(); len(got) != 1 || got["format"] != "pt" {
			t.Errorf("Metadata = %v", got)
		}
		if len(f.Infos()) != len(tensors) {
			t.Errorf("%d tensors, want %d", len(f.Infos()), len(tensors))
		}
		for name, w := range tensors {
			g, err := f.Tensor(name)
			if err != nil {
				t.Fatal(err)
			}
			if !equalTensor(g, w) {
				t.Errorf("tensor %q = %+v, want %+v", name, g, w)
			}
		}
		var vals [12]float32
		emb, _ := f.Tensor("model.embed.weight")
		if err := emb.DecodeFloat32(vals[:]); err != nil {
			t.Fatal(err)
		}
		if vals[0] != -3*float32(0.7) || vals[11] != 8*float32(0.7) {
			t.Errorf("embed values %v", vals)
		}
		if _, err := f.Tensor("nope"); err == nil || err.Error() != "safetensors: testdata/fixture.safetensors: tensor nope: not in file" {
			t.Errorf("missing tensor error = %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// randomTensor returns a tensor of dt whose shape holds whole bytes.
func randomTensor(r *rand.Rand, dt DType, shape []int) Tensor {
	n, err := ByteSize(dt, shape)
	if err != nil {
		panic(err)
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return Tensor{dt, shape, data}
}

func TestRoundTripEveryDType(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	for dt := DType(0); dt < numDTypes; dt++ {
		t.Run(dt.String(), func(t *testing.T) {
			shapes := [][]int{{}, {0}, {3, 8}, {2, 0, 5}}
			if dt.Bits()%8 != 0 {
				shapes = [][]int{{0}, {4, 2}, {8}} // whole bytes only
			}
			tensors := map[string]Tensor{}
			for i, s := range shapes {
				tensors[strings.Repeat("t", i+1)] = randomTensor(r, dt, s)
			}
			// Mixed with a tensor of every other width to exercise ordering.
			tensors["z.f64"] = randomTensor(r, F64, []int{3})
			tensors["z.u8"] = randomTensor(r, U8, []int{5})
			path := filepath.Join(dir, dt.String()+".safetensors")
			if err := WriteFile(path, tensors, map[string]string{"dtype": dt.String()}); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := f.Tensors()
			if len(got) != len(tensors) {
				t.Fatalf("%d tensors, want %d", len(got), len(tensors))
			}
			for name, w := range tensors {
				g := got[name]
				if !equalTensor(g, w) {
					t.Errorf("%s: got %v %v %x, want %v %v %x", name, g.DType, g.Shape, g.Data, w.DType, w.Shape, w.Data)
				}
				if align := max(1, g.DType.Bits()/8); len(g.Data) > 0 && uintptr(unsafe.Pointer(&g.Data[0]))%uintptr(align) != 0 {
					t.Errorf("%s: data not %d-byte aligned in the mapping", name, align)
				}
			}
		})
	}
}

func TestDTypeNames(t *testing.T) {
	for dt := DType(0); dt < numDTypes; dt++ {
		p, err := ParseDType(dt.String())
		if err != nil || p != dt {
			t.Errorf("ParseDType(%q) = %v, %v", dt.String(), p, err)
		}
	}
	if _, err := ParseDType("f32"); err == nil || err.Error() != `unknown dtype "f32"` {
		t.Errorf("ParseDType(f32) error = %v", err)
	}
	if DType(200).Valid() || DType(200).String() != "DType(200)" || DType(200).Bits() != 0 {
		t.Error("invalid DType accepted")
	}
}

func TestFloat32Helpers(t *testing.T) {
	x := []float32{1, -0.5, 3.140625, 65504, float32(math.Inf(-1))}
	for _, dt := range []DType{F32, F64, F16, BF16} {
		tn, err := FromFloat32(dt, []int{5}, x)
		if err != nil {
			t.Fatal(err)
		}
		if len(tn.Data) != 5*dt.Bits()/8 {
			t.Fatalf("%v: %d bytes", dt, len(tn.Data))
		}
		got := make([]float32, 5)
		if err := tn.DecodeFloat32(got); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(x)
		if dt == BF16 {
			want[2], want[3] = 3.140625, 65536 // 8-bit significand rounding
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v: got %v, want %v", dt, got, want)
		}
	}
	if _, err := FromFloat32(I32, []int{1}, []float32{1}); err == nil {
		t.Error("FromFloat32(I32) succeeded")
	}
	if _, err := FromFloat32(F32, []int{2, 2}, x); err == nil || !strings.Contains(err.Error(), "shape [2 2] has 4 elements, got 5 values") {
		t.Errorf("FromFloat32 wrong count error = %v", err)
	}
	tn := Tensor{F32, []int{5}, Float32Bytes(x)}
	v, ok := tn.Float32View()
	if !ok || &v[0] != &x[0] {
		t.Fatal("Float32View/Float32Bytes did not alias")
	}
	mis := make([]byte, 9)[1:] // heap allocations are 8-aligned, so this is not
	if _, ok := (Tensor{F32, []int{2}, mis}).Float32View(); ok {
		t.Error("Float32View of misaligned data succeeded")
	}
	if _, ok := (Tensor{F16, []int{1}, []byte{0, 0}}).Float32View(); ok {
		t.Error("Float32View of F16 succeeded")
	}
	if err := (Tensor{I8, []int{1}, []byte{1}}).DecodeFloat32(make([]float32, 1)); err == nil {
		t.Error("DecodeFloat32 of I8 succeeded")
	}
}

// TestDecodeFloat32At: a range of a tensor's elements decodes as the same
// range of the whole decode, reading only its bytes; ranges outside the
// tensor and undecodable dtypes are refused.
func TestDecodeFloat32At(t *testing.T) {
	x := make([]float32, 12) // a (3, 4) matrix
	for i := range x {
		x[i] = float32(i) - 5.5
	}
	for _, dt := range []DType{F32, F64, F16, BF16} {
		tn, err := FromFloat32(dt, []int{3, 4}, x)
		if err != nil {
			t.Fatal(err)
		}
		whole := make([]float32, 12)
		if err := tn.DecodeFloat32(whole); err != nil {
			t.Fatal(err)
		}
		for _, r := range [][2]int{{0, 12}, {4, 8}, {5, 7}, {11, 12}, {12, 12}} {
			got := make([]float32, r[1]-r[0])
			n, err := tn.DecodeFloat32At(got, r[0])
			if err != nil {
				t.Fatalf("%v %v: %v", dt, r, err)
			}
			if !slices.Equal(got, whole[r[0]:r[1]]) || n != len(got)*dt.Bits()/8 {
				t.Errorf("%v elements %v: %v (%d bytes), want %v (%d bytes)", dt, r, got, n, whole[r[0]:r[1]], len(got)*dt.Bits()/8)
			}
		}
		for _, r := range [][2]int{{-1, 1}, {10, 3}, {13, 0}} {
			if _, err := tn.DecodeFloat32At(make([]float32, r[1]), r[0]); err == nil || !strings.Contains(err.Error(), "want a range within its 12 elements") {
				t.Errorf("%v: %d elements from %d: %v", dt, r[1], r[0], err)
			}
		}
	}
	if _, err := (Tensor{I8, []int{2}, []byte{1, 2}}).DecodeFloat32At(make([]float32, 1), 1); err == nil || !strings.Contains(err.Error(), "cannot decode I8") {
		t.Errorf("DecodeFloat32At of I8: %v", err)
	}
	if _, err := (Tensor{F32, []int{2}, []byte{1, 2}}).DecodeFloat32At(make([]float32, 1), 1); err == nil {
		t.Error("DecodeFloat32At of a tensor missing bytes succeeded")
	}
}

func TestEncodeRejectsBadTensors(t *testing.T) {
	cases := []struct {
		tensors map[string]Tensor
		want    string
	}{
		{map[string]Tensor{"w": {F32, []int{2, 3}, make([]byte, 20)}}, "safetensors: tensor w: F32[2 3] needs 24 bytes, Data has 20"},
		{map[string]Tensor{"w": {F4, []int{3}, make([]byte, 2)}}, "safetensors: tensor w: F4 tensor of shape [3] is 12 bits, not a whole number of bytes"},
		{map[string]Tensor{"w": {DType(99), []int{1}, nil}}, "safetensors: tensor w: invalid dtype DType(99)"},
		{map[string]Tensor{"w": {F32, []int{-1}, nil}}, "safetensors: tensor w: negative dimension in shape [-1]"},
		{map[string]Tensor{"__metadata__": {U8, []int{1}, []byte{1}}}, `safetensors: tensor name "__metadata__" is reserved`},
		{map[string]Tensor{"\xff": {U8, []int{1}, []byte{1}}}, `safetensors: tensor name "\xff" is not valid UTF-8`},
	}
	for _, c := range cases {
		_, err := Encode(&bytes.Buffer{}, c.tensors, nil)
		if err == nil || err.Error() != c.want {
			t.Errorf("Encode error = %v\nwant %s", err, c.want)
		}
	}
}

// TestWriteFileKeepsOldMapping checks that rewriting a file does not disturb
// an open mapping of the old one (the temp file is renamed over it).
func TestWriteFileKeepsOldMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	old := map[string]Tensor{"a": {U8, []int{4}, []byte{1, 2, 3, 4}}}
	if err := WriteFile(path, old, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteFile(path, map[string]Tensor{"a": {U8, []int{4}, []byte{9, 9, 9, 9}}}, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := f.Tensor("a")
	if !bytes.Equal(a.Data, []byte{1, 2, 3, 4}) {
		t.Errorf("old mapping now reads %v", a.Data)
	}
	g, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ = g.Tensor("a")
	if !bytes.Equal(a.Data, []byte{9, 9, 9, 9}) {
		t.Errorf("new file reads %v", a.Data)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temp files left behind: %v", entries)
	}
}

func TestOpenMissingFile(t *testing.T) {
	_, err := Open("testdata/does-not-exist.safetensors")
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "testdata/does-not-exist.safetensors") {
		t.Errorf("Open missing = %v", err)
	}
}

// TestHeaderJSONMatchesEncode: in Encode's data order, HeaderJSON is the
// header Encode writes, less its padding; bad input is refused.
func TestHeaderJSONMatchesEncode(t *testing.T) {
	tensors := map[string]Tensor{
		"b.weight": {DType: F32, Shape: []int{2, 3}, Data: make([]byte, 24)},
		"a\"q\n":   {DType: BF16, Shape: []int{4}, Data: make([]byte, 8)},
		"scalar":   {DType: I64, Shape: []int{}, Data: make([]byte, 8)},
	}
	head, order, err := HeaderBytes(tensors, nil)
	if err != nil {
		t.Fatal(err)
	}
	list := make([]Tensor, len(order))
	for i, name := range order {
		list[i] = tensors[name]
	}
	js, err := HeaderJSON(order, list)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimRight(string(head), " "); js != want {
		t.Errorf("HeaderJSON = %s\nEncode's header = %s", js, want)
	}
	if _, err := HeaderJSON([]string{"x"}, []Tensor{{DType: F32, Shape: []int{2}, Data: make([]byte, 4)}}); err == nil || !strings.Contains(err.Error(), "tensor x") {
		t.Errorf("short data: err %v", err)
	}
	if _, err := HeaderJSON([]string{"x", "y"}, list[:1]); err == nil {
		t.Error("2 names for 1 tensor: no error")
	}
}
