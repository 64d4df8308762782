package indexed

import (
	"encoding/binary"
	"fmt"
)

// Magic is the 9-byte header of every .idx file.
const Magic = "MMIDIDX\x00\x00"

// Version is the only .idx version Megatron writes and reads.
const Version = 1

// HeaderBytes is the size of the .idx header: magic, version, dtype, N, D.
const HeaderBytes = 34

// Index is a parsed .idx file (the format of Megatron's _IndexReader and
// _IndexWriter, megatron/core/datasets/indexed_dataset.py). Its arrays are decoded in place
// from the bytes given to ParseIndex (usually an mmap): accessors read
// little-endian values on demand and nothing is copied, because the int64
// arrays are not 8-byte aligned in the file.
type Index struct {
	// DType is the token dtype of the matching .bin file.
	DType DType
	// Multimodal reports whether the file carries sequence_modes.
	Multimodal bool

	n, d      int    // sequences, document_indices entries (documents + 1)
	lengths   []byte // int32[n]
	pointers  []byte // int64[n]
	documents []byte // int64[d]
	modes     []byte // int8[n], nil unless multimodal
}

// NumSequences returns N, the number of sequences.
func (x *Index) NumSequences() int { return x.n }

// NumDocuments returns the number of documents (D − 1).
func (x *Index) NumDocuments() int { return x.d - 1 }

// SequenceLength returns the number of tokens of sequence i.
func (x *Index) SequenceLength(i int) int32 {
	return int32(binary.LittleEndian.Uint32(x.lengths[4*i:]))
}

// SequencePointer returns the byte offset of sequence i in the .bin file.
func (x *Index) SequencePointer(i int) int64 {
	return int64(binary.LittleEndian.Uint64(x.pointers[8*i:]))
}

// DocumentIndex returns entry k of document_indices (0 ≤ k ≤ NumDocuments):
// document k is sequences [DocumentIndex(k), DocumentIndex(k+1)).
func (x *Index) DocumentIndex(k int) int64 {
	return int64(binary.LittleEndian.Uint64(x.documents[8*k:]))
}

// SequenceMode returns the mode of sequence i (0 unless multimodal).
func (x *Index) SequenceMode(i int) int8 {
	if x.modes == nil {
		return 0
	}
	return int8(x.modes[i])
}

// SequenceLengths returns a copy of all sequence lengths (the "sizes" array
// GPTDataset indexes with).
func (x *Index) SequenceLengths() []int32 {
	out := make([]int32, x.n)
	for i := range out {
		out[i] = x.SequenceLength(i)
	}
	return out
}

// ParseIndex parses and validates the bytes of an .idx file; file names it in
// errors. The returned Index aliases b. Every inconsistency — bad magic,
// version or dtype, a size that does not match N and D, negative lengths,
// pointers that disagree with the lengths, document indices that do not run
// from 0 to N — is a *FormatError.
func ParseIndex(file string, b []byte) (*Index, error) {
	bad := func(off int, want string, args ...any) error {
		return &FormatError{File: file, Offset: int64(off), Want: fmt.Sprintf(want, args...)}
	}
	if len(b) < HeaderBytes {
		return nil, bad(len(b), "a %d-byte header, file has only %d bytes", HeaderBytes, len(b))
	}
	if string(b[:9]) != Magic {
		return nil, bad(0, "magic %q, got %q", Magic, b[:9])
	}
	if v := binary.LittleEndian.Uint64(b[9:]); v != Version {
		return nil, bad(9, "version %d, got %d", Version, v)
	}
	x := &Index{DType: DType(b[17])}
	if !x.DType.Valid() {
		return nil, bad(17, "a dtype code 1..8, got %d", b[17])
	}
	n64, d64 := binary.LittleEndian.Uint64(b[18:]), binary.LittleEndian.Uint64(b[26:])
	// Bound N and D by the file size before any multiplication can overflow.
	if n64 > uint64(len(b)) {
		return nil, bad(18, "a sequence count that fits the %d-byte file, got %d", len(b), n64)
	}
	if d64 < 1 || d64 > uint64(len(b)) {
		return nil, bad(26, "a document_indices count ≥ 1 that fits the %d-byte file, got %d", len(b), d64)
	}
	n, d := int(n64), int(d64)
	size := HeaderBytes + 12*n + 8*d
	switch len(b) {
	case size:
	case size + n:
		x.Multimodal = n > 0
	default:
		return nil, bad(len(b), "file size %d (34+12N+8D for N=%d, D=%d) or %d with sequence modes, got %d", size, n, d, size+n, len(b))
	}
	x.n, x.d = n, d
	off := HeaderBytes
	x.lengths, off = b[off:off+4*n], off+4*n
	x.pointers, off = b[off:off+8*n], off+8*n
	x.documents, off = b[off:off+8*d], off+8*d
	if x.Multimodal {
		x.modes = b[off : off+n]
	}
	return x, x.validate(bad)
}

// validate checks the arrays against each other (O(N + D)).
func (x *Index) validate(bad func(int, string, ...any) error) error {
	item := int64(x.DType.Size())
	lenOff, ptrOff, docOff := HeaderBytes, HeaderBytes+4*x.n, HeaderBytes+12*x.n
	var ptr int64
	for i := 0; i < x.n; i++ {
		l := x.SequenceLength(i)
		if l < 0 {
			return bad(lenOff+4*i, "sequence_lengths[%d] ≥ 0, got %d", i, l)
		}
		if p := x.SequencePointer(i); p != ptr {
			return bad(ptrOff+8*i, "sequence_pointers[%d] = %d (sum of previous lengths × %d bytes), got %d", i, ptr, item, p)
		}
		ptr += int64(l) * item
	}
	prev := int64(0)
	for k := 0; k < x.d; k++ {
		v := x.DocumentIndex(k)
		if k == 0 && v != 0 {
			return bad(docOff, "document_indices[0] = 0, got %d", v)
		}
		if v < prev || v > int64(x.n) {
			return bad(docOff+8*k, "document_indices[%d] in [%d, %d] (non-decreasing), got %d", k, prev, x.n, v)
		}
		prev = v
	}
	if prev != int64(x.n) {
		return bad(docOff+8*(x.d-1), "document_indices[-1] = N = %d, got %d", x.n, prev)
	}
	return nil
}

// binBytes returns the .bin size the index describes.
func (x *Index) binBytes() int64 {
	if x.n == 0 {
		return 0
	}
	return x.SequencePointer(x.n-1) + int64(x.SequenceLength(x.n-1))*int64(x.DType.Size())
}
