package torchpt

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// Storage is a PyTorch storage: Numel elements of DType, read on demand
// from the checkpoint file.
type Storage struct {
	// Key names the storage in the file (the zip record data/<Key>).
	Key string
	// Type is the storage class as pickled ("torch.FloatStorage", ...).
	Type string
	// DType is the element type; Known is false for storage classes the
	// reader cannot decode (quantized types), whose tensors fail to read.
	DType    safetensors.DType
	Known    bool
	Numel    int64
	Location string // "cpu", "cuda:0", ...

	file *File
	rec  *record // where the bytes are; set once the file's records are known
}

// storageTypes maps PyTorch's storage classes to element types.
var storageTypes = map[string]safetensors.DType{
	"FloatStorage":           safetensors.F32,
	"DoubleStorage":          safetensors.F64,
	"HalfStorage":            safetensors.F16,
	"BFloat16Storage":        safetensors.BF16,
	"LongStorage":            safetensors.I64,
	"IntStorage":             safetensors.I32,
	"ShortStorage":           safetensors.I16,
	"CharStorage":            safetensors.I8,
	"ByteStorage":            safetensors.U8,
	"BoolStorage":            safetensors.BOOL,
	"UntypedStorage":         safetensors.U8,
	"ComplexFloatStorage":    safetensors.C64,
	"Float8_e4m3fnStorage":   safetensors.F8_E4M3,
	"Float8_e5m2Storage":     safetensors.F8_E5M2,
	"Float8_e4m3fnuzStorage": safetensors.F8_E4M3FNUZ,
	"Float8_e5m2fnuzStorage": safetensors.F8_E5M2FNUZ,
}

func elemSize(dt safetensors.DType) int64 { return int64(dt.Bits() / 8) }

// Tensor is a strided view of a storage, as torch's _rebuild_tensor_v2
// describes it: element (i0, i1, ...) is storage[Offset + Σ ik·Stride[k]].
type Tensor struct {
	Storage *Storage
	Offset  int64
	Shape   []int64
	Stride  []int64
}

// maxElements bounds a tensor's element count and any index arithmetic
// (2^50 elements is petabytes: no real checkpoint comes near it).
const maxElements = 1 << 50

// maxOverlapping bounds the elements of a view that covers fewer storage
// elements than it has (stride 0).
const maxOverlapping = 1 << 24

// Numel is the number of elements.
func (t *Tensor) Numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d // bounded by newTensor
	}
	return n
}

// DType is the element type of the tensor's storage.
func (t *Tensor) DType() safetensors.DType { return t.Storage.DType }

// IntShape is Shape as ints.
func (t *Tensor) IntShape() []int {
	s := make([]int, len(t.Shape))
	for i, d := range t.Shape {
		s[i] = int(d)
	}
	return s
}

// newTensor checks a view against its storage.
func newTensor(st *Storage, offset any, size, stride any) (*Tensor, error) {
	off, ok := offset.(int64)
	if !ok || off < 0 {
		return nil, fmt.Errorf("tensor storage offset %v (%s): want an int >= 0", offset, typeName(offset))
	}
	shape, err := intTuple(size, "size")
	if err != nil {
		return nil, err
	}
	strides, err := intTuple(stride, "stride")
	if err != nil {
		return nil, err
	}
	if len(shape) != len(strides) {
		return nil, fmt.Errorf("tensor size %v and stride %v differ in rank", shape, strides)
	}
	t := &Tensor{Storage: st, Offset: off, Shape: shape, Stride: strides}
	n, last := int64(1), off
	for i, d := range shape {
		if d < 0 || strides[i] < 0 {
			return nil, fmt.Errorf("tensor size %v stride %v: negative", shape, strides)
		}
		if d != 0 && n > maxElements/d {
			return nil, fmt.Errorf("tensor size %v: too many elements", shape)
		}
		n *= d
	}
	if n == 0 {
		return t, nil
	}
	for i, d := range shape {
		if strides[i] > maxElements || (d-1) > maxElements/max(strides[i], 1) {
			return nil, fmt.Errorf("tensor size %v stride %v: index overflow", shape, strides)
		}
		last += (d - 1) * strides[i]
		if last > maxElements {
			return nil, fmt.Errorf("tensor size %v stride %v: index overflow", shape, strides)
		}
	}
	if last >= st.Numel {
		return nil, fmt.Errorf("tensor view (offset %d, size %v, stride %v) reaches element %d of storage %s, which holds %d", off, shape, strides, last, st.Key, st.Numel)
	}
	return t, nil
}

func intTuple(v any, what string) ([]int64, error) {
	t, ok := v.(Tuple)
	if !ok {
		if l, ok2 := v.(*List); ok2 {
			t, ok = Tuple(l.Items), true
		}
	}
	if !ok {
		return nil, fmt.Errorf("tensor %s is a %s, want a tuple of ints", what, typeName(v))
	}
	out := make([]int64, len(t))
	for i, x := range t {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("tensor %s %v: element %d is a %s, want an int", what, t, i, typeName(x))
		}
		out[i] = n
	}
	return out, nil
}

// contiguous reports whether the view is row-major without gaps.
func (t *Tensor) contiguous() bool {
	want := int64(1)
	for i := len(t.Shape) - 1; i >= 0; i-- {
		if t.Shape[i] != 1 && t.Stride[i] != want {
			return false
		}
		want *= t.Shape[i]
	}
	return true
}

// Float32s returns the tensor's elements in row-major order as float32
// (F32, F64 rounded, F16 and BF16 widened exactly).
func (t *Tensor) Float32s() ([]float32, error) {
	st := t.Storage
	switch {
	case !st.Known:
		return nil, fmt.Errorf("torchpt: %s: storage %s (%s) has an element type the reader does not decode", st.file.Path, st.Key, st.Type)
	case st.DType != safetensors.F32 && st.DType != safetensors.F64 && st.DType != safetensors.F16 && st.DType != safetensors.BF16:
		return nil, fmt.Errorf("torchpt: %s: storage %s is %v, not a floating-point type", st.file.Path, st.Key, st.DType)
	}
	n := t.Numel()
	if n == 0 {
		return []float32{}, nil
	}
	span := int64(1)
	for i, d := range t.Shape {
		span += (d - 1) * t.Stride[i]
	}
	if n > span && n > maxOverlapping {
		// Only overlapping views (stride 0: an expanded tensor) have more
		// elements than the storage span they cover.
		return nil, fmt.Errorf("torchpt: %s: storage %s: overlapping view of %d elements over %d (an expanded tensor): not supported", st.file.Path, st.Key, n, span)
	}
	es := elemSize(st.DType)
	raw, err := st.readBytes(t.Offset*es, span*es) // checks the size before allocating
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if t.contiguous() {
		err := safetensors.Tensor{DType: st.DType, Shape: []int{int(n)}, Data: raw}.DecodeFloat32(out)
		if err != nil {
			return nil, fmt.Errorf("torchpt: %s: storage %s: %v", st.file.Path, st.Key, err)
		}
		return out, nil
	}
	all := make([]float32, span)
	if err := (safetensors.Tensor{DType: st.DType, Shape: []int{int(span)}, Data: raw}).DecodeFloat32(all); err != nil {
		return nil, fmt.Errorf("torchpt: %s: storage %s: %v", st.file.Path, st.Key, err)
	}
	idx := make([]int64, len(t.Shape))
	for k := range out {
		var at int64
		for i, x := range idx {
			at += x * t.Stride[i]
		}
		out[k] = all[at]
		for i := len(idx) - 1; i >= 0; i-- {
			if idx[i]++; idx[i] < t.Shape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out, nil
}

// readBytes reads n bytes of the storage from byte offset off.
func (st *Storage) readBytes(off, n int64) ([]byte, error) {
	if st.rec == nil {
		return nil, fmt.Errorf("torchpt: %s: storage %s has no data record", st.file.Path, st.Key)
	}
	if off < 0 || n < 0 || n > st.rec.size || off > st.rec.size-n {
		return nil, fmt.Errorf("torchpt: %s: storage %s: bytes [%d, %d) past its %d-byte record (truncated file?)", st.file.Path, st.Key, off, off+n, st.rec.size)
	}
	b := make([]byte, n)
	if err := st.rec.readAt(b, off); err != nil {
		return nil, fmt.Errorf("torchpt: %s: storage %s: %w", st.file.Path, st.Key, err)
	}
	return b, nil
}

// construct is REDUCE, NEWOBJ, INST and OBJ: a call of fn with args. The
// callables PyTorch checkpoints need are interpreted; every other call
// builds an *Object placeholder.
func construct(fn any, args Tuple) (any, error) {
	g, ok := fn.(*Global)
	if !ok {
		switch fn.(type) {
		case *Object: // calling an instance (unknown semantics): keep the call
			return &Object{Class: fn, Args: args}, nil
		}
		return nil, fmt.Errorf("call of a %s, which is not callable", typeName(fn))
	}
	switch g.Module + "." + g.Name {
	case "collections.OrderedDict", "builtins.dict", "__builtin__.dict", "collections.defaultdict":
		d := NewDict()
		if g.Name != "defaultdict" && len(args) == 1 {
			if err := fillDict(d, args[0]); err != nil {
				return nil, err
			}
		}
		return d, nil
	case "builtins.list", "__builtin__.list":
		l := &List{}
		if len(args) == 1 {
			if src, ok := args[0].(*List); ok {
				l.Items = append(l.Items, src.Items...)
			} else if src, ok := args[0].(Tuple); ok {
				l.Items = append(l.Items, src...)
			}
		}
		return l, nil
	case "builtins.set", "builtins.frozenset", "__builtin__.set", "__builtin__.frozenset":
		s := &Set{}
		if len(args) == 1 {
			if src, ok := args[0].(*List); ok {
				s.Items = append(s.Items, src.Items...)
			} else if src, ok := args[0].(Tuple); ok {
				s.Items = append(s.Items, src...)
			}
		}
		return s, nil
	case "builtins.bytes", "builtins.bytearray", "__builtin__.bytearray":
		if len(args) == 0 {
			return Bytes{}, nil
		}
		if b, ok := args[0].(Bytes); ok {
			return append(Bytes(nil), b...), nil
		}
		if len(args) == 2 { // bytearray(str, encoding)
			return encodeStr(args)
		}
	case "_codecs.encode": // how protocol 2 pickles Python 3 bytes
		return encodeStr(args)
	case "copy_reg._reconstructor", "copyreg._reconstructor":
		if len(args) >= 1 {
			return &Object{Class: args[0], Args: args[1:]}, nil
		}
	case "copy_reg.__newobj__", "copyreg.__newobj__":
		if len(args) >= 1 {
			return construct(args[0], args[1:])
		}
	case "torch.Size":
		if len(args) == 1 {
			return args[0], nil
		}
	case "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor":
		if len(args) < 4 {
			return nil, fmt.Errorf("%s with %d arguments, want at least 4", g, len(args))
		}
		st, ok := args[0].(*Storage)
		if !ok {
			return nil, fmt.Errorf("%s of a %s, want a storage", g, typeName(args[0]))
		}
		return newTensor(st, args[1], args[2], args[3])
	case "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state":
		if len(args) >= 1 {
			if t, ok := args[0].(*Tensor); ok {
				return t, nil
			}
		}
	case "torch._tensor._rebuild_from_type_v2": // (func, type, args, state): a tensor subclass
		if len(args) >= 3 {
			if inner, ok := args[2].(Tuple); ok {
				v, err := construct(args[0], inner)
				if err != nil {
					return nil, err
				}
				if t, ok := v.(*Tensor); ok {
					return t, nil
				}
			}
		}
	}
	return &Object{Class: g, Args: args}, nil
}

// fillDict is dict(x) for a dict, or a list or tuple of pairs.
func fillDict(d *Dict, x any) error {
	switch s := x.(type) {
	case *Dict:
		for i, k := range s.keys {
			d.Set(k, s.vals[i])
		}
		return nil
	case *List:
		return fillPairs(d, s.Items)
	case Tuple:
		return fillPairs(d, s)
	}
	return nil
}

func fillPairs(d *Dict, items []any) error {
	for _, it := range items {
		var kv []any
		switch p := it.(type) {
		case Tuple:
			kv = p
		case *List:
			kv = p.Items
		}
		if len(kv) != 2 {
			return fmt.Errorf("dict() of a sequence whose element is a %s, not a pair", typeName(it))
		}
		if err := d.Set(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// encodeStr is _codecs.encode(str, encoding): latin-1 (what pickle uses
// for bytes) or UTF-8.
func encodeStr(args Tuple) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("_codecs.encode without arguments")
	}
	s, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("_codecs.encode of a %s, want a str", typeName(args[0]))
	}
	enc := "utf-8"
	if len(args) > 1 {
		if e, ok := args[1].(string); ok {
			enc = strings.ToLower(strings.ReplaceAll(e, "_", "-"))
		}
	}
	switch enc {
	case "latin1", "latin-1", "iso-8859-1", "iso8859-1":
		out := make(Bytes, 0, len(s))
		for _, r := range s {
			if r > 0xff {
				return nil, fmt.Errorf("_codecs.encode: %U is not latin-1", r)
			}
			out = append(out, byte(r))
		}
		return out, nil
	case "utf-8", "utf8", "ascii":
		return Bytes(s), nil
	}
	return nil, fmt.Errorf("_codecs.encode: unsupported encoding %q", enc)
}

// storageFromPID builds the storage a persistent id names: ('storage',
// storage class, key, location, numel[, view metadata]).
func (f *File) storageFromPID(pid any) (any, error) {
	t, ok := pid.(Tuple)
	if !ok || len(t) < 5 {
		return nil, fmt.Errorf("persistent id %s: want a ('storage', class, key, location, numel) tuple", typeName(pid))
	}
	if tag, _ := t[0].(string); tag != "storage" {
		return nil, fmt.Errorf("persistent id of kind %v: only 'storage' is supported", t[0])
	}
	cls, ok := t[1].(*Global)
	if !ok {
		return nil, fmt.Errorf("storage class is a %s, want a global", typeName(t[1]))
	}
	key, ok := t[2].(string)
	if !ok {
		return nil, fmt.Errorf("storage key is a %s, want a str", typeName(t[2]))
	}
	loc, _ := t[3].(string)
	numel, ok := t[4].(int64)
	if !ok || numel < 0 || numel > maxElements {
		return nil, fmt.Errorf("storage %s: numel %v is not a valid size", key, t[4])
	}
	if len(t) > 5 && t[5] != nil {
		return nil, fmt.Errorf("storage %s: views of legacy storages (view metadata %s) are not supported", key, typeName(t[5]))
	}
	if st, ok := f.storages[key]; ok { // the same storage, shared by several tensors
		if st.Numel != numel || st.Type != cls.String() {
			return nil, fmt.Errorf("storage %s named twice with different types or sizes", key)
		}
		return st, nil
	}
	st := &Storage{Key: key, Type: cls.String(), Numel: numel, Location: loc, file: f}
	if cls.Module == "torch" {
		st.DType, st.Known = storageTypes[cls.Name]
	}
	if st.Type == "torch.storage.UntypedStorage" {
		st.DType, st.Known = safetensors.U8, true
	}
	f.storages[key] = st
	f.order = append(f.order, key)
	return st, nil
}
