package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

// st builds a file from a JSON header (unpadded) and a data section.
func st(header string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

const (
	okA = `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	okB = `"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}`
)

func TestCorruptFilesExactErrors(t *testing.T) {
	const F = "safetensors: bad.safetensors: "
	cases := []struct {
		name string
		buf  []byte
		want string
	}{
		{"empty", nil, F + "file is 0 bytes, shorter than the 8-byte header length prefix"},
		{"short", []byte{1, 2, 3}, F + "file is 3 bytes, shorter than the 8-byte header length prefix"},
		{"huge header", binary.LittleEndian.AppendUint64(nil, 100_000_001), F + "header length 100000001 exceeds the limit of 100000000 bytes"},
		{"header past EOF", append(binary.LittleEndian.AppendUint64(nil, 50), "{}"...), F + "header length 50 runs past the end of the file (10 bytes): truncated?"},
		{"max uint64 header", binary.LittleEndian.AppendUint64(nil, ^uint64(0)), F + "header length 18446744073709551615 exceeds the limit of 100000000 bytes"},
		{"not utf8", st("{\"\xff\":1}", 0), F + "header is not valid UTF-8"},
		{"bad json", st(`{"a":`, 0), F + "header: value of \"a\": invalid JSON: unexpected end of input"},
		{"bad json 2", st(`{"a" 1}`, 0), F + `header: value of "a": invalid JSON: expected colon after object key`},
		{"not an object", st(`[1,2]`, 0), F + `header: want a JSON object, found "["`},
		{"trailing junk", st(`{} x`, 0), F + "header: after the object: invalid JSON: invalid character 'x' looking for beginning of value"},
		{"second object", st(`{} {}`, 0), F + `header: unexpected "{" after the object`},
		{"duplicate name", st(`{`+okA+`,`+okA+`}`, 8), F + `header: duplicate key "a"`},
		{"duplicate metadata key", st(`{"__metadata__":{"k":"1","k":"2"}}`, 0), F + `__metadata__: duplicate key "k"`},
		{"metadata not string", st(`{"__metadata__":{"k":1}}`, 0), F + `__metadata__: value of "k" is not a string`},
		{"metadata not object", st(`{"__metadata__":"x"}`, 0), F + `__metadata__: want a JSON object, found string "x"`},
		{"unknown dtype", st(`{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}`, 8), F + `tensor a: unknown dtype "F33"`},
		{"dtype not string", st(`{"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}}`, 8), F + `tensor a: dtype is not a string: 3`},
		{"lowercase key", st(`{"a":{"DTYPE":"F32","shape":[2],"data_offsets":[0,8]}}`, 8), F + `tensor a: missing "dtype"`},
		{"missing shape", st(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, 8), F + `tensor a: missing "shape"`},
		{"missing offsets", st(`{"a":{"dtype":"F32","shape":[2]}}`, 8), F + `tensor a: missing "data_offsets"`},
		{"entry not object", st(`{"a":[1]}`, 0), F + `tensor a: want a JSON object, found "["`},
		{"negative dim", st(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), F + `tensor a: shape: -2 is not a non-negative integer`},
		{"float dim", st(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, 8), F + `tensor a: shape: 2.0 is not a non-negative integer`},
		{"huge dim", st(`{"a":{"dtype":"F32","shape":[18446744073709551614],"data_offsets":[0,8]}}`, 8), F + `tensor a: shape: 18446744073709551614 is not a non-negative integer`},
		{"shape not array", st(`{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}`, 8), F + `tensor a: shape: want an array of integers, found 2`},
		{"shape null", st(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,8]}}`, 8), F + `tensor a: shape: want an array of integers, found null`},
		{"three offsets", st(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}`, 8), F + `tensor a: data_offsets has 3 entries, want [begin, end]`},
		{"shape overflow", st(`{"a":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}`, 16), F + `tensor a: shape [2 9223372036854775807] overflows`},
		{"size mismatch", st(`{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,4]}}`, 4), F + `tensor a: data_offsets [0, 4] hold 4 bytes, but F32[2 2] needs 16`},
		{"sub-byte", st(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2), F + `tensor a: F4 tensor of shape [3] is 12 bits, not a whole number of bytes`},
		{"end before begin", st(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4), F + `tensor a: data_offsets [4, 0] end before they begin`},
		{"overlap", st(`{`+okA+`,"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), F + `tensor b: data_offsets [4, 8] overlap tensor a [0, 8]`},
		{"gap at start", st(`{"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), F + `tensor b: data_offsets [4, 8] leave a gap of 4 bytes after offset 0`},
		{"gap", st(`{`+okA+`,"b":{"dtype":"U8","shape":[4],"data_offsets":[10,14]}}`, 14), F + `tensor b: data_offsets [10, 14] leave a gap of 2 bytes after offset 8`},
		{"truncated data", st(`{`+okA+`,`+okB+`}`, 11), F + `tensor b: data_offsets [8, 12] run past the end of the 11-byte data section (truncated file?)`},
		{"trailing data", st(`{`+okA+`,`+okB+`}`, 13), F + `data section is 13 bytes but the tensors cover 12 (trailing bytes)`},
		{"no tensors, data", st(`{}`, 1), F + `data section is 1 bytes but the tensors cover 0 (trailing bytes)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse("bad.safetensors", c.buf)
			if err == nil {
				t.Fatalf("Parse succeeded: %v", f.Infos())
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != "bad.safetensors" {
				t.Errorf("error %T %v is not a *FormatError naming the file", err, err)
			}
			if err.Error() != c.want {
				t.Errorf("error:\n got %s\nwant %s", err, c.want)
			}
		})
	}
}

// TestAcceptedVariants lists header forms upstream accepts that our writer
// never produces.
func TestAcceptedVariants(t *testing.T) {
	cases := []struct {
		name string
		buf  []byte
	}{
		{"upstream test_deserialization", st(`{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`, 16)},
		{"leading and trailing whitespace", st("\t\n{}\r ", 0)},
		{"null metadata", st(`{"__metadata__":null}`, 0)},
		{"unknown field ignored", st(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":{"x":[1]}}}`, 1)},
		{"offset order differs from name order", st(`{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 2)},
		{"zero-sized tensors share an offset", st(`{"x":{"dtype":"I32","shape":[2,0],"data_offsets":[0,0]},"y":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`, 0)},
		// bindings/python/tests/test_simple.py test_deserialization_metadata:
		// hand-written, its data section starts at 110, not 8-aligned.
		{"python test_deserialization_metadata", []byte("f\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\":{\"framework\":\"pt\"},\"test1\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}" +
			"       \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")},
		{"escaped name", st(`{"a\u00e9\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1)},
	}
	for _, c := range cases {
		if _, err := Parse(c.name, c.buf); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	f, err := Parse("esc", cases[len(cases)-1].buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Info("aé\n"); !ok {
		t.Errorf("escaped name not decoded: %v", f.Infos())
	}
}

// TestEveryTruncationFails cuts the fixture at every length: each must give
// a *FormatError, never a panic or a file that parses.
func TestEveryTruncationFails(t *testing.T) {
	buf, err := os.ReadFile("testdata/fixture.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(buf); n++ {
		_, err := Parse("cut", buf[:n:n])
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("Parse(first %d of %d bytes) = %v, want *FormatError", n, len(buf), err)
		}
		if n > 8 && n < 8+int(binary.LittleEndian.Uint64(buf)) && !strings.Contains(err.Error(), "truncated") {
			t.Fatalf("cut inside the header: %v", err)
		}
	}
	// One flipped byte in the header: every position must parse or fail cleanly.
	for i := 8; i < 8+int(binary.LittleEndian.Uint64(buf)); i++ {
		b := append([]byte(nil), buf...)
		b[i] ^= 0x5A
		if f, err := Parse("flip", b); err == nil {
			checkParsed(t, f, b)
		}
	}
}
