package torchpt

import (
	"encoding/binary"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
)

// Streams written by CPython's pickle (tools/golden/megatron_ckpt.py's
// interpreter, Python 3.11), with the expression that made them.
var pyPickles = map[string]string{
	// pickle.dumps({"a": [1, -2, 3.5, None, True, "s\n'q"], "b": (1, 2), "big": 2**70, "neg": -2**65}, protocol=0)
	"p0_mixed": "(dp0\nVa\np1\n(lp2\nI1\naI-2\naF3.5\naNaI01\naVs\\u000a'q\np3\nasVb\np4\n(I1\nI2\ntp5\nsVbig\np6\nL1180591620717411303424L\nsVneg\np7\nL-36893488147419103232L\ns.",
	// pickle.dumps(collections.OrderedDict([("x", 1), ("y", b"\x00\xff")]), protocol=2)
	"p2_ordered": "\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00xq\x02K\x01X\x01\x00\x00\x00yq\x03c_codecs\nencode\nq\x04X\x03\x00\x00\x00\x00\xc3\xbfq\x05X\x06\x00\x00\x00latin1q\x06\x86q\x07Rq\x08u.",
	// l = [1, 2]; pickle.dumps({"l1": l, "l2": l, "tup": (l, l)}, protocol=4)
	"p4_shared": "\x80\x04\x95%\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x02l1\x94]\x94(K\x01K\x02e\x8c\x02l2\x94h\x02\x8c\x03tup\x94h\x02h\x02\x86\x94u.",
	// pickle.dumps({"s": {1, 2}, "f": frozenset([3]), "t": (), "u": "é"*3}, protocol=5)
	"p5_set": "\x80\x05\x95,\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01s\x94\x8f\x94(K\x01K\x02\x90\x8c\x01f\x94(K\x03\x91\x94\x8c\x01t\x94)\x8c\x01u\x94\x8c\x06\xc3\xa9\xc3\xa9\xc3\xa9\x94u.",
}

func mustUnpickle(t *testing.T, s string) any {
	t.Helper()
	v, n, err := Unpickle([]byte(s), nil)
	if err != nil {
		t.Fatalf("Unpickle: %v", err)
	}
	if n != len(s) {
		t.Fatalf("consumed %d of %d bytes", n, len(s))
	}
	return v
}

func get(t *testing.T, d any, key any) any {
	t.Helper()
	dd, ok := d.(*Dict)
	if !ok {
		t.Fatalf("%v is a %s, not a dict", d, typeName(d))
	}
	v, ok := dd.Get(key)
	if !ok {
		t.Fatalf("no key %v in %v", key, dd.Keys())
	}
	return v
}

func TestUnpickleCPython(t *testing.T) {
	v := mustUnpickle(t, pyPickles["p0_mixed"])
	a := get(t, v, "a").(*List)
	if want := []any{int64(1), int64(-2), 3.5, nil, true, "s\n'q"}; !reflect.DeepEqual(a.Items, want) {
		t.Errorf("a = %#v, want %#v", a.Items, want)
	}
	if b := get(t, v, "b"); !reflect.DeepEqual(b, Tuple{int64(1), int64(2)}) {
		t.Errorf("b = %#v", b)
	}
	want70 := new(big.Int).Lsh(big.NewInt(1), 70)
	if got := get(t, v, "big").(*big.Int); got.Cmp(want70) != 0 {
		t.Errorf("big = %v, want 2**70", got)
	}
	want65 := new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 65))
	if got := get(t, v, "neg").(*big.Int); got.Cmp(want65) != 0 {
		t.Errorf("neg = %v, want -2**65", got)
	}

	od := mustUnpickle(t, pyPickles["p2_ordered"]).(*Dict)
	if !reflect.DeepEqual(od.Keys(), []any{"x", "y"}) || get(t, od, "x") != int64(1) || !reflect.DeepEqual(get(t, od, "y"), Bytes{0, 0xff}) {
		t.Errorf("OrderedDict = %v %v", od.Keys(), od.Values())
	}

	sh := mustUnpickle(t, pyPickles["p4_shared"])
	l1, l2 := get(t, sh, "l1").(*List), get(t, sh, "l2").(*List)
	tup := get(t, sh, "tup").(Tuple)
	if l1 != l2 || tup[0] != l1 || tup[1] != l1 || len(l1.Items) != 2 {
		t.Errorf("memoised list not shared: %p %p %v", l1, l2, tup)
	}

	st := mustUnpickle(t, pyPickles["p5_set"])
	if s := get(t, st, "s").(*Set); !reflect.DeepEqual(s.Items, []any{int64(1), int64(2)}) {
		t.Errorf("set = %v", s.Items)
	}
	if s := get(t, st, "f").(*Set); !reflect.DeepEqual(s.Items, []any{int64(3)}) {
		t.Errorf("frozenset = %v", s.Items)
	}
	if get(t, st, "u") != "ééé" || !reflect.DeepEqual(get(t, st, "t"), Tuple{}) {
		t.Errorf("u, t = %v, %v", get(t, st, "u"), get(t, st, "t"))
	}
}

// TestUnpickleOpcodes covers opcodes CPython no longer writes by default
// (Python 2 strings, INST, OBJ, copyreg) and the placeholder objects.
func TestUnpickleOpcodes(t *testing.T) {
	cases := []struct {
		name, in string
		want     any
	}{
		{"STRING escapes", "S'a\\'b\\x41\\n'\n.", "a'bA\n"},
		{"SHORT_BINSTRING", "U\x03abc.", "abc"},
		{"BININT negative", "J\xff\xff\xff\xff.", int64(-1)},
		{"BININT2", "M\x01\x02.", int64(0x0201)},
		{"LONG1 negative", "\x8a\x02\x00\xff.", int64(-256)},
		{"LONG1 zero", "\x8a\x00.", int64(0)},
		{"LONG4", "\x8b\x01\x00\x00\x00\x05.", int64(5)},
		{"BINFLOAT", "G?\xf8\x00\x00\x00\x00\x00\x00.", 1.5},
		{"UNICODE escape", "V\\u00e9\\U0001f600x\n.", "é😀x"},
		{"POP, DUP, POP_MARK", "(K\x01K\x020(K\x03K\x041K\x052t.", Tuple{int64(1), int64(5), int64(5)}},
		{"TUPLE1..3", "K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87\x87.", Tuple{Tuple{int64(1)}, Tuple{int64(1), int64(2)}, Tuple{int64(1), int64(2), int64(3)}}},
		{"DICT", "(K\x01K\x02K\x03K\x04d.", nil}, // checked below
		{"BINBYTES8", "\x8e\x02\x00\x00\x00\x00\x00\x00\x00hi.", Bytes("hi")},
		{"BYTEARRAY8", "\x96\x01\x00\x00\x00\x00\x00\x00\x00z.", Bytes("z")},
		{"STACK_GLOBAL", "\x8c\x05torch\x8c\x07float32\x93.", &Global{Module: "torch", Name: "float32"}},
		{"GET/PUT text memo", "K\x07p3\n0g3\n.", int64(7)},
		{"LONG_BINPUT/GET", "K\x08r\x00\x00\x01\x000j\x00\x00\x01\x00.", int64(8)},
		{"bytes via _codecs", "c_codecs\nencode\nX\x04\x00\x00\x00\xc3\xbfabX\x06\x00\x00\x00latin1\x86R.", Bytes{0xff, 'a', 'b'}},
		{"torch.Size", "ctorch\nSize\nK\x02K\x03\x86\x85R.", Tuple{int64(2), int64(3)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := mustUnpickle(t, c.in)
			if c.name == "DICT" {
				if get(t, v, int64(1)) != int64(2) || get(t, v, int64(3)) != int64(4) {
					t.Errorf("DICT = %v", v)
				}
				return
			}
			if !reflect.DeepEqual(v, c.want) {
				t.Errorf("got %#v, want %#v", v, c.want)
			}
		})
	}

	// An unknown class: NEWOBJ + BUILD keeps arguments and state; a second
	// BUILD with a dict merges into it (obj.__dict__.update).
	o := mustUnpickle(t, "\x80\x02cmegatron.enums\nThing\nK\x01\x85\x81}X\x01\x00\x00\x00aK\x01sb}X\x01\x00\x00\x00bK\x02sb.").(*Object)
	if o.ClassName() != "megatron.enums.Thing" || !reflect.DeepEqual(o.Args, Tuple{int64(1)}) {
		t.Errorf("object %s %v", o.ClassName(), o.Args)
	}
	if a, _ := o.Attr("a"); a != int64(1) {
		t.Errorf("attr a = %v", a)
	}
	if b, _ := o.Attr("b"); b != int64(2) {
		t.Errorf("attr b = %v", b)
	}
	// INST and OBJ (protocol 0/1 instances), copyreg._reconstructor, and
	// SETITEMS/APPENDS on a placeholder (a dict or list subclass).
	inst := mustUnpickle(t, "(K\x01imod\nCls\n.").(*Object)
	if inst.ClassName() != "mod.Cls" || !reflect.DeepEqual(inst.Args, Tuple{int64(1)}) {
		t.Errorf("INST %s %v", inst.ClassName(), inst.Args)
	}
	obj := mustUnpickle(t, "(cmod\nCls\nK\x02o(K\x01K\x02u(K\x03e.").(*Object)
	if obj.ClassName() != "mod.Cls" || obj.Items.Len() != 1 || !reflect.DeepEqual(obj.ListItems, []any{int64(3)}) {
		t.Errorf("OBJ %s %v items %v list %v", obj.ClassName(), obj.Args, obj.Items, obj.ListItems)
	}
	rc := mustUnpickle(t, "ccopy_reg\n_reconstructor\n(cargparse\nNamespace\nc__builtin__\nobject\nNtR}U\x01xK\x05sb.").(*Object)
	if x, _ := rc.Attr("x"); rc.ClassName() != "argparse.Namespace" || x != int64(5) {
		t.Errorf("_reconstructor: %s x=%v", rc.ClassName(), x)
	}
	// BUILD on an OrderedDict keeps its attributes (a state dict's _metadata).
	od := mustUnpickle(t, "\x80\x02ccollections\nOrderedDict\n)R}U\x09_metadataK\x01sb.").(*Dict)
	if md, _ := od.Attrs.(*Dict).Get("_metadata"); md != int64(1) {
		t.Errorf("OrderedDict attrs %v", od.Attrs)
	}
}

func TestUnpickleErrors(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"empty", "", "truncated"},
		{"no STOP", "K\x01", "truncated"},
		{"short length", "X\xff\x00\x00\x00ab.", "runs past the end"},
		{"huge BINBYTES8", "\x8e\xff\xff\xff\xff\xff\xff\xff\xff.", "runs past the end"},
		{"negative LONG4", "\x8b\xff\xff\xff\xff.", "negative length"},
		{"underflow", "t.", "no MARK"},
		{"underflow pop", "0.", "stack underflow"},
		{"below mark", "(\x85.", "stack underflow"},
		{"STOP on empty", ".", "empty stack"},
		{"unknown opcode", "\xff.", "unknown opcode"},
		{"protocol 6", "\x80\x06N.", "unsupported pickle protocol 6"},
		{"memo miss", "h\x05.", "never stored"},
		{"unhashable key", "}]K\x01s.", "unhashable"},
		{"odd SETITEMS", "}(K\x01u.", "odd"},
		{"APPEND to int", "K\x01K\x02a.", "not a list"},
		{"SETITEM on int", "K\x01K\x02K\x03s.", "not a dict"},
		{"ADDITEMS on list", "](K\x01\x90.", "not a set"},
		{"REDUCE args not tuple", "cmod\nf\nK\x01R.", "not a tuple"},
		{"call of int", "K\x01)R.", "not callable"},
		{"EXT1", "\x82\x01.", "extension registry"},
		{"out-of-band buffer", "\x97.", "out-of-band"},
		{"persistent id", "K\x01Q.", "without a persistent loader"},
		{"bad UTF-8", "\x8c\x01\xff.", "UTF-8"},
		{"bad INT", "Iabc\n.", "not an integer"},
		{"bad FLOAT", "Fx\n.", "FLOAT"},
		{"unquoted STRING", "Sabc\n.", "not quoted"},
		{"STACK_GLOBAL of ints", "K\x01K\x02\x93.", "want two str"},
		{"deep tuple key", "}K\x01" + strings.Repeat("\x85", 200) + "K\x01s.", "nested more than"},
		{"bad latin-1", "c_codecs\nencode\nX\x04\x00\x00\x00\xf0\x9f\x98\x80X\x06\x00\x00\x00latin1\x86R.", "not latin-1"},
		{"tensor of non-storage", "ctorch._utils\n_rebuild_tensor_v2\n(K\x01K\x00)))tR.", "want a storage"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Unpickle([]byte(c.in), nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "pickle: offset ") {
				t.Errorf("err %q does not give the offset", err)
			}
		})
	}
}

// TestTensorViews: _rebuild_tensor_v2 views are checked against their
// storage and read with their strides.
func TestTensorViews(t *testing.T) {
	f := &File{Path: "mem", storages: map[string]*Storage{}}
	st := []float32{0, 0.5, 2, 3, 4, 5}
	data := make([]byte, 4*len(st))
	for i, x := range st {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	pl := func(pid any) (any, error) {
		st, err := f.storageFromPID(pid)
		if err == nil {
			st.(*Storage).rec = &record{size: int64(len(data)), at: strings.NewReader(string(data))}
		}
		return st, err
	}
	// _rebuild_tensor_v2(storage('0', FloatStorage, numel 6), offset, size, stride, False, OrderedDict())
	mk := func(offset, size, stride string) string {
		return "\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ" +
			offset + size + stride + "\x89ccollections\nOrderedDict\n)RtR."
	}
	v, _, err := Unpickle([]byte(mk("K\x01", "K\x02K\x02\x86", "K\x01K\x02\x86")), pl) // a transposed 2×2 view from offset 1
	if err != nil {
		t.Fatal(err)
	}
	tt := v.(*Tensor)
	got, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{st[1], st[3], st[2], st[4]} // (i, j) is storage[1 + i + 2j]
	if !reflect.DeepEqual(got, want) {
		t.Errorf("strided view = %v, want %v", got, want)
	}
	for _, c := range []struct{ off, size, stride, want string }{
		{"K\x05", "K\x02\x85", "K\x01\x85", "reaches element 6"},
		{"J\xff\xff\xff\xff", "K\x01\x85", "K\x01\x85", "storage offset"},
		{"K\x00", "K\x02K\x02\x86", "K\x01\x85", "differ in rank"},
		{"K\x00", "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40K\x02\x86", "K\x01K\x01\x86", "too many elements"},
		{"K\x00", "J\xff\xff\xff\xff\x85", "K\x01\x85", "negative"},
		{"K\x00", "X\x01\x00\x00\x00a\x85", "K\x01\x85", "want an int"},
	} {
		if _, _, err := Unpickle([]byte(mk(c.off, c.size, c.stride)), pl); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("view offset %q size %q stride %q: err %v, want %q", c.off, c.size, c.stride, err, c.want)
		}
	}
}
