package indexed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Dataset is an opened .bin/.idx pair. Both files are memory-mapped read-only;
// token reads decode straight from the mapping. A Dataset is safe for
// concurrent reads; Close must not race with them.
type Dataset struct {
	*Index
	// Prefix is the path prefix the dataset was opened with.
	Prefix string

	idxMap, binMap []byte
}

// Open maps prefix.idx and prefix.bin and validates them: the index by
// ParseIndex, and the .bin size against the pointers and lengths.
func Open(prefix string) (*Dataset, error) {
	ds := &Dataset{Prefix: prefix}
	var err error
	if ds.idxMap, err = mmapFile(prefix + ".idx"); err != nil {
		return nil, err
	}
	if ds.Index, err = ParseIndex(prefix+".idx", ds.idxMap); err != nil {
		ds.Close()
		return nil, err
	}
	if ds.binMap, err = mmapFile(prefix + ".bin"); err != nil {
		ds.Close()
		return nil, err
	}
	if want, got := ds.binBytes(), int64(len(ds.binMap)); got != want {
		ds.Close() // the size is read before Close unmaps the file
		return nil, &FormatError{File: prefix + ".bin", Offset: got,
			Want: fmt.Sprintf("file size %d bytes (from %s), got %d", want, prefix+".idx", got)}
	}
	return ds, nil
}

// Close unmaps the files.
func (ds *Dataset) Close() error {
	var errs []error
	for _, m := range [][]byte{ds.idxMap, ds.binMap} {
		if len(m) > 0 {
			errs = append(errs, unix.Munmap(m))
		}
	}
	ds.idxMap, ds.binMap = nil, nil
	return errors.Join(errs...)
}

// SequenceBytes returns the raw .bin bytes of sequence i (zero-copy, read-only).
func (ds *Dataset) SequenceBytes(i int) []byte {
	p := ds.SequencePointer(i)
	return ds.binMap[p : p+int64(ds.SequenceLength(i))*int64(ds.DType.Size())]
}

// AppendTokens appends count tokens of sequence seq starting at token offset
// off to dst, converted to int32, and returns the extended slice. Offsets
// outside the sequence are a programming error and panic.
func (ds *Dataset) AppendTokens(dst []int32, seq, off, count int) []int32 {
	if off < 0 || count < 0 || off+count > int(ds.SequenceLength(seq)) {
		panic(fmt.Sprintf("indexed: tokens [%d, %d) outside sequence %d of length %d", off, off+count, seq, ds.SequenceLength(seq)))
	}
	sz := ds.DType.Size()
	b := ds.binMap[ds.SequencePointer(seq)+int64(off*sz):]
	le := binary.LittleEndian
	switch ds.DType {
	case UInt8:
		for i := range count {
			dst = append(dst, int32(b[i]))
		}
	case Int8:
		for i := range count {
			dst = append(dst, int32(int8(b[i])))
		}
	case Int16:
		for i := range count {
			dst = append(dst, int32(int16(le.Uint16(b[2*i:]))))
		}
	case UInt16:
		for i := range count {
			dst = append(dst, int32(le.Uint16(b[2*i:])))
		}
	case Int32:
		for i := range count {
			dst = append(dst, int32(le.Uint32(b[4*i:])))
		}
	case Int64:
		for i := range count {
			dst = append(dst, int32(int64(le.Uint64(b[8*i:]))))
		}
	case Float32:
		for i := range count {
			dst = append(dst, int32(math.Float32frombits(le.Uint32(b[4*i:]))))
		}
	case Float64:
		for i := range count {
			dst = append(dst, int32(math.Float64frombits(le.Uint64(b[8*i:]))))
		}
	}
	return dst
}

// mmapFile maps a whole file read-only; an empty file maps to nil.
func mmapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("indexed: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("indexed: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("indexed: %s is a %s, not a file (a dataset prefix P names the files P.bin and P.idx)", path, fileKind(st.Mode()))
	}
	if st.Size() == 0 {
		return nil, nil
	}
	if st.Size() != int64(int(st.Size())) {
		return nil, fmt.Errorf("indexed: %s: %d bytes is too large to map", path, st.Size())
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("indexed: mmap %s: %w", path, err)
	}
	return m, nil
}

// fileKind names a non-regular file mode for error messages.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	}
	return "special file"
}
