package safetensors

import (
	"fmt"
	"os"
	"slices"
)

// File is an opened safetensors file. Tensor data returned by its methods
// aliases the file's bytes: with Open they live in a read-only memory
// mapping (writing to them crashes the process) and are valid until Close.
// A File is safe for concurrent use by multiple goroutines, except Close.
type File struct {
	name     string
	metadata map[string]string
	infos    []Info // sorted by offset
	byName   map[string]int
	data     []byte       // the data section
	release  func() error // unmaps; nil for Parse and ReadFile
}

// Open memory-maps the safetensors file at path and validates its header.
// Where mapping is unavailable it falls back to ReadFile.
func Open(path string) (*File, error) {
	buf, release, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: open %s: %w", path, err)
	}
	if buf == nil { // no mmap on this platform, or an empty file
		return ReadFile(path)
	}
	f, err := Parse(path, buf)
	if err != nil {
		release()
		return nil, err
	}
	f.release = release
	return f, nil
}

// ReadFile reads the whole safetensors file at path into memory and
// validates its header. The tensors' data are then writable heap memory.
func ReadFile(path string) (*File, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return Parse(path, buf)
}

// Parse validates buf, the complete bytes of a safetensors file, and returns
// a File whose tensors alias buf (no copy). name is used in errors. All
// errors about the contents are *FormatError.
func Parse(name string, buf []byte) (*File, error) {
	h, err := parseHeader(name, buf)
	if err != nil {
		return nil, err
	}
	f := &File{
		name:     name,
		metadata: h.metadata,
		infos:    h.infos,
		byName:   make(map[string]int, len(h.infos)),
		data:     buf[h.dataOff:],
	}
	for i, in := range h.infos {
		f.byName[in.Name] = i
	}
	return f, nil
}

// Name returns the path or name the File was opened with.
func (f *File) Name() string { return f.name }

// Metadata returns the header's __metadata__ map, nil if there was none.
// The caller must not modify it.
func (f *File) Metadata() map[string]string { return f.metadata }

// Infos returns the header entries in file (offset) order. The caller must
// not modify them.
func (f *File) Infos() []Info { return f.infos }

// Info returns the header entry of the named tensor.
func (f *File) Info(name string) (Info, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Info{}, false
	}
	return f.infos[i], true
}

// Tensor returns the named tensor; its Data aliases the file (see File).
func (f *File) Tensor(name string) (Tensor, error) {
	i, ok := f.byName[name]
	if !ok {
		return Tensor{}, &FormatError{File: f.name, Tensor: name, Msg: "not in file"}
	}
	in := f.infos[i]
	return Tensor{DType: in.DType, Shape: slices.Clone(in.Shape), Data: f.data[in.Begin:in.End:in.End]}, nil
}

// Tensors returns every tensor by name; the data alias the file (see File).
func (f *File) Tensors() map[string]Tensor {
	m := make(map[string]Tensor, len(f.infos))
	for _, in := range f.infos {
		m[in.Name] = Tensor{DType: in.DType, Shape: slices.Clone(in.Shape), Data: f.data[in.Begin:in.End:in.End]}
	}
	return m
}

// Close releases the mapping, if any. Tensor data obtained from f must not
// be used afterwards. Close is idempotent.
func (f *File) Close() error {
	if f.release == nil {
		return nil
	}
	r := f.release
	f.release = nil
	if err := r(); err != nil {
		return fmt.Errorf("safetensors: close %s: %w", f.name, err)
	}
	return nil
}
