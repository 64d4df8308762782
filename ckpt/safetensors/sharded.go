package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// File names of Hugging Face checkpoints.
const (
	// SingleFile is the file of an unsharded checkpoint.
	SingleFile = "model.safetensors"
	// IndexFile maps tensor names to shard files in a sharded checkpoint.
	IndexFile = "model.safetensors.index.json"
	// DefaultMaxShardBytes is huggingface_hub's default max_shard_size, "5GB".
	DefaultMaxShardBytes = 5_000_000_000
)

// shardName matches the shard files WriteSharded creates.
var shardName = regexp.MustCompile(`^model-[0-9]{5,}-of-[0-9]{5,}\.safetensors$`)

// Index is the content of model.safetensors.index.json:
//
//	{"metadata": {"total_size": 1234}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}
type Index struct {
	// TotalSize is metadata.total_size: the sum of the tensors' data bytes
	// (headers excluded).
	TotalSize int64
	// Extra holds any other metadata entries (transformers adds
	// "total_parameters"), kept verbatim.
	Extra map[string]json.RawMessage
	// WeightMap maps each tensor name to the shard file (a base name in the
	// index's directory) that holds it.
	WeightMap map[string]string
}

// ReadIndex reads and validates an index file: weight_map must be present,
// every file a plain base name (no directories), total_size an integer.
func ReadIndex(path string) (*Index, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &FormatError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	if !utf8.Valid(raw) {
		return nil, bad("not valid UTF-8")
	}
	top, err := decodeObject(raw)
	if err != nil {
		return nil, bad("%v", err)
	}
	idx := &Index{}
	for _, f := range top {
		switch f.key {
		case "metadata":
			if string(bytes.TrimSpace(f.val)) == "null" {
				continue
			}
			meta, err := decodeObject(f.val)
			if err != nil {
				return nil, bad("metadata: %v", err)
			}
			for _, m := range meta {
				if m.key != "total_size" {
					if idx.Extra == nil {
						idx.Extra = map[string]json.RawMessage{}
					}
					idx.Extra[m.key] = m.val
					continue
				}
				// Some writers emit total_size as a float (e.g. 1234.0).
				v, err := strconv.ParseFloat(string(m.val), 64)
				if err != nil || v < 0 || v != float64(int64(v)) {
					return nil, bad("metadata.total_size %s is not a non-negative integer", m.val)
				}
				idx.TotalSize = int64(v)
			}
		case "weight_map":
			wm, err := decodeObject(f.val)
			if err != nil {
				return nil, bad("weight_map: %v", err)
			}
			idx.WeightMap = make(map[string]string, len(wm))
			for _, w := range wm {
				var file string
				if err := json.Unmarshal(w.val, &file); err != nil {
					return nil, &FormatError{File: path, Tensor: w.key, Msg: fmt.Sprintf("weight_map value %s is not a string", w.val)}
				}
				if file == "" || file != filepath.Base(file) || file == "." || file == ".." {
					return nil, &FormatError{File: path, Tensor: w.key, Msg: fmt.Sprintf("weight_map file %q is not a file name in the index's directory", file)}
				}
				idx.WeightMap[w.key] = file
			}
		}
	}
	if idx.WeightMap == nil {
		return nil, bad(`missing "weight_map"`)
	}
	return idx, nil
}

// WriteIndex writes idx as transformers does (json.dumps(index, indent=2,
// sort_keys=True) + "\n", ASCII-only with \uXXXX escapes), through a
// temporary file that is fsynced and renamed over path.
func WriteIndex(path string, idx *Index) error {
	meta := map[string]any{"total_size": idx.TotalSize}
	for k, v := range idx.Extra {
		if k != "total_size" {
			meta[k] = v
		}
	}
	wm := idx.WeightMap
	if wm == nil {
		wm = map[string]string{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"metadata": meta, "weight_map": wm}); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	return writeFileAtomic(path, asciiEscape(buf.Bytes()))
}

// asciiEscape rewrites every non-ASCII rune (which in JSON output can only
// occur inside strings) as \uXXXX, with surrogate pairs above U+FFFF, as
// Python's json.dumps does by default.
func asciiEscape(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, r := range string(b) {
		if r < 0x80 {
			out = append(out, byte(r))
			continue
		}
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
			continue
		}
		out = fmt.Appendf(out, `\u%04x`, r)
	}
	return out
}

// writeFileAtomic writes data to a temporary file next to path, fsyncs it
// and renames it over path (mode 0644).
func writeFileAtomic(path string, data []byte) (err error) {
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
	if _, err = tmp.Write(data); err != nil {
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

// Named is a tensor with its name, for APIs where order matters.
type Named struct {
	Name string
	Tensor
}

// ShardOptions configures WriteSharded. The zero value writes 5 GB shards
// without file metadata.
type ShardOptions struct {
	// MaxShardBytes caps the tensor bytes per shard; 0 means
	// DefaultMaxShardBytes. A single larger tensor gets a shard of its own.
	MaxShardBytes int64
	// Metadata is written as every shard's __metadata__ (transformers
	// writes {"format": "pt"}); nil writes none.
	Metadata map[string]string
}

// SplitShards assigns tensors to shards with huggingface_hub's algorithm
// (split_state_dict_into_shards_factory): walk the tensors in order; a
// tensor larger than maxBytes gets a shard of its own, appended at once; a
// tensor that would push the current shard past maxBytes closes it first.
// It returns the tensor indices of each shard.
func SplitShards(sizes []int64, maxBytes int64) [][]int {
	var shards [][]int
	var cur []int
	var curBytes int64
	for i, n := range sizes {
		if n > maxBytes {
			shards = append(shards, []int{i})
			continue
		}
		if curBytes+n > maxBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, i)
		curBytes += n
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	return shards
}

// WriteSharded writes tensors into dir the way huggingface_hub's
// save_torch_state_dict does: one model.safetensors if everything fits in
// one shard, else model-00001-of-0000N.safetensors files (split by
// SplitShards in the given order) and model.safetensors.index.json, written
// last. Shard files and an index left by an earlier save that are not part
// of this one are removed. It returns the index (also for a single file).
func WriteSharded(dir string, tensors []Named, opts ShardOptions) (*Index, error) {
	maxBytes := opts.MaxShardBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxShardBytes
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("safetensors: ShardOptions.MaxShardBytes = %d, want > 0", maxBytes)
	}
	sizes := make([]int64, len(tensors))
	seen := make(map[string]bool, len(tensors))
	idx := &Index{WeightMap: make(map[string]string, len(tensors))}
	for i, t := range tensors {
		if seen[t.Name] {
			return nil, fmt.Errorf("safetensors: WriteSharded: duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		sizes[i] = int64(len(t.Data))
		idx.TotalSize += sizes[i]
	}
	shards := SplitShards(sizes, maxBytes)
	if len(shards) == 0 {
		shards = [][]int{nil} // an empty state dict still gets a file
	}
	keep := map[string]bool{}
	for s, members := range shards {
		name := SingleFile
		if len(shards) > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, len(shards))
		}
		keep[name] = true
		m := make(map[string]Tensor, len(members))
		for _, i := range members {
			m[tensors[i].Name] = tensors[i].Tensor
			idx.WeightMap[tensors[i].Name] = name
		}
		if err := WriteFile(filepath.Join(dir, name), m, opts.Metadata); err != nil {
			return nil, err
		}
	}
	if len(shards) > 1 {
		if err := WriteIndex(filepath.Join(dir, IndexFile), idx); err != nil {
			return nil, err
		}
		keep[IndexFile] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	for _, e := range entries {
		n := e.Name()
		if !keep[n] && (shardName.MatchString(n) || n == IndexFile || n == SingleFile) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return nil, fmt.Errorf("safetensors: remove stale %w", err)
			}
		}
	}
	return idx, nil
}

// Set is a checkpoint made of one or more safetensors files, opened by
// OpenDir. Like File, its tensors alias read-only mappings until Close.
type Set struct {
	files []*File
	where map[string]*File
	names []string
}

// OpenDir opens the Hugging Face checkpoint in dir: the files listed in
// model.safetensors.index.json if it exists, else model.safetensors. Every
// tensor the index names must be in the file it names.
func OpenDir(dir string) (*Set, error) {
	indexPath := filepath.Join(dir, IndexFile)
	idx, err := ReadIndex(indexPath)
	if errors.Is(err, os.ErrNotExist) {
		f, err := Open(filepath.Join(dir, SingleFile))
		if err != nil {
			return nil, err
		}
		s := &Set{files: []*File{f}, where: map[string]*File{}}
		for _, in := range f.Infos() {
			s.where[in.Name] = f
			s.names = append(s.names, in.Name)
		}
		slices.Sort(s.names)
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	s := &Set{where: make(map[string]*File, len(idx.WeightMap))}
	byFile := map[string]*File{}
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		file := idx.WeightMap[name]
		f := byFile[file]
		if f == nil {
			if f, err = Open(filepath.Join(dir, file)); err != nil {
				s.Close()
				return nil, err
			}
			byFile[file] = f
			s.files = append(s.files, f)
		}
		if _, ok := f.Info(name); !ok {
			s.Close()
			return nil, &FormatError{File: indexPath, Tensor: name, Msg: fmt.Sprintf("listed in weight_map but not in %s", file)}
		}
		s.where[name] = f
		s.names = append(s.names, name)
	}
	return s, nil
}

// Names returns the tensor names, sorted.
func (s *Set) Names() []string { return s.names }

// Tensor returns the named tensor, aliasing its file's mapping.
func (s *Set) Tensor(name string) (Tensor, error) {
	f, ok := s.where[name]
	if !ok {
		return Tensor{}, fmt.Errorf("safetensors: tensor %s not in checkpoint", name)
	}
	return f.Tensor(name)
}

// Close closes every file; tensors from s must not be used afterwards.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
