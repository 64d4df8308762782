package torchpt

import (
	"encoding/json"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// sample is a checkpoint-like value using every kind the writer pickles.
func sample(t *testing.T) (any, []float32) {
	t.Helper()
	w := []float32{1, -2.5, 3.25, float32(math.Inf(1)), 0, 1e-30}
	wt, err := NewTensor([]int64{2, 3}, w)
	if err != nil {
		t.Fatal(err)
	}
	scalar, _ := NewTensor(nil, []float32{7})
	// A strided view of wt's storage: its second column.
	col := &Tensor{Storage: wt.Storage, Offset: 1, Shape: []int64{2}, Stride: []int64{3}}
	ns := NewDict()
	ns.Set("num_layers", int64(2))
	ns.Set("lr", 3e-4)
	ns.Set("tokenizer_type", "GPT2BPETokenizer")
	ns.Set("swiglu", false)
	ns.Set("data_path", &List{Items: []any{"a", "b"}})
	ns.Set("load", nil)
	args := &Object{Class: &Global{"argparse", "Namespace"}, Args: Tuple{}, State: ns}
	model := NewDict()
	model.Set("embedding.word_embeddings.weight", wt)
	model.Set("step", scalar)
	model.Set("col", col)
	ints := &List{Items: []any{int64(0), int64(255), int64(256), int64(65535), int64(65536), int64(-1), int64(math.MinInt32), int64(math.MaxInt32),
		int64(math.MaxInt32) + 1, int64(math.MinInt64), int64(math.MaxInt64), new(big.Int).Lsh(big.NewInt(1), 70)}}
	root := NewDict()
	root.Set("args", args)
	root.Set("checkpoint_version", 3.0)
	root.Set("iteration", int64(1234567))
	root.Set("model", model)
	root.Set("ints", ints)
	root.Set("tuple", Tuple{int64(1), "two", 3.5, Tuple{}, Tuple{true}})
	root.Set("bytes", Bytes{0, 1, 0xff, 'a'})
	root.Set("unicode", "héllo ✓")
	root.Set(int64(5), "int key")
	big := make([]any, 2500) // more than one APPENDS batch
	for i := range big {
		big[i] = int64(i)
	}
	root.Set("long_list", &List{Items: big})
	return root, w
}

func TestWriteRoundTrip(t *testing.T) {
	root, w := sample(t)
	path := filepath.Join(t.TempDir(), "model_optim_rng.pt")
	if err := Save(path, root); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := f.Root.(*Dict)
	want := root.(*Dict)
	if !reflect.DeepEqual(d.Keys(), want.Keys()) {
		t.Fatalf("keys %v, want %v", d.Keys(), want.Keys())
	}
	for _, k := range []string{"checkpoint_version", "iteration", "tuple", "bytes", "unicode"} {
		got, _ := d.Get(k)
		exp, _ := want.Get(k)
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("%s: %#v, want %#v", k, got, exp)
		}
	}
	gi, _ := d.Get("ints")
	wi, _ := want.Get("ints")
	for i, x := range gi.(*List).Items {
		e := wi.(*List).Items[i]
		if fmtAny(x) != fmtAny(e) {
			t.Errorf("ints[%d] = %v, want %v", i, x, e)
		}
	}
	if v, _ := d.Get(int64(5)); v != "int key" {
		t.Errorf("int key: %v", v)
	}
	ll, _ := d.Get("long_list")
	if n := len(ll.(*List).Items); n != 2500 || ll.(*List).Items[2499] != int64(2499) {
		t.Errorf("long_list: %d items", n)
	}
	a, _ := d.Get("args")
	ao := a.(*Object)
	if ao.ClassName() != "argparse.Namespace" {
		t.Errorf("args class %q", ao.ClassName())
	}
	if v, _ := ao.Attr("num_layers"); v != int64(2) {
		t.Errorf("args.num_layers = %v", v)
	}
	if v, _ := ao.Attr("data_path"); !reflect.DeepEqual(v, &List{Items: []any{"a", "b"}}) {
		t.Errorf("args.data_path = %v", v)
	}
	m, _ := d.Get("model")
	md := m.(*Dict)
	x, _ := md.Get("embedding.word_embeddings.weight")
	got, err := x.(*Tensor).Float32s()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) || !reflect.DeepEqual(x.(*Tensor).Shape, []int64{2, 3}) {
		t.Errorf("weight %v %v, want %v", x.(*Tensor).Shape, got, w)
	}
	c, _ := md.Get("col")
	if cv, _ := c.(*Tensor).Float32s(); !reflect.DeepEqual(cv, []float32{-2.5, 0}) {
		t.Errorf("strided view %v", cv)
	}
	if c.(*Tensor).Storage != x.(*Tensor).Storage {
		t.Error("the view does not share the weight's storage")
	}
	if n := len(f.Storages()); n != 2 {
		t.Errorf("%d storages, want 2 (the view shares one)", n)
	}
	s, _ := md.Get("step")
	if sv, _ := s.(*Tensor).Float32s(); len(sv) != 1 || sv[0] != 7 || len(s.(*Tensor).Shape) != 0 {
		t.Errorf("scalar %v shape %v", sv, s.(*Tensor).Shape)
	}
}

func fmtAny(v any) string {
	if b, ok := v.(*big.Int); ok {
		return b.String()
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestWriteErrors(t *testing.T) {
	if _, err := NewTensor([]int64{2, 2}, []float32{1}); err == nil || !strings.Contains(err.Error(), "4 elements, given 1") {
		t.Errorf("short data: %v", err)
	}
	if _, err := NewTensor([]int64{-1}, nil); err == nil {
		t.Error("negative shape accepted")
	}
	dir := t.TempDir()
	for _, v := range []any{make(chan int), "\xff", &List{Items: []any{struct{}{}}}} {
		if err := Save(filepath.Join(dir, "x.pt"), v); err == nil {
			t.Errorf("%T pickled", v)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.pt")); !os.IsNotExist(err) {
		t.Errorf("a failed save left a file: %v", err)
	}
	if err := Save(filepath.Join(dir, "no", "such", "x.pt"), int64(1)); err == nil || !strings.Contains(err.Error(), "x.pt") {
		t.Errorf("missing directory: %v", err)
	}
}

// torchPython returns /usr/bin/python3 if it imports torch, else skips.
func torchPython(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("PyTorch cross-check skipped: %s not found", py)
	}
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("PyTorch cross-check skipped: %s cannot import torch: %v %s", py, err, out)
	}
	return py
}

// TestWriteLoadsInPyTorch checks that torch.load reads what Save writes:
// every key, the Namespace's fields, the ints and the tensors' values and
// strides (the view shares the weight's storage).
func TestWriteLoadsInPyTorch(t *testing.T) {
	py := torchPython(t)
	root, _ := sample(t)
	path := filepath.Join(t.TempDir(), "model_optim_rng.pt")
	if err := Save(path, root); err != nil {
		t.Fatal(err)
	}
	script := `
import sys, json, torch
d = torch.load(sys.argv[1], map_location="cpu")
m = d["model"]
w, col, step = m["embedding.word_embeddings.weight"], m["col"], m["step"]
out = {
  "keys": [str(k) for k in d.keys()],
  "args": sorted(vars(d["args"]).items()),
  "args_class": type(d["args"]).__module__ + "." + type(d["args"]).__name__,
  "ints": [str(i) for i in d["ints"]],
  "tuple": repr(d["tuple"]), "bytes": repr(d["bytes"]), "unicode": d["unicode"],
  "int_key": d[5], "long_list": [len(d["long_list"]), d["long_list"][-1]],
  "version": d["checkpoint_version"], "iteration": d["iteration"],
  "w": [repr(x) for x in w.flatten().tolist()], "w_shape": list(w.shape), "w_dtype": str(w.dtype),
  "col": col.tolist(), "col_stride": list(col.stride()), "shared": col.storage().data_ptr() == w.storage().data_ptr(),
  "step": step.item(), "step_dim": step.dim(),
}
print(json.dumps(out))
`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	if err != nil {
		t.Fatalf("torch.load: %v\n%s", err, out)
	}
	var got map[string]any
	if err := json.Unmarshal(out[strings.LastIndexByte(strings.TrimSpace(string(out)), '\n')+1:], &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := map[string]any{
		"keys":       []any{"args", "checkpoint_version", "iteration", "model", "ints", "tuple", "bytes", "unicode", "5", "long_list"},
		"args":       []any{[]any{"data_path", []any{"a", "b"}}, []any{"load", nil}, []any{"lr", 3e-4}, []any{"num_layers", 2.0}, []any{"swiglu", false}, []any{"tokenizer_type", "GPT2BPETokenizer"}},
		"args_class": "argparse.Namespace",
		"ints":       []any{"0", "255", "256", "65535", "65536", "-1", "-2147483648", "2147483647", "2147483648", "-9223372036854775808", "9223372036854775807", "1180591620717411303424"},
		"tuple":      "(1, 'two', 3.5, (), (True,))", "bytes": `b'\x00\x01\xffa'`, "unicode": "héllo ✓",
		"int_key": "int key", "long_list": []any{2500.0, 2499.0},
		"version": 3.0, "iteration": 1234567.0,
		"w": []any{"1.0", "-2.5", "3.25", "inf", "0.0", "1.0000000031710769e-30"}, "w_shape": []any{2.0, 3.0}, "w_dtype": "torch.float32",
		"col": []any{-2.5, 0.0}, "col_stride": []any{3.0}, "shared": true,
		"step": 7.0, "step_dim": 0.0,
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s: torch.load gives %#v, want %#v", k, got[k], v)
		}
	}
}
