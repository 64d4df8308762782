package torchpt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A small pickle virtual machine: every opcode of protocols 0 to 5 except
// the extension registry (EXT1/2/4) and out-of-band buffers (protocol 5's
// NEXT_BUFFER, READONLY_BUFFER), which torch.save never writes. It executes
// no Python: classes are named (*Global), calls build placeholders
// (construct), and only the few callables PyTorch checkpoints need are
// interpreted (OrderedDict, _rebuild_tensor_v2, _codecs.encode, ...).
//
// Every length is checked against the bytes that remain before anything is
// allocated, so a corrupt or hostile stream gives an error, not a panic or
// an allocation beyond the input's size.

// Opcodes (Lib/pickle.py).
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opLong           = 'L'
	opBinInt2        = 'M'
	opNone           = 'N'
	opPersID         = 'P'
	opBinPersID      = 'Q'
	opReduce         = 'R'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinGet         = 'h'
	opInst           = 'i'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opObj            = 'o'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opProto          = 0x80
	opNewObj         = 0x81
	opExt1           = 0x82
	opExt2           = 0x83
	opExt4           = 0x84
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opFrozenSet      = 0x91
	opNewObjEx       = 0x92
	opStackGlobal    = 0x93
	opMemoize        = 0x94
	opFrame          = 0x95
	opByteArray8     = 0x96
	opNextBuffer     = 0x97
	opReadonlyBuffer = 0x98
)

// maxProtocol is the highest pickle protocol the reader accepts.
const maxProtocol = 5

// PersistentLoader resolves a persistent id (PERSID, BINPERSID) to a value.
type PersistentLoader func(pid any) (any, error)

// Unpickle runs the pickle program at the start of data and returns the
// value it builds and the number of bytes it consumed (up to and including
// STOP). persistent resolves persistent ids; nil refuses them.
func Unpickle(data []byte, persistent PersistentLoader) (v any, n int, err error) {
	u := newUnpickler(bufio.NewReader(bytes.NewReader(data)), int64(len(data)), persistent)
	v, err = u.run()
	return v, int(u.pos), err
}

// PickleError is an error in a pickle stream, at a byte offset.
type PickleError struct {
	Offset int64
	Op     byte
	Msg    string
}

func (e *PickleError) Error() string {
	return fmt.Sprintf("pickle: offset %d: opcode 0x%02x: %s", e.Offset, e.Op, e.Msg)
}

// unpickler reads one pickle from r, which holds at most remaining bytes
// (every length is checked against it before anything is allocated).
type unpickler struct {
	r          *bufio.Reader
	remaining  int64
	pos        int64
	stack      []any
	marks      []int
	memo       map[uint64]any
	persistent PersistentLoader
}

func newUnpickler(r *bufio.Reader, remaining int64, persistent PersistentLoader) *unpickler {
	return &unpickler{r: r, remaining: remaining, persistent: persistent, memo: map[uint64]any{}}
}

func (u *unpickler) run() (any, error) {
	for {
		start := u.pos
		op, err := u.readByte()
		if err != nil {
			return nil, &PickleError{Offset: start, Msg: "truncated: the stream ends before STOP"}
		}
		done, err := u.step(op)
		if err != nil {
			return nil, &PickleError{Offset: start, Op: op, Msg: err.Error()}
		}
		if done {
			if len(u.stack) == 0 {
				return nil, &PickleError{Offset: start, Op: op, Msg: "STOP with an empty stack"}
			}
			return u.stack[len(u.stack)-1], nil
		}
	}
}

// read returns the next n bytes.
func (u *unpickler) read(n uint64) ([]byte, error) {
	if n > uint64(u.remaining) {
		return nil, fmt.Errorf("length %d runs past the end of the stream (%d bytes left): truncated", n, u.remaining)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(u.r, b); err != nil {
		return nil, fmt.Errorf("reading %d bytes: %w", n, err)
	}
	u.remaining -= int64(n)
	u.pos += int64(n)
	return b, nil
}

func (u *unpickler) readByte() (byte, error) {
	if u.remaining < 1 {
		return 0, io.ErrUnexpectedEOF
	}
	c, err := u.r.ReadByte()
	if err != nil {
		return 0, err
	}
	u.remaining--
	u.pos++
	return c, nil
}

// maxLine bounds the text arguments of protocol-0 opcodes (names, numbers).
const maxLine = 1 << 20

// readLine returns the bytes up to the next newline (not included).
func (u *unpickler) readLine() (string, error) {
	var line []byte
	for {
		c, err := u.readByte()
		if err != nil {
			return "", errors.New("no newline before the end of the stream: truncated")
		}
		if c == '\n' {
			return string(line), nil
		}
		if len(line) >= maxLine {
			return "", fmt.Errorf("line longer than %d bytes", maxLine)
		}
		line = append(line, c)
	}
}

func (u *unpickler) uint(n int) (uint64, error) {
	b, err := u.read(uint64(n))
	if err != nil {
		return 0, err
	}
	var x uint64
	for i := n - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	return x, nil
}

func (u *unpickler) push(v any) { u.stack = append(u.stack, v) }

func (u *unpickler) pop() (any, error) {
	if len(u.stack) == 0 || (len(u.marks) > 0 && len(u.stack) <= u.marks[len(u.marks)-1]) {
		return nil, errors.New("stack underflow")
	}
	v := u.stack[len(u.stack)-1]
	u.stack = u.stack[:len(u.stack)-1]
	return v, nil
}

func (u *unpickler) top() (any, error) {
	if len(u.stack) == 0 || (len(u.marks) > 0 && len(u.stack) <= u.marks[len(u.marks)-1]) {
		return nil, errors.New("stack underflow")
	}
	return u.stack[len(u.stack)-1], nil
}

// popMark returns the items pushed since the last MARK and removes them
// and the mark.
func (u *unpickler) popMark() ([]any, error) {
	if len(u.marks) == 0 {
		return nil, errors.New("no MARK on the stack")
	}
	m := u.marks[len(u.marks)-1]
	u.marks = u.marks[:len(u.marks)-1]
	items := append([]any(nil), u.stack[m:]...)
	u.stack = u.stack[:m]
	return items, nil
}

func (u *unpickler) step(op byte) (stop bool, err error) {
	switch op {
	case opProto:
		b, err := u.read(1)
		if err != nil {
			return false, err
		}
		if b[0] > maxProtocol {
			return false, fmt.Errorf("unsupported pickle protocol %d (want 0..%d)", b[0], maxProtocol)
		}
	case opFrame:
		if _, err := u.uint(8); err != nil { // framing is advisory: the data is in memory
			return false, err
		}
	case opStop:
		return true, nil
	case opMark:
		u.marks = append(u.marks, len(u.stack))
	case opPop:
		if len(u.marks) > 0 && len(u.stack) == u.marks[len(u.marks)-1] {
			u.marks = u.marks[:len(u.marks)-1] // POP of a mark (pickle.py does the same)
			return false, nil
		}
		_, err = u.pop()
	case opPopMark:
		_, err = u.popMark()
	case opDup:
		v, err := u.top()
		if err != nil {
			return false, err
		}
		u.push(v)

	// Scalars.
	case opNone:
		u.push(nil)
	case opNewTrue:
		u.push(true)
	case opNewFalse:
		u.push(false)
	case opInt:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		switch s {
		case "00":
			u.push(false)
		case "01":
			u.push(true)
		default:
			v, err := parseInt(s)
			if err != nil {
				return false, err
			}
			u.push(v)
		}
	case opLong:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		v, err := parseInt(strings.TrimSuffix(s, "L"))
		if err != nil {
			return false, err
		}
		u.push(v)
	case opBinInt:
		x, err := u.uint(4)
		if err != nil {
			return false, err
		}
		u.push(int64(int32(uint32(x))))
	case opBinInt1:
		x, err := u.uint(1)
		if err != nil {
			return false, err
		}
		u.push(int64(x))
	case opBinInt2:
		x, err := u.uint(2)
		if err != nil {
			return false, err
		}
		u.push(int64(x))
	case opLong1, opLong4:
		var n uint64
		if op == opLong1 {
			n, err = u.uint(1)
		} else {
			n, err = u.uint(4)
			if err == nil && int32(uint32(n)) < 0 {
				return false, errors.New("LONG4 with a negative length")
			}
		}
		if err != nil {
			return false, err
		}
		b, err := u.read(n)
		if err != nil {
			return false, err
		}
		u.push(decodeLong(b))
	case opFloat:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return false, fmt.Errorf("FLOAT %q: %v", s, err)
		}
		u.push(f)
	case opBinFloat:
		x, err := u.read(8)
		if err != nil {
			return false, err
		}
		u.push(math.Float64frombits(binary.BigEndian.Uint64(x)))

	// Strings and bytes.
	case opString:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		v, err := unquotePy2(s)
		if err != nil {
			return false, err
		}
		u.push(v)
	case opBinString, opShortBinString:
		n, err := u.uint(width(op))
		if err != nil {
			return false, err
		}
		if op == opBinString && int32(uint32(n)) < 0 {
			return false, errors.New("BINSTRING with a negative length")
		}
		b, err := u.read(n)
		if err != nil {
			return false, err
		}
		u.push(string(b)) // Python 2 str: decoded as Python 3's default ASCII/latin-1; keep the bytes
	case opUnicode:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		v, err := rawUnicodeEscape(s)
		if err != nil {
			return false, err
		}
		u.push(v)
	case opShortBinUni, opBinUnicode, opBinUnicode8:
		n, err := u.uint(width(op))
		if err != nil {
			return false, err
		}
		b, err := u.read(n)
		if err != nil {
			return false, err
		}
		if !utf8.Valid(b) {
			return false, errors.New("string is not valid UTF-8")
		}
		u.push(string(b))
	case opShortBinBytes, opBinBytes, opBinBytes8, opByteArray8:
		n, err := u.uint(width(op))
		if err != nil {
			return false, err
		}
		b, err := u.read(n)
		if err != nil {
			return false, err
		}
		u.push(Bytes(append([]byte(nil), b...)))

	// Containers.
	case opEmptyTuple:
		u.push(Tuple{})
	case opTuple:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		u.push(Tuple(items))
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		t := make(Tuple, n)
		for i := n - 1; i >= 0; i-- {
			if t[i], err = u.pop(); err != nil {
				return false, err
			}
		}
		u.push(t)
	case opEmptyList:
		u.push(&List{})
	case opList:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		u.push(&List{Items: items})
	case opAppend:
		v, err := u.pop()
		if err != nil {
			return false, err
		}
		if err := u.appendTo([]any{v}); err != nil {
			return false, err
		}
	case opAppends:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		if err := u.appendTo(items); err != nil {
			return false, err
		}
	case opEmptyDict:
		u.push(NewDict())
	case opDict:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		d := NewDict()
		if err := setItems(d, items); err != nil {
			return false, err
		}
		u.push(d)
	case opSetItem:
		v, err := u.pop()
		if err != nil {
			return false, err
		}
		k, err := u.pop()
		if err != nil {
			return false, err
		}
		if err := u.setItemsOn([]any{k, v}); err != nil {
			return false, err
		}
	case opSetItems:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		if err := u.setItemsOn(items); err != nil {
			return false, err
		}
	case opEmptySet:
		u.push(&Set{})
	case opAddItems:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		t, err := u.top()
		if err != nil {
			return false, err
		}
		s, ok := t.(*Set)
		if !ok {
			return false, fmt.Errorf("ADDITEMS to a %s, not a set", typeName(t))
		}
		s.Items = append(s.Items, items...)
	case opFrozenSet:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		u.push(&Set{Items: items})

	// Memo.
	case opPut:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		i, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return false, fmt.Errorf("PUT %q: not a memo index", s)
		}
		return false, u.memoPut(i)
	case opBinPut, opLongBinPut:
		i, err := u.uint(width(op))
		if err != nil {
			return false, err
		}
		return false, u.memoPut(i)
	case opMemoize:
		return false, u.memoPut(uint64(len(u.memo)))
	case opGet:
		s, err := u.readLine()
		if err != nil {
			return false, err
		}
		i, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return false, fmt.Errorf("GET %q: not a memo index", s)
		}
		return false, u.memoGet(i)
	case opBinGet, opLongBinGet:
		i, err := u.uint(width(op))
		if err != nil {
			return false, err
		}
		return false, u.memoGet(i)

	// Classes, calls and objects.
	case opGlobal:
		mod, err := u.readLine()
		if err != nil {
			return false, err
		}
		name, err := u.readLine()
		if err != nil {
			return false, err
		}
		u.push(&Global{Module: mod, Name: name})
	case opStackGlobal:
		name, err := u.pop()
		if err != nil {
			return false, err
		}
		mod, err := u.pop()
		if err != nil {
			return false, err
		}
		ms, ok1 := mod.(string)
		ns, ok2 := name.(string)
		if !ok1 || !ok2 {
			return false, fmt.Errorf("STACK_GLOBAL of %s and %s, want two str", typeName(mod), typeName(name))
		}
		u.push(&Global{Module: ms, Name: ns})
	case opReduce, opNewObj:
		args, err := u.pop()
		if err != nil {
			return false, err
		}
		fn, err := u.pop()
		if err != nil {
			return false, err
		}
		t, ok := args.(Tuple)
		if !ok {
			return false, fmt.Errorf("arguments are a %s, not a tuple", typeName(args))
		}
		v, err := construct(fn, t)
		if err != nil {
			return false, err
		}
		u.push(v)
	case opNewObjEx:
		kwargs, err := u.pop()
		if err != nil {
			return false, err
		}
		args, err := u.pop()
		if err != nil {
			return false, err
		}
		cls, err := u.pop()
		if err != nil {
			return false, err
		}
		t, ok := args.(Tuple)
		if !ok {
			return false, fmt.Errorf("arguments are a %s, not a tuple", typeName(args))
		}
		v, err := construct(cls, t)
		if err != nil {
			return false, err
		}
		if o, ok := v.(*Object); ok {
			if kw, ok := kwargs.(*Dict); ok && kw.Len() > 0 {
				o.Args = append(o.Args, kw)
			}
		}
		u.push(v)
	case opInst:
		mod, err := u.readLine()
		if err != nil {
			return false, err
		}
		name, err := u.readLine()
		if err != nil {
			return false, err
		}
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		v, err := construct(&Global{Module: mod, Name: name}, Tuple(items))
		if err != nil {
			return false, err
		}
		u.push(v)
	case opObj:
		items, err := u.popMark()
		if err != nil {
			return false, err
		}
		if len(items) == 0 {
			return false, errors.New("OBJ without a class")
		}
		v, err := construct(items[0], Tuple(items[1:]))
		if err != nil {
			return false, err
		}
		u.push(v)
	case opBuild:
		state, err := u.pop()
		if err != nil {
			return false, err
		}
		t, err := u.top()
		if err != nil {
			return false, err
		}
		build(t, state)
	case opPersID, opBinPersID:
		var pid any
		if op == opPersID {
			if pid, err = u.readLine(); err != nil {
				return false, err
			}
		} else if pid, err = u.pop(); err != nil {
			return false, err
		}
		if u.persistent == nil {
			return false, errors.New("persistent id in a stream read without a persistent loader")
		}
		v, err := u.persistent(pid)
		if err != nil {
			return false, err
		}
		u.push(v)
	case opExt1, opExt2, opExt4:
		return false, errors.New("the extension registry (EXT1/EXT2/EXT4) is not supported")
	case opNextBuffer, opReadonlyBuffer:
		return false, errors.New("out-of-band buffers (protocol 5) are not supported")
	default:
		return false, fmt.Errorf("unknown opcode %q", op)
	}
	return false, err
}

// width is the size in bytes of the length or index argument of op.
func width(op byte) int {
	switch op {
	case opShortBinString, opShortBinUni, opShortBinBytes, opBinPut, opBinGet:
		return 1
	case opBinString, opBinUnicode, opBinBytes, opLongBinPut, opLongBinGet:
		return 4
	}
	return 8 // BINUNICODE8, BINBYTES8, BYTEARRAY8
}

func (u *unpickler) memoPut(i uint64) error {
	v, err := u.top()
	if err != nil {
		return err
	}
	u.memo[i] = v
	return nil
}

func (u *unpickler) memoGet(i uint64) error {
	v, ok := u.memo[i]
	if !ok {
		return fmt.Errorf("memo index %d was never stored", i)
	}
	u.push(v)
	return nil
}

func (u *unpickler) appendTo(items []any) error {
	t, err := u.top()
	if err != nil {
		return err
	}
	switch l := t.(type) {
	case *List:
		l.Items = append(l.Items, items...)
	case *Object: // a list subclass
		l.ListItems = append(l.ListItems, items...)
	default:
		return fmt.Errorf("APPEND to a %s, not a list", typeName(t))
	}
	return nil
}

func (u *unpickler) setItemsOn(items []any) error {
	t, err := u.top()
	if err != nil {
		return err
	}
	switch d := t.(type) {
	case *Dict:
		return setItems(d, items)
	case *Object: // a dict subclass (defaultdict, ...)
		if d.Items == nil {
			d.Items = NewDict()
		}
		return setItems(d.Items, items)
	}
	return fmt.Errorf("SETITEM on a %s, not a dict", typeName(t))
}

func setItems(d *Dict, items []any) error {
	if len(items)%2 != 0 {
		return fmt.Errorf("%d items for key/value pairs (odd)", len(items))
	}
	for i := 0; i < len(items); i += 2 {
		if err := d.Set(items[i], items[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// build applies BUILD's state: an object's attributes, an OrderedDict's
// instance attributes; other values (a tensor rebuilt whole) ignore it.
func build(target, state any) {
	switch t := target.(type) {
	case *Object:
		old, ok1 := t.State.(*Dict)
		add, ok2 := state.(*Dict)
		if ok1 && ok2 { // obj.__dict__.update(state)
			for i, k := range add.keys {
				old.Set(k, add.vals[i]) // keys of a dict are hashable
			}
			return
		}
		t.State = state
	case *Dict:
		t.Attrs = state
	}
}

// decodeLong decodes a little-endian two's-complement integer.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var x uint64
		for i := len(b) - 1; i >= 0; i-- {
			x = x<<8 | uint64(b[i])
		}
		shift := 64 - 8*uint(len(b))
		return int64(x<<shift) >> shift // sign-extend
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	v := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), 8*uint(len(b))))
	}
	if v.IsInt64() {
		return v.Int64()
	}
	return v
}

// parseInt parses a protocol-0 decimal integer (int64, or *big.Int).
func parseInt(s string) (any, error) {
	s = strings.TrimSpace(s)
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, nil
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, fmt.Errorf("%q is not an integer", s)
	}
	return v, nil
}

// unquotePy2 decodes the repr of a Python 2 str (STRING's argument).
func unquotePy2(s string) (string, error) {
	if len(s) < 2 || (s[0] != '\'' && s[0] != '"') || s[len(s)-1] != s[0] {
		return "", fmt.Errorf("STRING argument %q is not quoted", s)
	}
	s = s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			return "", errors.New("STRING ends in a backslash")
		}
		switch c = s[i]; c {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'x':
			if i+3 > len(s) {
				return "", errors.New("STRING: short \\x escape")
			}
			x, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return "", fmt.Errorf("STRING: bad \\x escape %q", s[i+1:i+3])
			}
			b.WriteByte(byte(x))
			i += 2
		default: // \\, \', \" and anything else: the character itself
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// rawUnicodeEscape decodes UNICODE's raw-unicode-escape argument (\uXXXX
// and \UXXXXXXXX escapes; other bytes are code points).
func rawUnicodeEscape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
			n := 4
			if s[i+1] == 'U' {
				n = 8
			}
			if i+2+n > len(s) {
				return "", errors.New("UNICODE: short \\u escape")
			}
			x, err := strconv.ParseUint(s[i+2:i+2+n], 16, 32)
			if err != nil || x > utf8.MaxRune {
				return "", fmt.Errorf("UNICODE: bad escape %q", s[i:i+2+n])
			}
			b.WriteRune(rune(x))
			i += 1 + n
			continue
		}
		b.WriteRune(rune(s[i]))
	}
	return b.String(), nil
}
