package safetensors

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Encode writes tensors and metadata (which may be nil) in the safetensors
// format, byte for byte as the upstream library (Python safetensors.torch.
// save_file) does: tensors sorted by descending DType (the upstream enum
// order, so 8-byte types come first and every tensor is aligned), then by
// name; the header is compact JSON as serde_json prints it, padded with
// spaces to a multiple of 8 bytes. Metadata keys are written sorted (upstream
// uses a hash map, so its order is unspecified). It returns the bytes
// written.
func Encode(w io.Writer, tensors map[string]Tensor, metadata map[string]string) (int64, error) {
	hdr, order, err := encodeHeader(tensors, metadata)
	if err != nil {
		return 0, err
	}
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(hdr)))
	n, err := w.Write(prefix[:])
	total := int64(n)
	if err != nil {
		return total, err
	}
	n, err = w.Write(hdr)
	total += int64(n)
	if err != nil {
		return total, err
	}
	for _, name := range order {
		n, err := w.Write(tensors[name].Data)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// WriteFile writes tensors and metadata to path (see Encode) through a
// temporary file in the same directory that is fsynced and then renamed
// over path, so a reader (or a mapping) of an existing path never sees a
// partial file. The file has mode 0644. The directory itself is not fsynced.
func WriteFile(path string, tensors map[string]Tensor, metadata map[string]string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("safetensors: write %s: %w", path, err)
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if _, err = Encode(bw, tensors, metadata); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide the file from other users
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// HeaderBytes returns the padded JSON header Encode would write for these
// tensors (without the 8-byte length prefix), and the tensor names in data
// order.
func HeaderBytes(tensors map[string]Tensor, metadata map[string]string) ([]byte, []string, error) {
	return encodeHeader(tensors, metadata)
}

func encodeHeader(tensors map[string]Tensor, metadata map[string]string) ([]byte, []string, error) {
	order := make([]string, 0, len(tensors))
	for name, t := range tensors {
		if !utf8.ValidString(name) {
			return nil, nil, fmt.Errorf("safetensors: tensor name %q is not valid UTF-8", name)
		}
		if name == metadataKey {
			return nil, nil, fmt.Errorf("safetensors: tensor name %q is reserved", name)
		}
		if err := t.Validate(); err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: %v", name, err)
		}
		order = append(order, name)
	}
	slices.SortFunc(order, func(a, b string) int {
		if da, db := tensors[a].DType, tensors[b].DType; da != db {
			return int(db) - int(da) // descending dtype
		}
		return strings.Compare(a, b)
	})
	var sb strings.Builder
	sb.WriteByte('{')
	if metadata != nil {
		keys := make([]string, 0, len(metadata))
		for k, v := range metadata {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, nil, fmt.Errorf("safetensors: metadata %q is not valid UTF-8", k)
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		writeJSONString(&sb, metadataKey)
		sb.WriteString(":{")
		for i, k := range keys {
			if i > 0 {
				sb.WriteByte(',')
			}
			writeJSONString(&sb, k)
			sb.WriteByte(':')
			writeJSONString(&sb, metadata[k])
		}
		sb.WriteByte('}')
		if len(order) > 0 {
			sb.WriteByte(',')
		}
	}
	writeEntries(&sb, order, func(i int) Tensor { return tensors[order[i]] })
	sb.WriteByte('}')
	for sb.Len()%8 != 0 {
		sb.WriteByte(' ')
	}
	if sb.Len() > MaxHeaderBytes {
		return nil, nil, fmt.Errorf("safetensors: header of %d bytes exceeds the limit of %d", sb.Len(), MaxHeaderBytes)
	}
	return []byte(sb.String()), order, nil
}

// HeaderJSON returns the JSON header of a file holding tensors[i] under
// names[i] in that order, their data back to back from offset 0: no
// metadata, no length prefix, no padding. A writer that lays out the data
// itself (ckpt's O_DIRECT shard files) pads and prefixes it.
func HeaderJSON(names []string, tensors []Tensor) (string, error) {
	if len(names) != len(tensors) {
		return "", fmt.Errorf("safetensors: %d names for %d tensors", len(names), len(tensors))
	}
	for i, name := range names {
		if !utf8.ValidString(name) || name == metadataKey {
			return "", fmt.Errorf("safetensors: tensor name %q is not valid UTF-8 or is reserved", name)
		}
		if err := tensors[i].Validate(); err != nil {
			return "", fmt.Errorf("safetensors: tensor %s: %v", name, err)
		}
	}
	var sb strings.Builder
	sb.WriteByte('{')
	writeEntries(&sb, names, func(i int) Tensor { return tensors[i] })
	sb.WriteByte('}')
	return sb.String(), nil
}

// writeEntries writes the header entries of names (tensor i from
// tensor(i)), comma-separated, data offsets back to back from 0.
func writeEntries(sb *strings.Builder, names []string, tensor func(i int) Tensor) {
	off := 0
	for i, name := range names {
		t := tensor(i)
		if i > 0 {
			sb.WriteByte(',')
		}
		writeJSONString(sb, name)
		sb.WriteString(`:{"dtype":"`)
		sb.WriteString(t.DType.String())
		sb.WriteString(`","shape":[`)
		for j, s := range t.Shape {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(strconv.Itoa(s))
		}
		sb.WriteString(`],"data_offsets":[`)
		sb.WriteString(strconv.Itoa(off))
		sb.WriteByte(',')
		off += len(t.Data)
		sb.WriteString(strconv.Itoa(off))
		sb.WriteString("]}")
	}
}

// writeJSONString writes s as serde_json does: only '"', '\\' and control
// characters below 0x20 are escaped (\b \t \n \f \r, else \u00xx in lower
// case hex); everything else, including non-ASCII, is written as is.
func writeJSONString(sb *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	sb.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			sb.WriteString(`\"`)
		case c == '\\':
			sb.WriteString(`\\`)
		case c == '\b':
			sb.WriteString(`\b`)
		case c == '\t':
			sb.WriteString(`\t`)
		case c == '\n':
			sb.WriteString(`\n`)
		case c == '\f':
			sb.WriteString(`\f`)
		case c == '\r':
			sb.WriteString(`\r`)
		case c < 0x20:
			sb.WriteString(`\u00`)
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&0xF])
		default:
			sb.WriteByte(c)
		}
	}
	sb.WriteByte('"')
}
