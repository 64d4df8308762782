package torchpt

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"strings"
	"sync"
)

// File is an opened torch.save file: Root is the unpickled object, whose
// tensors read their storages from the file on demand (until Close).
type File struct {
	Path string
	Root any
	// Legacy is true for the pre-1.6 format (a pickle stream followed by raw
	// storages) rather than the zip archive.
	Legacy bool

	f        *os.File
	storages map[string]*Storage
	order    []string // storage keys in first-use order
}

// Close releases the file. Tensors cannot be read afterwards.
func (f *File) Close() error {
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	return err
}

// Storages returns the file's storages in the order the pickle names them.
func (f *File) Storages() []*Storage {
	out := make([]*Storage, len(f.order))
	for i, k := range f.order {
		out[i] = f.storages[k]
	}
	return out
}

// record is where a storage's bytes are: a region of the file (stored zip
// entries, legacy files) or a compressed zip entry inflated on first use.
type record struct {
	size int64
	at   io.ReaderAt
	zf   *zip.File

	once sync.Once
	data []byte
	err  error
}

func (r *record) readAt(b []byte, off int64) error {
	if r.at != nil {
		_, err := r.at.ReadAt(b, off)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	r.once.Do(func() {
		rc, err := r.zf.Open()
		if err != nil {
			r.err = err
			return
		}
		defer rc.Close()
		r.data, r.err = io.ReadAll(io.LimitReader(rc, r.size))
		if r.err == nil && int64(len(r.data)) != r.size {
			r.err = io.ErrUnexpectedEOF
		}
	})
	if r.err != nil {
		return r.err
	}
	copy(b, r.data[off:])
	return nil
}

// maxPickle bounds the size of a zip checkpoint's data.pkl, which holds the
// structure only (tensor data is in the storages).
const maxPickle = 1 << 32

// legacyMagic is the number torch.save's legacy format starts with.
var legacyMagic, _ = new(big.Int).SetString("1950a86a20f9469cfc6c", 16)

// Open reads the structure of a torch.save file (zip archive, or the legacy
// pre-1.6 stream) and checks that every storage it names is present and
// large enough. Errors name the file.
func Open(path string) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("torchpt: %w", err)
	}
	f := &File{Path: path, f: osf, storages: map[string]*Storage{}}
	if err := f.open(); err != nil {
		osf.Close()
		return nil, fmt.Errorf("torchpt: %s: %w", path, err)
	}
	return f, nil
}

func (f *File) open() error {
	st, err := f.f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	head := make([]byte, 512)
	n, _ := f.f.ReadAt(head, 0)
	head = head[:n]
	switch {
	case n == 0:
		return errors.New("empty file, not a PyTorch checkpoint")
	case bytes.HasPrefix(head, []byte("PK")):
		return f.openZip(size)
	case head[0] == opProto:
		f.Legacy = true
		return f.openLegacy(size)
	case n >= 262 && string(head[257:262]) == "ustar":
		return errors.New("a tar archive: the tar checkpoint format of PyTorch before 0.4 is not supported (re-save with torch.save)")
	}
	return fmt.Errorf("not a PyTorch checkpoint: neither a zip archive nor a pickle stream (starts with % x)", head[:min(n, 8)])
}

func (f *File) openZip(size int64) error {
	zr, err := zip.NewReader(f.f, size)
	if err != nil {
		return fmt.Errorf("not a valid zip archive (truncated or corrupt?): %v", err)
	}
	var pkl *zip.File
	prefix := ""
	recs := map[string]*zip.File{}
	for _, zf := range zr.File {
		recs[zf.Name] = zf
		if base, ok := strings.CutSuffix(zf.Name, "data.pkl"); ok && strings.Count(base, "/") <= 1 && (base == "" || strings.HasSuffix(base, "/")) {
			if pkl != nil {
				return fmt.Errorf("two data.pkl records (%s, %s)", pkl.Name, zf.Name)
			}
			pkl, prefix = zf, base
		}
	}
	if pkl == nil {
		return errors.New("a zip archive without data.pkl: not a torch.save checkpoint")
	}
	if bo, ok := recs[prefix+"byteorder"]; ok {
		b, err := readRecord(bo, 16)
		if err != nil {
			return fmt.Errorf("%s: %w", bo.Name, err)
		}
		if s := strings.TrimSpace(string(b)); s != "little" {
			return fmt.Errorf("%s says %q: only little-endian checkpoints are supported", bo.Name, s)
		}
	}
	if pkl.UncompressedSize64 > maxPickle {
		return fmt.Errorf("%s is %d bytes, over the %d-byte limit", pkl.Name, pkl.UncompressedSize64, int64(maxPickle))
	}
	data, err := readRecord(pkl, int64(pkl.UncompressedSize64))
	if err != nil {
		return fmt.Errorf("%s: %w", pkl.Name, err)
	}
	root, _, err := Unpickle(data, f.storageFromPID)
	if err != nil {
		return fmt.Errorf("%s: %w", pkl.Name, err)
	}
	f.Root = root
	for _, key := range f.order {
		s := f.storages[key]
		name := prefix + "data/" + key
		zf, ok := recs[name]
		if !ok {
			return fmt.Errorf("storage %s: record %s is missing from the archive", key, name)
		}
		rec := &record{size: int64(zf.UncompressedSize64), zf: zf}
		if zf.Method == zip.Store {
			off, err := zf.DataOffset()
			if err != nil {
				return fmt.Errorf("record %s: %w", name, err)
			}
			if off+rec.size > size || rec.size < 0 {
				return fmt.Errorf("record %s (%d bytes at offset %d) runs past the end of the %d-byte file: truncated", name, rec.size, off, size)
			}
			rec.at = io.NewSectionReader(f.f, off, rec.size)
		}
		if err := s.attach(rec, name); err != nil {
			return err
		}
	}
	return nil
}

// attach checks that rec holds the storage's bytes.
func (s *Storage) attach(rec *record, name string) error {
	if s.Known {
		if need := s.Numel * elemSize(s.DType); rec.size < need {
			return fmt.Errorf("storage %s: record %s holds %d bytes, %d %v elements need %d: truncated", s.Key, name, rec.size, s.Numel, s.DType, need)
		}
	}
	s.rec = rec
	return nil
}

func readRecord(zf *zip.File, limit int64) ([]byte, error) {
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit))
	if err != nil {
		return nil, fmt.Errorf("%w (truncated or corrupt archive?)", err)
	}
	return b, nil
}

// openLegacy reads the pre-1.6 format (torch/serialization.py, _legacy_save):
// pickles of the magic number, the protocol version (1001) and a sys_info
// dict, the object pickle, the list of storage keys, then each storage as an
// 8-byte little-endian element count followed by its bytes.
func (f *File) openLegacy(size int64) error {
	br := bufio.NewReader(io.NewSectionReader(f.f, 0, size))
	consumed := int64(0)
	next := func(what string, pl PersistentLoader) (any, error) {
		u := newUnpickler(br, size-consumed, pl)
		v, err := u.run()
		consumed += u.pos
		if err != nil {
			return nil, fmt.Errorf("legacy format, %s pickle: %w", what, err)
		}
		return v, nil
	}
	magic, err := next("magic number", nil)
	if err != nil {
		return err
	}
	if m, ok := magic.(*big.Int); !ok || m.Cmp(legacyMagic) != 0 {
		return fmt.Errorf("a pickle, but not a torch.save file (first value %v, want the magic number 0x%x)", magic, legacyMagic)
	}
	version, err := next("protocol version", nil)
	if err != nil {
		return err
	}
	if version != int64(1001) {
		return fmt.Errorf("legacy format protocol version %v, want 1001", version)
	}
	sys, err := next("sys_info", nil)
	if err != nil {
		return err
	}
	if d, ok := sys.(*Dict); ok {
		if le, ok := d.Get("little_endian"); ok && le == false {
			return errors.New("saved on a big-endian machine: not supported")
		}
	}
	if f.Root, err = next("object", f.storageFromPID); err != nil {
		return err
	}
	keysV, err := next("storage keys", nil)
	if err != nil {
		return err
	}
	keys, ok := keysV.(*List)
	if !ok {
		return fmt.Errorf("legacy format: storage keys are a %s, want a list", typeName(keysV))
	}
	off := consumed
	for _, k := range keys.Items {
		key, ok := k.(string)
		if !ok {
			return fmt.Errorf("legacy format: storage key is a %s, want a str", typeName(k))
		}
		s, ok := f.storages[key]
		if !ok {
			return fmt.Errorf("legacy format: storage %s is listed but no tensor uses it", key)
		}
		if !s.Known {
			return fmt.Errorf("legacy format: storage %s (%s): unknown element size", key, s.Type)
		}
		var cnt [8]byte
		if _, err := f.f.ReadAt(cnt[:], off); err != nil {
			return fmt.Errorf("legacy format: storage %s: size at offset %d: %v (truncated?)", key, off, err)
		}
		numel := int64(binary.LittleEndian.Uint64(cnt[:]))
		es := elemSize(s.DType)
		if numel < 0 || numel > maxElements || off+8+numel*es > size {
			return fmt.Errorf("legacy format: storage %s: %d elements at offset %d run past the end of the %d-byte file: truncated", key, numel, off+8, size)
		}
		rec := &record{size: numel * es, at: io.NewSectionReader(f.f, off+8, numel*es)}
		if err := s.attach(rec, fmt.Sprintf("at offset %d", off+8)); err != nil {
			return err
		}
		off += 8 + numel*es
	}
	for _, key := range f.order {
		if f.storages[key].rec == nil {
			return fmt.Errorf("legacy format: storage %s is used but not in the file's storage list", key)
		}
	}
	return nil
}
