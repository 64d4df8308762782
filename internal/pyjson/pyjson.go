// Package pyjson writes JSON's leaves as Python's json.dumps does — floats
// as Python's repr, strings with ensure_ascii — for files Megatron's Python
// writes and gotron reproduces byte for byte: dataset descriptions (whose
// MD5 names the index caches) and the inference scripts' results.
package pyjson

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Float is Python's repr of f as json.dumps writes it: the shortest digits
// that round-trip, positional when the decimal exponent is in [-4, 16)
// (with ".0" when integral), else d.ddde±XX; NaN, Infinity, -Infinity.
func Float(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}

// WriteString writes s quoted as json.dumps(ensure_ascii=True) does: every
// character outside ' '..'~' escaped (short escapes where JSON has them,
// else \uXXXX, UTF-16 surrogate pairs above U+FFFF).
func WriteString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= 0x10000:
			r -= 0x10000
			fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		case r < 0x20 || r > 0x7e:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
