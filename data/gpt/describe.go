package gpt

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/gotron/gotron/internal/pyjson"
)

// Field is one key of an ordered JSON object, as Megatron's OrderedDict
// unique_identifiers. Value may be nil, bool, int, int64, float64, string,
// []any or []Field (a nested object).
type Field struct {
	Key   string
	Value any
}

// pyInt marks a float that Python holds as an int (the 0 that starts
// Megatron's split book-ends).
type pyInt int64

// pyJSON renders v exactly like Python's json.dumps(v, indent=4): ", " and
// ": " separators become ",\n" and ": ", non-ASCII is \u-escaped, floats use
// Python's repr.
func pyJSON(v any) string {
	var b strings.Builder
	writePy(&b, v, 0)
	return b.String()
}

func writePy(b *strings.Builder, v any, depth int) {
	nl := func(d int) {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat("    ", d))
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case pyInt:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case float64:
		b.WriteString(pyjson.Float(x))
	case string:
		pyjson.WriteString(b, x)
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			nl(depth + 1)
			writePy(b, e, depth+1)
		}
		nl(depth)
		b.WriteByte(']')
	case []Field:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteByte('{')
		for i, f := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			nl(depth + 1)
			pyjson.WriteString(b, f.Key)
			b.WriteString(": ")
			writePy(b, f.Value, depth+1)
		}
		nl(depth)
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("gpt: pyJSON: unsupported type %T", v))
	}
}

// md5Hex is the hex MD5 of a description, the cache file name prefix.
func md5Hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// splitMatrixJSON renders a split matrix the way Python holds it: the first
// book-end starts at the integer 0.
func splitMatrixJSON(m *[3]*Bookend) any {
	if m == nil {
		return nil
	}
	out := make([]any, 3)
	for i, b := range m {
		if b == nil {
			continue
		}
		var start any = b.Start
		if i == 0 {
			start = pyInt(0) // Python's running sum starts from the int 0
		}
		out[i] = []any{start, b.End}
	}
	return out
}
