package torchpt

import (
	"archive/zip"
	"bytes"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// The edge fixtures are tools/golden/megatron_ckpt.py's edge_object(),
// saved by torch 1.13 as a zip archive and in the legacy format.
var edgeFiles = []string{"testdata/edge.pt", "testdata/edge_legacy.pt"}

func floats(t *testing.T, v any) []float32 {
	t.Helper()
	tt, ok := v.(*Tensor)
	if !ok {
		t.Fatalf("%v is a %s, not a tensor", v, typeName(v))
	}
	x, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestOpenEdge(t *testing.T) {
	for _, path := range edgeFiles {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Legacy != strings.Contains(path, "legacy") {
				t.Errorf("Legacy = %v", f.Legacy)
			}
			r := f.Root
			f32 := get(t, r, "f32").(*Tensor)
			if !reflect.DeepEqual(f32.Shape, []int64{3, 4}) || f32.DType() != safetensors.F32 {
				t.Errorf("f32: %v %v", f32.DType(), f32.Shape)
			}
			if got := floats(t, f32); !reflect.DeepEqual(got, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
				t.Errorf("f32 = %v", got)
			}
			tr := get(t, r, "transposed").(*Tensor)
			if tr.Storage != f32.Storage {
				t.Errorf("the transposed view does not share f32's storage")
			}
			if got := floats(t, tr); !reflect.DeepEqual(got, []float32{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}) {
				t.Errorf("transposed = %v", got)
			}
			if got := floats(t, get(t, r, "row")); !reflect.DeepEqual(got, []float32{4, 5, 6, 7}) {
				t.Errorf("row = %v", got)
			}
			for key, want := range map[string][]float32{
				"bf16": {1, -2.5, 3.140625}, "f16": {0.5, 65504, -0.0009765625}, "f64": {float32(1.0 / 3.0)},
				"scalar": {2.5}, "empty": {}, "param": {1, 1},
			} {
				if got := floats(t, get(t, r, key)); !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %v, want %v", key, got, want)
				}
			}
			if dt := get(t, r, "bf16").(*Tensor).DType(); dt != safetensors.BF16 {
				t.Errorf("bf16 dtype %v", dt)
			}
			if _, err := get(t, r, "i64").(*Tensor).Float32s(); err == nil || !strings.Contains(err.Error(), "I64, not a floating-point type") || !strings.Contains(err.Error(), path) {
				t.Errorf("i64 Float32s: %v", err)
			}
			lin := get(t, r, "linear").(*Dict)
			if got := floats(t, get(t, lin, "weight")); !reflect.DeepEqual(got, []float32{1, 2, 3, 4, 5, 6}) {
				t.Errorf("linear.weight = %v", got)
			}
			if md, ok := lin.Attrs.(*Dict); !ok || md.Len() != 1 {
				t.Errorf("state dict _metadata: %v", lin.Attrs)
			}
			ns := get(t, r, "ns").(*Object)
			if ns.ClassName() != "argparse.Namespace" {
				t.Errorf("ns class %q", ns.ClassName())
			}
			attr := func(k string) any { v, _ := ns.Attr(k); return v }
			if attr("a") != int64(1) || attr("b") != "x" || attr("c") != nil || attr("neg") != int64(-5) || attr("f") != 1.5 {
				t.Errorf("ns scalars: %v", ns.Attrs().Values())
			}
			if g, ok := attr("dt").(*Global); !ok || g.String() != "torch.bfloat16" {
				t.Errorf("ns.dt = %v", attr("dt"))
			}
			if b, ok := attr("big").(*big.Int); !ok || b.Cmp(new(big.Int).Lsh(big.NewInt(1), 70)) != 0 {
				t.Errorf("ns.big = %v", attr("big"))
			}
			if !reflect.DeepEqual(attr("l").(*List).Items, []any{int64(1), int64(2)}) || !reflect.DeepEqual(attr("t"), Tuple{int64(1), int64(2)}) {
				t.Errorf("ns.l, ns.t = %v, %v", attr("l"), attr("t"))
			}
			// Megatron's enum member: getattr(AttnBackend, 'flash'), a placeholder.
			if e, ok := attr("backend").(*Object); !ok || len(e.Args) != 2 || e.Args[1] != "flash" {
				t.Errorf("ns.backend = %#v", attr("backend"))
			}
			if !reflect.DeepEqual(get(t, r, "bytes"), Bytes{0, 0xff, 'a', 'b', 'c'}) {
				t.Errorf("bytes = %v", get(t, r, "bytes"))
			}
			if bio := get(t, r, "bio").(*Object); bio.ClassName() != "_io.BytesIO" {
				t.Errorf("bio = %s", bio.ClassName())
			}
			keys := get(t, r, "keys").(*Dict)
			if keys.Len() != 3 || get(t, keys, int64(1)) != "true overrides 1" || get(t, keys, true) != "true overrides 1" || get(t, keys, Tuple{int64(1), int64(2)}) != "pair" {
				t.Errorf("keys = %v %v", keys.Keys(), keys.Values())
			}
			if np := get(t, r, "np").(*Object); np.ClassName() != "numpy.core.multiarray._reconstruct" {
				t.Errorf("np = %s", np.ClassName())
			}
			if get(t, r, "unicode") != "h\u00e9llo \u2713" {
				t.Errorf("unicode = %q", get(t, r, "unicode"))
			}
			deep := get(t, get(t, r, "nested").(*List).Items[0].(*List).Items[0], "deep").(Tuple)
			if get(t, deep[1].(*List).Items[1], "x") != 3.0 {
				t.Errorf("nested = %v", deep)
			}
			if err := f.Close(); err != nil {
				t.Error(err)
			}
			if _, err := f32.Float32s(); err == nil {
				t.Error("reading after Close succeeded")
			}
		})
	}
}

// rezip copies the zip archive src into a new archive, letting edit drop
// (return nil) or change each record's bytes.
func rezip(t *testing.T, src string, edit func(name string, b []byte) []byte, extra ...string) []byte {
	t.Helper()
	zr, err := zip.OpenReader(src)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, zf := range zr.File {
		rc, err := zf.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if b = edit(zf.Name, b); b == nil {
			continue
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: zf.Name, Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
	}
	for i := 0; i+1 < len(extra); i += 2 { // name, contents
		w, err := zw.CreateHeader(&zip.FileHeader{Name: extra[i], Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(extra[i+1]))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	zipBytes, _ := os.ReadFile("testdata/edge.pt")
	legacyBytes, _ := os.ReadFile("testdata/edge_legacy.pt")
	tar := make([]byte, 1024)
	copy(tar[257:], "ustar")
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty file"},
		{"text", []byte("hello, world\n"), "not a PyTorch checkpoint"},
		{"truncated zip", zipBytes[:len(zipBytes)/2], "not a valid zip archive"},
		{"truncated legacy", legacyBytes[:len(legacyBytes)-100], "truncated"},
		{"legacy pickle cut", legacyBytes[:300], "truncated"},
		{"plain pickle", []byte("\x80\x02K\x01."), "not a torch.save file"},
		{"tar", tar, "tar archive"},
		{"zip without data.pkl", rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte {
			if strings.HasSuffix(n, "data.pkl") {
				return nil
			}
			return b
		}), "without data.pkl"},
		{"missing storage", rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte {
			if strings.HasSuffix(n, "/data/0") {
				return nil
			}
			return b
		}), "is missing from the archive"},
		{"short storage", rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte {
			if strings.HasSuffix(n, "/data/0") {
				return b[:8]
			}
			return b
		}), "truncated"},
		{"corrupt pickle", rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte {
			if strings.HasSuffix(n, "data.pkl") {
				return b[:len(b)/2]
			}
			return b
		}), "data.pkl: pickle: offset"},
		{"big-endian", rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte { return b }, "edge/byteorder", "big"), "little-endian"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".pt")
			if err := os.WriteFile(path, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path)
			if err == nil {
				f.Close()
				t.Fatalf("Open succeeded, want an error mentioning %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want it to name %s and mention %q", err, path, c.want)
			}
		})
	}
	// torch >= 2.1 writes a byteorder record; "little" is accepted.
	little := filepath.Join(dir, "little.pt")
	os.WriteFile(little, rezip(t, "testdata/edge.pt", func(n string, b []byte) []byte { return b }, "edge/byteorder", "little"), 0o644)
	if f, err := Open(little); err != nil {
		t.Errorf("byteorder little: %v", err)
	} else {
		f.Close()
	}
	if _, err := Open(filepath.Join(dir, "nonexistent.pt")); err == nil || !strings.Contains(err.Error(), "nonexistent.pt") {
		t.Errorf("missing file: %v", err)
	}
}

// FuzzUnpickle: no input panics, and every value produced is walkable.
// Persistent ids resolve to storages of a fake file, so the tensor paths
// (_rebuild_tensor_v2, views, reads) run too.
func FuzzUnpickle(f *testing.F) {
	for _, s := range pyPickles {
		f.Add([]byte(s))
	}
	for _, p := range edgeFiles {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b))); err == nil {
			for _, zf := range zr.File {
				if strings.HasSuffix(zf.Name, "data.pkl") {
					rc, _ := zf.Open()
					pkl, _ := io.ReadAll(rc)
					rc.Close()
					f.Add(pkl)
				}
			}
		} else {
			f.Add(b)
		}
	}
	f.Add([]byte("\x80\x02cmegatron.enums\nThing\nK\x01\x85\x81}X\x01\x00\x00\x00aK\x01sb."))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := &File{Path: "fuzz", storages: map[string]*Storage{}}
		backing := strings.NewReader(strings.Repeat("\x3f", 4096))
		pl := func(pid any) (any, error) {
			st, err := file.storageFromPID(pid)
			if err == nil && st.(*Storage).rec == nil {
				st.(*Storage).rec = &record{size: 4096, at: backing}
			}
			return st, err
		}
		v, n, err := Unpickle(data, pl)
		if n < 0 || n > len(data) {
			t.Fatalf("consumed %d of %d bytes", n, len(data))
		}
		if err == nil {
			walk(v, 0)
		}
	})
}

// walk visits a value as a consumer would, reading every tensor.
func walk(v any, depth int) {
	if depth > 50 {
		return
	}
	switch x := v.(type) {
	case *Dict:
		for i, k := range x.Keys() {
			x.Get(k)
			walk(x.Values()[i], depth+1)
		}
	case *List:
		for _, e := range x.Items {
			walk(e, depth+1)
		}
	case Tuple:
		for _, e := range x {
			walk(e, depth+1)
		}
	case *Object:
		x.ClassName()
		x.Attrs()
		walk(x.State, depth+1)
	case *Tensor:
		x.Float32s()
	}
}
