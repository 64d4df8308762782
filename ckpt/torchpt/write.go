package torchpt

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf8"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// The writer is the reader's inverse for the values a checkpoint holds:
// Save writes what torch.save (PyTorch 1.6 and later, pickle protocol 2, its
// default) writes — a zip archive of <name>/data.pkl, <name>/data/<key> per
// storage and <name>/version, records stored uncompressed and aligned to 64
// bytes as PyTorch aligns them — so that torch.load reads it and so does
// Open. Values are those of the reader (see value.go); *Dict is pickled as
// a plain dict (torch.load returns a dict, which load_state_dict accepts),
// *Object by NEWOBJ and BUILD (argparse.Namespace), *Tensor by
// torch._utils._rebuild_tensor_v2 over a persistent-id storage, as
// torch.save does.

// NewTensor returns a contiguous float32 tensor of the given shape holding
// data (copied), for Save. Its Float32s reads it back.
func NewTensor(shape []int64, data []float32) (*Tensor, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > maxElements/d) {
			return nil, fmt.Errorf("torchpt: tensor shape %v: want non-negative sizes under %d elements", shape, int64(maxElements))
		}
		n *= d
	}
	if n != int64(len(data)) {
		return nil, fmt.Errorf("torchpt: tensor shape %v holds %d elements, given %d", shape, n, len(data))
	}
	b := safetensors.Float32Bytes(data)
	b = append([]byte(nil), b...)
	st := &Storage{Type: "torch.FloatStorage", DType: safetensors.F32, Known: true, Numel: n, Location: "cpu",
		file: memFile, rec: &record{size: int64(len(b)), at: bytes.NewReader(b)}}
	stride := make([]int64, len(shape))
	s := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = s
		s *= max(shape[i], 1)
	}
	return &Tensor{Storage: st, Shape: append([]int64(nil), shape...), Stride: stride}, nil
}

// memFile names in-memory storages in errors.
var memFile = &File{Path: "(in-memory tensor)"}

// storageClass is the torch storage class of an element type.
func storageClass(dt safetensors.DType) (string, bool) {
	for name, d := range storageTypes {
		if d == dt && name != "UntypedStorage" {
			return name, true
		}
	}
	return "", false
}

// Save writes v to path as torch.save(v, path) would, through a temporary
// file renamed into place (a crash leaves the old file or none). The
// archive's top-level folder is the file's base name without extension,
// as torch.save names it.
func Save(path string, v any) error {
	dir, base := filepath.Split(path)
	name := base
	if ext := filepath.Ext(base); ext != "" && ext != base {
		name = base[:len(base)-len(ext)]
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("torchpt: save %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after the rename: no such file
	bw := bufio.NewWriterSize(tmp, 1<<20)
	err = Write(bw, name, v)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("torchpt: save %s: %w", path, err)
	}
	return nil
}

// Write writes v as a torch.save zip archive whose records are under name/.
func Write(w io.Writer, name string, v any) error {
	if name == "" {
		name = "archive"
	}
	p := &pickler{keys: map[*Storage]string{}}
	p.buf.Write([]byte{opProto, 2})
	if err := p.dump(v, 0); err != nil {
		return err
	}
	p.buf.WriteByte(opStop)
	cw := &countingWriter{w: w}
	zw := zip.NewWriter(cw)
	if err := storeRecord(zw, cw, name+"/data.pkl", p.buf.Bytes()); err != nil {
		return err
	}
	for _, st := range p.storages {
		es := elemSize(st.DType)
		b, err := st.readBytes(0, st.Numel*es)
		if err != nil {
			return err
		}
		if err := storeRecord(zw, cw, name+"/data/"+p.keys[st], b); err != nil {
			return err
		}
	}
	if err := storeRecord(zw, cw, name+"/version", []byte("3\n")); err != nil {
		return err
	}
	return zw.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// recordAlign is the alignment PyTorch's zip writer gives record data.
const recordAlign = 64

// storeRecord writes an uncompressed record whose data starts at a multiple
// of recordAlign (padding in an extra field, as PyTorch's "FB" field).
func storeRecord(zw *zip.Writer, cw *countingWriter, name string, data []byte) error {
	if err := zw.Flush(); err != nil {
		return err
	}
	fh := &zip.FileHeader{Name: name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(data),
		CompressedSize64: uint64(len(data)), UncompressedSize64: uint64(len(data))}
	const localHeader = 30
	at := cw.n + localHeader + int64(len(name)) + 4 // 4: the extra field's own header
	pad := (recordAlign - at%recordAlign) % recordAlign
	extra := make([]byte, 4+pad)
	binary.LittleEndian.PutUint16(extra[0:], 0x4246) // "FB"
	binary.LittleEndian.PutUint16(extra[2:], uint16(pad))
	fh.Extra = extra
	rw, err := zw.CreateRaw(fh)
	if err != nil {
		return err
	}
	_, err = rw.Write(data)
	return err
}

// pickler writes protocol-2 opcodes; storages get keys "0", "1", ... in
// first-use order, as torch.save gives them.
type pickler struct {
	buf      bytes.Buffer
	keys     map[*Storage]string
	storages []*Storage
}

// maxDumpDepth bounds nesting (dump recurses).
const maxDumpDepth = 1000

func (p *pickler) global(module, name string) {
	p.buf.WriteByte(opGlobal)
	p.buf.WriteString(module + "\n" + name + "\n")
}

func (p *pickler) str(s string) {
	p.buf.WriteByte(opBinUnicode)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
	p.buf.Write(n[:])
	p.buf.WriteString(s)
}

func (p *pickler) int(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		p.buf.Write([]byte{opBinInt1, byte(x)})
	case x >= 0 && x < 1<<16:
		p.buf.Write([]byte{opBinInt2, byte(x), byte(x >> 8)})
	case x >= math.MinInt32 && x <= math.MaxInt32:
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(int32(x)))
		p.buf.WriteByte(opBinInt)
		p.buf.Write(b[:])
	default:
		p.long(big.NewInt(x))
	}
}

// long writes LONG1: the two's-complement little-endian bytes, shortest.
func (p *pickler) long(x *big.Int) {
	n := (x.BitLen() + 8) / 8 // room for the sign bit
	b := make([]byte, n)
	v := new(big.Int).Set(x)
	if x.Sign() < 0 {
		v.Add(v, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
	}
	vb := v.Bytes() // big-endian
	for i := range vb {
		b[i] = vb[len(vb)-1-i]
	}
	p.buf.Write([]byte{opLong1, byte(n)})
	p.buf.Write(b)
}

func (p *pickler) dump(v any, depth int) error {
	if depth > maxDumpDepth {
		return fmt.Errorf("torchpt: value nested more than %d deep", maxDumpDepth)
	}
	switch x := v.(type) {
	case nil:
		p.buf.WriteByte(opNone)
	case bool:
		if x {
			p.buf.WriteByte(opNewTrue)
		} else {
			p.buf.WriteByte(opNewFalse)
		}
	case int:
		p.int(int64(x))
	case int64:
		p.int(x)
	case *big.Int:
		p.long(x)
	case float64:
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], math.Float64bits(x))
		p.buf.WriteByte(opBinFloat)
		p.buf.Write(b[:])
	case string:
		if !utf8.ValidString(x) {
			return fmt.Errorf("torchpt: string %q is not valid UTF-8", x)
		}
		p.str(x)
	case Bytes:
		// Protocol 2 has no bytes opcode: Python 3 pickles bytes as
		// _codecs.encode(latin-1 text, 'latin1').
		r := make([]rune, len(x))
		for i, c := range x {
			r[i] = rune(c)
		}
		p.global("_codecs", "encode")
		p.str(string(r))
		p.str("latin1")
		p.buf.WriteByte(opTuple2)
		p.buf.WriteByte(opReduce)
	case Tuple:
		return p.tuple(x, depth)
	case *List:
		p.buf.WriteByte(opEmptyList)
		return p.batch(x.Items, opAppends, depth, func(e any) error { return p.dump(e, depth+1) })
	case *Dict:
		p.buf.WriteByte(opEmptyDict)
		return p.dictItems(x, depth)
	case *Global:
		p.global(x.Module, x.Name)
	case *Object:
		if err := p.dump(x.Class, depth+1); err != nil {
			return err
		}
		if err := p.tuple(x.Args, depth); err != nil {
			return err
		}
		p.buf.WriteByte(opNewObj)
		if x.State != nil {
			if err := p.dump(x.State, depth+1); err != nil {
				return err
			}
			p.buf.WriteByte(opBuild)
		}
	case *Tensor:
		return p.tensor(x)
	default:
		return fmt.Errorf("torchpt: cannot pickle a %s", typeName(v))
	}
	return nil
}

func (p *pickler) tuple(t Tuple, depth int) error {
	switch len(t) {
	case 0:
		p.buf.WriteByte(opEmptyTuple)
		return nil
	case 1, 2, 3:
		for _, e := range t {
			if err := p.dump(e, depth+1); err != nil {
				return err
			}
		}
		p.buf.WriteByte([]byte{opTuple1, opTuple2, opTuple3}[len(t)-1])
		return nil
	}
	p.buf.WriteByte(opMark)
	for _, e := range t {
		if err := p.dump(e, depth+1); err != nil {
			return err
		}
	}
	p.buf.WriteByte(opTuple)
	return nil
}

// batch writes items in MARK ... op groups of 1000, as pickle does.
func (p *pickler) batch(items []any, op byte, depth int, one func(any) error) error {
	for i := 0; i < len(items); i += 1000 {
		p.buf.WriteByte(opMark)
		for _, e := range items[i:min(i+1000, len(items))] {
			if err := one(e); err != nil {
				return err
			}
		}
		p.buf.WriteByte(op)
	}
	return nil
}

func (p *pickler) dictItems(d *Dict, depth int) error {
	idx := make([]any, d.Len())
	for i := range idx {
		idx[i] = i
	}
	return p.batch(idx, opSetItems, depth, func(e any) error {
		i := e.(int)
		if err := p.dump(d.keys[i], depth+1); err != nil {
			return err
		}
		return p.dump(d.vals[i], depth+1)
	})
}

// tensor writes torch._utils._rebuild_tensor_v2((storage pid), offset,
// size, stride, requires_grad=False, OrderedDict()).
func (p *pickler) tensor(t *Tensor) error {
	st := t.Storage
	if st == nil || !st.Known {
		return errors.New("torchpt: cannot pickle a tensor whose storage type is unknown")
	}
	cls, ok := storageClass(st.DType)
	if !ok {
		return fmt.Errorf("torchpt: cannot pickle a %v tensor", st.DType)
	}
	key, seen := p.keys[st]
	if !seen {
		key = strconv.Itoa(len(p.storages))
		p.keys[st] = key
		p.storages = append(p.storages, st)
	}
	p.global("torch._utils", "_rebuild_tensor_v2")
	p.buf.WriteByte(opMark)
	// The persistent id: ('storage', class, key, location, numel).
	p.buf.WriteByte(opMark)
	p.str("storage")
	p.global("torch", cls)
	p.str(key)
	p.str(st.Location)
	p.int(st.Numel)
	p.buf.WriteByte(opTuple)
	p.buf.WriteByte(opBinPersID)
	p.int(t.Offset)
	ints := func(xs []int64) {
		tu := make(Tuple, len(xs))
		for i, x := range xs {
			tu[i] = x
		}
		_ = p.tuple(tu, 0) // ints only: cannot fail
	}
	ints(t.Shape)
	ints(t.Stride)
	p.buf.WriteByte(opNewFalse)
	p.global("collections", "OrderedDict")
	p.buf.WriteByte(opEmptyTuple)
	p.buf.WriteByte(opReduce)
	p.buf.WriteByte(opTuple)
	p.buf.WriteByte(opReduce)
	return nil
}
