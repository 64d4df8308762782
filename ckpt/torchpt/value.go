package torchpt

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// The Go values an unpickled stream is made of:
//
//	None                 nil
//	bool                 bool
//	int                  int64, or *big.Int beyond 64 bits
//	float                float64
//	str                  string
//	bytes, bytearray     Bytes
//	tuple                Tuple
//	list                 *List
//	dict, OrderedDict    *Dict
//	set, frozenset       *Set
//	a class or function  *Global (module and name; never resolved)
//	an instance          *Object (its class, constructor arguments and state)
//	torch tensor         *Tensor (storage, offset, shape, stride)
//	torch storage        *Storage
//
// Classes the reader does not know (Megatron's enums, numpy arrays,
// argparse.Namespace, io.BytesIO, ...) become *Object placeholders: their
// constructor arguments and BUILD state are kept, nothing is executed.

// Bytes is a Python bytes or bytearray value.
type Bytes []byte

// Tuple is a Python tuple.
type Tuple []any

// List is a Python list (a pointer: APPEND mutates it after it is memoised).
type List struct{ Items []any }

// Set is a Python set or frozenset, in insertion order.
type Set struct{ Items []any }

// Global is a class or function named by a GLOBAL or STACK_GLOBAL opcode.
type Global struct{ Module, Name string }

func (g *Global) String() string { return g.Module + "." + g.Name }

// Object is an instance of a class the reader represents by a placeholder:
// Class is what was called (usually a *Global), Args its arguments, State
// what BUILD set (usually a *Dict of attributes), and Items/ListItems what
// SETITEMS and APPENDS added (dict and list subclasses).
type Object struct {
	Class     any
	Args      Tuple
	State     any
	Items     *Dict
	ListItems []any
}

// ClassName is "module.Name" of the object's class, or "" when the class is
// not a global.
func (o *Object) ClassName() string {
	if g, ok := o.Class.(*Global); ok {
		return g.String()
	}
	return ""
}

// Attrs returns the instance attributes BUILD set: State when it is a dict,
// or the first element of a (dict, slots) state tuple. Nil when there are
// none.
func (o *Object) Attrs() *Dict {
	switch s := o.State.(type) {
	case *Dict:
		return s
	case Tuple:
		if len(s) == 2 {
			if d, ok := s[0].(*Dict); ok {
				return d
			}
		}
	}
	return nil
}

// Attr returns the attribute name of the object (see Attrs).
func (o *Object) Attr(name string) (any, bool) {
	if d := o.Attrs(); d != nil {
		return d.Get(name)
	}
	return nil, false
}

// Dict is a Python dict (insertion-ordered, as dicts and OrderedDicts are).
// Keys are compared as Python compares them for the hashable types the
// reader knows (1, 1.0 and True are one key); other keys (placeholders,
// tensors) compare by identity.
type Dict struct {
	keys, vals []any
	index      map[string]int
	// Attrs is the state BUILD gave the dict (an OrderedDict's instance
	// attributes, e.g. a PyTorch state dict's _metadata), or nil.
	Attrs any
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{index: map[string]int{}} }

// Len is the number of entries.
func (d *Dict) Len() int { return len(d.keys) }

// Keys returns the keys in insertion order (do not modify).
func (d *Dict) Keys() []any { return d.keys }

// Values returns the values in insertion order (do not modify).
func (d *Dict) Values() []any { return d.vals }

// Get returns the value of key.
func (d *Dict) Get(key any) (any, bool) {
	k, err := hashKey(key, 0)
	if err != nil {
		return nil, false
	}
	i, ok := d.index[k]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// Set sets key to val (keeping the key's first position, as Python does).
// It fails for unhashable keys (lists, dicts, sets).
func (d *Dict) Set(key, val any) error {
	k, err := hashKey(key, 0)
	if err != nil {
		return err
	}
	if d.index == nil {
		d.index = map[string]int{}
	}
	if i, ok := d.index[k]; ok {
		d.vals[i] = val
		return nil
	}
	d.index[k] = len(d.keys)
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, val)
	return nil
}

// StringKeys returns the keys that are strings, in order.
func (d *Dict) StringKeys() []string {
	var out []string
	for _, k := range d.keys {
		if s, ok := k.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// maxKeyDepth bounds the nesting of tuple keys (hashKey recurses).
const maxKeyDepth = 100

// hashKey maps a hashable value to a string that is equal for values Python
// considers equal keys.
func hashKey(v any, depth int) (string, error) {
	if depth > maxKeyDepth {
		return "", fmt.Errorf("dict key nested more than %d deep", maxKeyDepth)
	}
	switch x := v.(type) {
	case nil:
		return "N", nil
	case bool:
		if x {
			return "i1", nil
		}
		return "i0", nil
	case int64:
		return "i" + strconv.FormatInt(x, 10), nil
	case *big.Int:
		if x.IsInt64() {
			return "i" + strconv.FormatInt(x.Int64(), 10), nil
		}
		return "i" + x.String(), nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<63 {
			return "i" + strconv.FormatInt(int64(x), 10), nil
		}
		if math.IsNaN(x) {
			return fmt.Sprintf("nan%p", &x), nil // NaN keys are never equal
		}
		return "f" + strconv.FormatFloat(x, 'g', -1, 64), nil
	case string:
		return "s" + x, nil
	case Bytes:
		return "b" + string(x), nil
	case Tuple:
		var b strings.Builder
		b.WriteString("t(")
		for _, e := range x {
			k, err := hashKey(e, depth+1)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "%d:%s", len(k), k)
		}
		b.WriteString(")")
		return b.String(), nil
	case *Global:
		return "g" + x.Module + "\x00" + x.Name, nil
	case *Object, *Tensor, *Storage:
		return fmt.Sprintf("p%p", x), nil
	}
	return "", fmt.Errorf("unhashable dict key of type %s", typeName(v))
}

// typeName is the Python-ish name of a value's type, for error messages.
func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case Bytes:
		return "bytes"
	case Tuple:
		return "tuple"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	case *Set:
		return "set"
	case *Global:
		return "global " + x.String()
	case *Object:
		if n := x.ClassName(); n != "" {
			return n
		}
		return "object"
	case *Tensor:
		return "torch.Tensor"
	case *Storage:
		return "torch storage"
	}
	return fmt.Sprintf("%T", v)
}
