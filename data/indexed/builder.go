package indexed

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// BuilderConfig configures a Builder. The zero value writes uint8 tokens
// without sequence modes; set DType (usually OptimalDType(vocab)).
type BuilderConfig struct {
	// DType is the token dtype; 0 means UInt8 (Megatron's default).
	DType DType
	// Multimodal writes a sequence_modes byte per sequence.
	Multimodal bool
}

// Builder writes a .bin/.idx pair byte-identical to Megatron's
// IndexedDatasetBuilder. Tokens stream to prefix.bin.tmp as they are added;
// Finalize writes prefix.idx.tmp and renames both into place, so a dataset
// already at prefix is replaced only by a complete one (a failed run, a full
// disk, leaves it as it was), and Abort removes the temporary files. It is
// not safe for concurrent use.
type Builder struct {
	cfg     BuilderConfig
	prefix  string
	bin     *os.File
	w       *bufio.Writer
	buf     []byte
	lengths []int32
	docs    []int64
	modes   []int8
}

// TempSuffix ends the names a Builder writes before Finalize renames them
// (prefix.bin.tmp, prefix.idx.tmp).
const TempSuffix = ".tmp"

// NewBuilder creates prefix.bin.tmp (truncating it) for writing; a dataset
// at prefix is not touched before Finalize.
func NewBuilder(prefix string, cfg BuilderConfig) (*Builder, error) {
	if cfg.DType == 0 {
		cfg.DType = UInt8
	}
	if !cfg.DType.Valid() {
		return nil, fmt.Errorf("indexed: builder for %s: invalid dtype code %d", prefix, cfg.DType)
	}
	f, err := os.Create(prefix + ".bin" + TempSuffix)
	if err != nil {
		return nil, fmt.Errorf("indexed: %w", err)
	}
	return &Builder{cfg: cfg, prefix: prefix, bin: f, w: bufio.NewWriterSize(f, 1<<20), docs: []int64{0}}, nil
}

// AddItem appends one sequence (add_item) with the given mode; the mode is
// ignored unless the builder is multimodal.
func (b *Builder) AddItem(tokens []int32, mode int8) error {
	if err := b.write(tokens); err != nil {
		return err
	}
	b.lengths = append(b.lengths, int32(len(tokens)))
	if b.cfg.Multimodal {
		b.modes = append(b.modes, mode)
	}
	return nil
}

// EndDocument closes the current document (end_document).
func (b *Builder) EndDocument() {
	b.docs = append(b.docs, int64(len(b.lengths)))
}

// AddDocument appends one document (add_document): tokens is the
// concatenation of its sequences, lengths their token counts (which must sum
// to len(tokens)), modes their modes (nil means all 0). A document with no
// sequences is a valid empty document.
func (b *Builder) AddDocument(tokens []int32, lengths []int, modes []int8) error {
	sum := 0
	for _, l := range lengths {
		if l < 0 {
			return fmt.Errorf("indexed: %s.bin: document %d: negative sequence length %d", b.prefix, len(b.docs)-1, l)
		}
		sum += l
	}
	if sum != len(tokens) {
		return fmt.Errorf("indexed: %s.bin: document %d: sequence lengths sum to %d, want %d tokens", b.prefix, len(b.docs)-1, sum, len(tokens))
	}
	if modes != nil && len(modes) != len(lengths) {
		return fmt.Errorf("indexed: %s.bin: document %d: %d modes for %d sequences", b.prefix, len(b.docs)-1, len(modes), len(lengths))
	}
	if err := b.write(tokens); err != nil {
		return err
	}
	for _, l := range lengths {
		b.lengths = append(b.lengths, int32(l))
	}
	if b.cfg.Multimodal {
		if modes == nil {
			modes = make([]int8, len(lengths))
		}
		b.modes = append(b.modes, modes...)
	}
	b.EndDocument()
	return nil
}

// write encodes tokens in the builder's dtype and appends them to .bin.
func (b *Builder) write(tokens []int32) error {
	b.buf = b.buf[:0]
	le := binary.LittleEndian
	for i, t := range tokens {
		if !b.cfg.DType.fits(int64(t)) {
			return fmt.Errorf("indexed: %s.bin: token %d (position %d of sequence %d) does not fit %s", b.prefix, t, i, len(b.lengths), b.cfg.DType)
		}
		switch b.cfg.DType {
		case UInt8, Int8:
			b.buf = append(b.buf, byte(t))
		case Int16, UInt16:
			b.buf = le.AppendUint16(b.buf, uint16(t))
		case Int32:
			b.buf = le.AppendUint32(b.buf, uint32(t))
		case Int64:
			b.buf = le.AppendUint64(b.buf, uint64(int64(t)))
		case Float32:
			b.buf = le.AppendUint32(b.buf, math.Float32bits(float32(t)))
		case Float64:
			b.buf = le.AppendUint64(b.buf, math.Float64bits(float64(t)))
		}
	}
	if _, err := b.w.Write(b.buf); err != nil {
		return fmt.Errorf("indexed: write %s.bin: %w", b.prefix, err)
	}
	return nil
}

// AddIndex appends the dataset at prefix (add_index): its .bin is copied and
// its sequences and documents follow the ones already added. Its dtype must
// match the builder's.
func (b *Builder) AddIndex(prefix string) error {
	other, err := Open(prefix)
	if err != nil {
		return err
	}
	defer other.Close()
	if other.DType != b.cfg.DType {
		return fmt.Errorf("indexed: add_index %s: dtype %s, builder writes %s", prefix, other.DType, b.cfg.DType)
	}
	offset := int64(len(b.lengths))
	for i := 0; i < other.NumSequences(); i++ {
		b.lengths = append(b.lengths, other.SequenceLength(i))
		if b.cfg.Multimodal {
			b.modes = append(b.modes, other.SequenceMode(i))
		}
	}
	for k := 1; k <= other.NumDocuments(); k++ {
		b.docs = append(b.docs, offset+other.DocumentIndex(k))
	}
	if len(other.binMap) > 0 {
		if _, err := b.w.Write(other.binMap); err != nil {
			return fmt.Errorf("indexed: add_index %s: write %s.bin: %w", prefix, b.prefix, err)
		}
	}
	return nil
}

// Finalize flushes and closes prefix.bin.tmp, writes prefix.idx.tmp, and
// renames them to prefix.bin and prefix.idx (.bin first: a crash between
// the two renames leaves a .bin the old .idx does not describe, which Open
// reports). On error the temporary files are removed.
func (b *Builder) Finalize() error {
	if err := b.finalize(); err != nil {
		b.Abort()
		return err
	}
	return nil
}

func (b *Builder) finalize() error {
	if b.bin == nil {
		return fmt.Errorf("indexed: finalize %s: builder already finalized or aborted", b.prefix)
	}
	err := b.w.Flush()
	if cerr := b.bin.Close(); err == nil {
		err = cerr
	}
	b.bin = nil
	if err != nil {
		return fmt.Errorf("indexed: finalize %s.bin: %w", b.prefix, err)
	}
	f, err := os.Create(b.prefix + ".idx" + TempSuffix)
	if err != nil {
		return fmt.Errorf("indexed: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = WriteIndex(w, b.cfg.DType, b.lengths, b.docs, b.modes)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("indexed: write %s.idx: %w", b.prefix, err)
	}
	for _, ext := range []string{".bin", ".idx"} {
		if err := os.Rename(b.prefix+ext+TempSuffix, b.prefix+ext); err != nil {
			return fmt.Errorf("indexed: finalize %s: %w", b.prefix, err)
		}
	}
	return nil
}

// Abort closes the builder without writing the dataset and removes its
// temporary files; a dataset at prefix is left as it was. It is a no-op
// after Finalize.
func (b *Builder) Abort() {
	if b.bin != nil {
		_ = b.bin.Close()
		b.bin = nil
	}
	_ = os.Remove(b.prefix + ".bin" + TempSuffix)
	_ = os.Remove(b.prefix + ".idx" + TempSuffix)
}

// WriteIndex writes an .idx image: header, lengths, pointers derived from the
// lengths, document indices and, when modes is non-nil, sequence modes.
func WriteIndex(w io.Writer, dtype DType, lengths []int32, docs []int64, modes []int8) error {
	if modes != nil && len(modes) != len(lengths) {
		return errors.New("indexed: WriteIndex: len(modes) != len(lengths)")
	}
	le := binary.LittleEndian
	hdr := make([]byte, 0, HeaderBytes)
	hdr = append(hdr, Magic...)
	hdr = le.AppendUint64(hdr, Version)
	hdr = append(hdr, byte(dtype))
	hdr = le.AppendUint64(hdr, uint64(len(lengths)))
	hdr = le.AppendUint64(hdr, uint64(len(docs)))
	buf := make([]byte, 0, 1<<16)
	flush := func(force bool) error {
		if len(buf) >= 1<<15 || force {
			_, err := w.Write(buf)
			buf = buf[:0]
			return err
		}
		return nil
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	for _, l := range lengths {
		buf = le.AppendUint32(buf, uint32(l))
		if err := flush(false); err != nil {
			return err
		}
	}
	ptr, item := int64(0), int64(dtype.Size())
	for _, l := range lengths {
		buf = le.AppendUint64(buf, uint64(ptr))
		ptr += int64(l) * item
		if err := flush(false); err != nil {
			return err
		}
	}
	for _, d := range docs {
		buf = le.AppendUint64(buf, uint64(d))
		if err := flush(false); err != nil {
			return err
		}
	}
	for _, m := range modes {
		buf = append(buf, byte(m))
	}
	return flush(true)
}
