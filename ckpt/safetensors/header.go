package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"unicode/utf8"
)

// MaxHeaderBytes is the largest JSON header accepted or written, the limit
// of the upstream Rust implementation (100 MB).
const MaxHeaderBytes = 100_000_000

// metadataKey is the reserved header key holding the string→string metadata.
const metadataKey = "__metadata__"

// FormatError reports a malformed safetensors file or index: File names the
// file (as given to Open or Parse), Tensor the tensor concerned, if any.
type FormatError struct {
	File   string
	Tensor string
	Msg    string
}

// Error implements error.
func (e *FormatError) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("safetensors: %s: tensor %s: %s", e.File, e.Tensor, e.Msg)
	}
	return fmt.Sprintf("safetensors: %s: %s", e.File, e.Msg)
}

// Info describes one tensor of a file's header.
type Info struct {
	Name  string
	DType DType
	Shape []int
	// Begin and End are the tensor's byte offsets [Begin, End) within the
	// data section (which starts right after the header).
	Begin, End int
}

// header is a parsed and validated header.
type header struct {
	metadata map[string]string // nil when the file has none
	infos    []Info            // sorted by offset
	dataOff  int               // 8 + header length: where the data section starts
}

// parseHeader parses and validates the header of the safetensors file held
// in buf (the whole file), named file in errors.
func parseHeader(file string, buf []byte) (*header, error) {
	bad := func(format string, args ...any) error {
		return &FormatError{File: file, Msg: fmt.Sprintf(format, args...)}
	}
	if len(buf) < 8 {
		return nil, bad("file is %d bytes, shorter than the 8-byte header length prefix", len(buf))
	}
	n := binary.LittleEndian.Uint64(buf)
	if n > MaxHeaderBytes {
		return nil, bad("header length %d exceeds the limit of %d bytes", n, MaxHeaderBytes)
	}
	if n > uint64(len(buf)-8) {
		return nil, bad("header length %d runs past the end of the file (%d bytes): truncated?", n, len(buf))
	}
	js := buf[8 : 8+n]
	if !utf8.Valid(js) {
		return nil, bad("header is not valid UTF-8")
	}
	h := &header{dataOff: 8 + int(n)}
	fields, err := decodeObject(js)
	if err != nil {
		return nil, bad("header: %v", err)
	}
	for _, f := range fields {
		if f.key == metadataKey {
			if h.metadata, err = decodeMetadata(f.val); err != nil {
				return nil, bad("%s: %v", metadataKey, err)
			}
			continue
		}
		info, err := decodeInfo(f.key, f.val)
		if err != nil {
			return nil, &FormatError{File: file, Tensor: f.key, Msg: err.Error()}
		}
		h.infos = append(h.infos, info)
	}
	if err := checkLayout(file, h.infos, len(buf)-h.dataOff); err != nil {
		return nil, err
	}
	return h, nil
}

// field is one key of a JSON object with its undecoded value.
type field struct {
	key string
	val json.RawMessage
}

// decodeObject decodes a JSON object into its fields in order, rejecting
// duplicate keys and anything but whitespace after the object.
func decodeObject(js []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonErr(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, found %s", describe(tok))
	}
	var fields []field
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonErr(err)
		}
		key := tok.(string) // inside an object, Token only returns string keys
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("value of %q: %v", key, jsonErr(err))
		}
		fields = append(fields, field{key, val})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, jsonErr(err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, fmt.Errorf("after the object: %v", jsonErr(err))
		}
		return nil, fmt.Errorf("unexpected %s after the object", describe(tok))
	}
	return fields, nil
}

func jsonErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("invalid JSON: unexpected end of input")
	}
	return fmt.Errorf("invalid JSON: %v", err)
}

func describe(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		return fmt.Sprintf("%q", string(v))
	case string:
		return fmt.Sprintf("string %q", v)
	case nil:
		return "null"
	default:
		return fmt.Sprintf("%v", v)
	}
}

// decodeMetadata decodes the __metadata__ object: string values only, or null.
func decodeMetadata(raw json.RawMessage) (map[string]string, error) {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	fields, err := decodeObject(raw)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(fields))
	for _, f := range fields {
		var s string
		if err := json.Unmarshal(f.val, &s); err != nil {
			return nil, fmt.Errorf("value of %q is not a string", f.key)
		}
		m[f.key] = s
	}
	return m, nil
}

// decodeInfo decodes one tensor entry {"dtype", "shape", "data_offsets"}.
// Like upstream, unknown keys are ignored; key names are case-sensitive.
func decodeInfo(name string, raw json.RawMessage) (Info, error) {
	info := Info{Name: name}
	fields, err := decodeObject(raw)
	if err != nil {
		return info, err
	}
	var haveDType, haveShape, haveOffsets bool
	for _, f := range fields {
		switch f.key {
		case "dtype":
			var s string
			if err := json.Unmarshal(f.val, &s); err != nil {
				return info, fmt.Errorf("dtype is not a string: %s", f.val)
			}
			if info.DType, err = ParseDType(s); err != nil {
				return info, err
			}
			haveDType = true
		case "shape":
			if info.Shape, err = decodeInts(f.val); err != nil {
				return info, fmt.Errorf("shape: %v", err)
			}
			haveShape = true
		case "data_offsets":
			offs, err := decodeInts(f.val)
			if err != nil {
				return info, fmt.Errorf("data_offsets: %v", err)
			}
			if len(offs) != 2 {
				return info, fmt.Errorf("data_offsets has %d entries, want [begin, end]", len(offs))
			}
			info.Begin, info.End = offs[0], offs[1]
			haveOffsets = true
		}
	}
	switch {
	case !haveDType:
		return info, errors.New(`missing "dtype"`)
	case !haveShape:
		return info, errors.New(`missing "shape"`)
	case !haveOffsets:
		return info, errors.New(`missing "data_offsets"`)
	}
	return info, nil
}

// decodeInts decodes a JSON array of non-negative integers.
func decodeInts(raw json.RawMessage) ([]int, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var nums []json.Number
	if err := dec.Decode(&nums); err != nil || nums == nil {
		return nil, fmt.Errorf("want an array of integers, found %s", raw)
	}
	out := make([]int, len(nums))
	for i, n := range nums {
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || v < 0 || v > math.MaxInt {
			return nil, fmt.Errorf("%s is not a non-negative integer", n)
		}
		out[i] = int(v)
	}
	return out, nil
}

// checkLayout validates each tensor's size against its dtype and shape, and
// that the tensors tile the data section of dataBytes bytes exactly: sorted
// by offset, each begins where the previous ends, with no gap, overlap or
// trailing bytes (the upstream rule). It sorts infos by offset.
func checkLayout(file string, infos []Info, dataBytes int) error {
	for _, in := range infos {
		if in.End < in.Begin {
			return &FormatError{File: file, Tensor: in.Name,
				Msg: fmt.Sprintf("data_offsets [%d, %d] end before they begin", in.Begin, in.End)}
		}
		size, err := ByteSize(in.DType, in.Shape)
		if err != nil {
			return &FormatError{File: file, Tensor: in.Name, Msg: err.Error()}
		}
		if in.End-in.Begin != size {
			return &FormatError{File: file, Tensor: in.Name,
				Msg: fmt.Sprintf("data_offsets [%d, %d] hold %d bytes, but %v%v needs %d",
					in.Begin, in.End, in.End-in.Begin, in.DType, in.Shape, size)}
		}
	}
	sort.SliceStable(infos, func(i, j int) bool {
		if infos[i].Begin != infos[j].Begin {
			return infos[i].Begin < infos[j].Begin
		}
		return infos[i].End < infos[j].End
	})
	pos := 0
	for i, in := range infos {
		switch {
		case in.Begin < pos:
			return &FormatError{File: file, Tensor: in.Name,
				Msg: fmt.Sprintf("data_offsets [%d, %d] overlap tensor %s [%d, %d]",
					in.Begin, in.End, infos[i-1].Name, infos[i-1].Begin, infos[i-1].End)}
		case in.Begin > pos:
			return &FormatError{File: file, Tensor: in.Name,
				Msg: fmt.Sprintf("data_offsets [%d, %d] leave a gap of %d bytes after offset %d",
					in.Begin, in.End, in.Begin-pos, pos)}
		}
		if in.End > dataBytes {
			return &FormatError{File: file, Tensor: in.Name,
				Msg: fmt.Sprintf("data_offsets [%d, %d] run past the end of the %d-byte data section (truncated file?)",
					in.Begin, in.End, dataBytes)}
		}
		pos = in.End
	}
	if pos != dataBytes {
		what := "truncated"
		if pos < dataBytes {
			what = "trailing bytes"
		}
		return &FormatError{File: file, Msg: fmt.Sprintf(
			"data section is %d bytes but the tensors cover %d (%s)", dataBytes, pos, what)}
	}
	return nil
}
