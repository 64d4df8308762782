package ckpt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/internal/checked"
)

// Format version 2: sharded checkpoints, written by every rank in parallel.
//
//	<save>/iter_0000100/checkpoint.json         metadata, written last: the completion marker
//	<save>/iter_0000100/rank_00000.safetensors  the shards world rank 0 owns
//	<save>/iter_0000100/rank_00001.safetensors  ...
//
// A logical tensor (a parameter, or one optimizer buffer of a parameter, by
// Megatron name) has a global shape; each shard is a rectangular Block of it
// (a global offset and a shape) of which a row-major element range is
// stored: a tensor-parallel rank's slice is one block (two for SwiGLU's
// [gate; up] rows), a distributed-optimizer rank's piece is a flat range of
// such a block. Replicated tensors (across data-parallel ranks, or norm
// weights across tensor-parallel ranks) are written by one rank only, so
// every element is stored exactly once; FinishSharded checks that.
//
// Loading reads, for each block a rank wants, the overlapping parts of the
// shards that cover it, from memory-mapped files: only those byte ranges
// are touched, and each shard's CRC-32C is checked before its first use.

const (
	shardedVersion = 2
	// layoutVersion1 is what Save writes: one file per tensor group, whole
	// tensors.
	layoutVersion1 = 1
)

// Block is the part of a global tensor a shard holds, or a reader wants: the
// rectangle at Offset with Shape, of which the row-major elements [Lo, Hi)
// (counted within the rectangle) are meant. Tensors have at most two
// dimensions; a 1-D tensor is one row.
type Block struct {
	Offset []int `json:"offset"`
	Shape  []int `json:"shape"`
	Lo     int   `json:"lo"`
	Hi     int   `json:"hi"`
}

// Whole is the block covering all of a tensor of the given shape.
func Whole(shape []int) Block {
	return Block{Offset: make([]int, len(shape)), Shape: slices.Clone(shape), Hi: numel(shape)}
}

// Len is the number of elements the block means.
func (b Block) Len() int { return b.Hi - b.Lo }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// checkShape validates a tensor's global shape as read from a file: at
// most two dimensions, none negative, and an element count that fits an
// int (numel must not wrap).
func checkShape(shape []int) error {
	if len(shape) > 2 {
		return fmt.Errorf("tensor of shape %v: at most 2 dimensions are supported", shape)
	}
	n := 1
	for _, d := range shape {
		var ok bool
		if n, ok = checked.MulInt(n, d); !ok || d < 0 {
			return fmt.Errorf("tensor of shape %v: dimensions must be non-negative and their product fit in an int", shape)
		}
	}
	return nil
}

// check validates b against a tensor of global shape (itself valid by
// checkShape).
func (b Block) check(shape []int) error {
	if len(b.Offset) != len(shape) || len(b.Shape) != len(shape) {
		return fmt.Errorf("block %v+%v has not the %d dimensions of %v", b.Offset, b.Shape, len(shape), shape)
	}
	if err := checkShape(shape); err != nil {
		return err
	}
	for i := range shape {
		// Offset and Shape are each within [0, shape[i]] before they are
		// added, so the sum cannot wrap.
		if b.Offset[i] < 0 || b.Shape[i] < 0 || b.Offset[i] > shape[i] || b.Shape[i] > shape[i] || b.Offset[i]+b.Shape[i] > shape[i] {
			return fmt.Errorf("block %v+%v is outside the tensor's shape %v", b.Offset, b.Shape, shape)
		}
	}
	if b.Lo < 0 || b.Lo > b.Hi || b.Hi > numel(b.Shape) {
		return fmt.Errorf("block %v+%v: element range [%d, %d) outside its %d elements", b.Offset, b.Shape, b.Lo, b.Hi, numel(b.Shape))
	}
	return nil
}

// rows returns the block as (row offset, column offset, rows, columns).
func (b Block) rows() (r0, c0, nr, nc int) {
	switch len(b.Shape) {
	case 0:
		return 0, 0, 1, 1
	case 1:
		return 0, b.Offset[0], 1, b.Shape[0]
	}
	return b.Offset[0], b.Offset[1], b.Shape[0], b.Shape[1]
}

// copyOverlap copies the elements that both src (whose stored elements are
// sv) and dst (stored in dv) mean, from sv into dv, and returns how many;
// with dv nil it only counts them.
func copyOverlap(dst Block, dv []float32, src Block, sv []float32) int {
	dr, dc, dnr, dnc := dst.rows()
	sr, sc, snr, snc := src.rows()
	if dnc == 0 || snc == 0 {
		return 0
	}
	// The rows each block's element range touches.
	rlo := max(dr+dst.Lo/dnc, sr+src.Lo/snc)
	rhi := min(dr+(dst.Hi+dnc-1)/dnc, sr+(src.Hi+snc-1)/snc, dr+dnr, sr+snr)
	n := 0
	for r := rlo; r < rhi; r++ {
		// Columns of row r meant by each block: the rectangle's, cut by its
		// element range.
		dFirst := (r - dr) * dnc // element index of (r, dc) within dst
		sFirst := (r - sr) * snc
		c0 := max(dc, sc, dc+dst.Lo-dFirst, sc+src.Lo-sFirst)
		c1 := min(dc+dnc, sc+snc, dc+dst.Hi-dFirst, sc+src.Hi-sFirst)
		if c1 <= c0 {
			continue
		}
		if dv == nil {
			n += c1 - c0
			continue
		}
		di := dFirst + c0 - dc - dst.Lo
		si := sFirst + c0 - sc - src.Lo
		n += copy(dv[di:di+c1-c0], sv[si:si+c1-c0])
	}
	return n
}

// Piece is one shard a rank saves: the Block of the logical tensor
// Group/Name (of GlobalShape) whose meant elements are Data.
type Piece struct {
	Group, Name string
	GlobalShape []int
	Block
	Data []float32
}

// ShardRecord is one shard in checkpoint.json: the block of the tensor it
// holds and where: the file, the tensor's key in it, its CRC-32C.
type ShardRecord struct {
	File   string `json:"file"`
	Key    string `json:"key"`
	CRC32C string `json:"crc32c"`
	Block
}

// TensorRecord is a logical tensor in checkpoint.json.
type TensorRecord struct {
	DType  string        `json:"dtype"`
	Shape  []int         `json:"shape"`
	Shards []ShardRecord `json:"shards"`
}

// fragment is what one rank reports of its part of a sharded save, in
// rank_NNNNN.json beside its file; FinishSharded merges them.
type fragment struct {
	Rank    int                                `json:"rank"`
	File    string                             `json:"file,omitempty"`
	Record  fileRecord                         `json:"record"`
	Tensors map[string]map[string]TensorRecord `json:"tensors"`
}

// Layout describes the parallel layout a sharded checkpoint was saved with,
// for inspection and messages (loading never depends on it).
type Layout struct {
	WorldSize            int  `json:"world_size"`
	TensorParallel       int  `json:"tensor_model_parallel_size"`
	PipelineParallel     int  `json:"pipeline_model_parallel_size"`
	DataParallel         int  `json:"data_parallel_size"`
	VirtualStages        int  `json:"virtual_pipeline_model_parallel_size,omitempty"`
	DistributedOptimizer bool `json:"use_distributed_optimizer,omitempty"`
}

// shardedMeta is the whole of a version-2 checkpoint.json.
type shardedMeta struct {
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`
	Meta
	Layout  Layout                             `json:"layout"`
	Files   map[string]fileRecord              `json:"files"`
	Tensors map[string]map[string]TensorRecord `json:"tensors"`
}

// ShardedTempDir is the directory a sharded save of iteration writes into
// before FinishSharded renames it into place. Every rank computes the same
// name; one rank (BeginSharded) creates it.
func ShardedTempDir(dir string, iteration int) string {
	return filepath.Join(dir, tmpPrefix+IterDirName(iteration)+"-sharded")
}

// BeginSharded prepares a sharded save of iteration into dir: it removes
// leftovers of interrupted saves and creates the temporary directory the
// ranks write into. One rank calls it, before any WriteShards.
func BeginSharded(dir string, iteration int) error {
	if iteration < 0 {
		return fmt.Errorf("ckpt: iteration %d, want >= 0", iteration)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := removeStale(dir); err != nil {
		return err
	}
	if err := os.Mkdir(ShardedTempDir(dir, iteration), 0o755); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	return nil
}

func rankFile(rank int) string     { return fmt.Sprintf("rank_%05d.safetensors", rank) }
func fragmentFile(rank int) string { return fmt.Sprintf("rank_%05d.json", rank) }

// WriteShards writes rank's pieces of a sharded save (begun by BeginSharded)
// as one safetensors file, fsynced, and a small report of them for
// FinishSharded. Every rank of the job calls it, with or without pieces.
// The pieces' data are read, not kept.
func WriteShards(ctx context.Context, dir string, iteration, rank int, pieces []Piece) error {
	_, err := writeShards(ctx, dir, iteration, rank, pieces, false, 0)
	return err
}

// WriteShardsInBackground is WriteShards for a writer running beside
// training (--async-save): it works a megabyte at a time and yields the
// processor in between, so that the training goroutines, which wait for
// each other at every kernel's end, get one back at once instead of after
// a scheduler time slice; with maxRate > 0 it writes at most maxRate bytes
// per second, spreading the I/O's CPU cost over more training steps. It
// writes with O_DIRECT where the filesystem allows it, without a copy for
// pieces laid back to back from the start of a buffer from
// AlignedFloat32s (see direct_io.go).
func WriteShardsInBackground(ctx context.Context, dir string, iteration, rank int, pieces []Piece, maxRate float64) error {
	_, err := writeShards(ctx, dir, iteration, rank, pieces, true, maxRate)
	return err
}

// yieldBytes is how much a background writer checksums or writes between
// yields.
const yieldBytes = 1 << 20

// checksum is the CRC-32C of data, yielding every yieldBytes when asked.
func checksum(data []byte, yield bool) uint32 {
	if !yield {
		return crc32.Checksum(data, castagnoli)
	}
	var c uint32
	for len(data) > 0 {
		k := min(len(data), yieldBytes)
		c = crc32.Update(c, castagnoli, data[:k])
		data = data[k:]
		runtime.Gosched()
	}
	return c
}

// writeShards writes rank's file and report, and tells how the file was
// written (see writeShardFile; a background writer, yield, uses O_DIRECT).
func writeShards(ctx context.Context, dir string, iteration, rank int, pieces []Piece, yield bool, maxRate float64) (writeStats, error) {
	tmp := ShardedTempDir(dir, iteration)
	name := IterDirName(iteration)
	fr := fragment{Rank: rank, Tensors: map[string]map[string]TensorRecord{}}
	var ws writeStats
	var entries []shardEntry
	keyCount := map[string]int{}
	for _, p := range pieces {
		if !groupName.MatchString(p.Group) {
			return ws, fmt.Errorf("ckpt: rank %d: group name %q: want lower-case letters, digits and '_'", rank, p.Group)
		}
		if err := p.Block.check(p.GlobalShape); err != nil {
			return ws, fmt.Errorf("ckpt: rank %d: %s/%s: %v", rank, p.Group, p.Name, err)
		}
		if len(p.Data) != p.Len() {
			return ws, fmt.Errorf("ckpt: rank %d: %s/%s: %d values for a block of %d", rank, p.Group, p.Name, len(p.Data), p.Len())
		}
		base := p.Group + "/" + p.Name
		key := base + "#" + strconv.Itoa(keyCount[base])
		keyCount[base]++
		shape := p.Block.Shape
		if p.Lo != 0 || p.Hi != numel(p.Block.Shape) {
			shape = []int{p.Len()}
		}
		data := safetensors.Float32Bytes(p.Data)
		entries = append(entries, shardEntry{key: key, dtype: safetensors.F32, shape: slices.Clone(shape), data: data})
		g := fr.Tensors[p.Group]
		if g == nil {
			g = map[string]TensorRecord{}
			fr.Tensors[p.Group] = g
		}
		tr := g[p.Name]
		if tr.Shape != nil && !slices.Equal(tr.Shape, p.GlobalShape) {
			return ws, fmt.Errorf("ckpt: rank %d: %s/%s: pieces disagree on the global shape (%v, %v)", rank, p.Group, p.Name, tr.Shape, p.GlobalShape)
		}
		tr.DType, tr.Shape = safetensors.F32.String(), slices.Clone(p.GlobalShape)
		tr.Shards = append(tr.Shards, ShardRecord{File: rankFile(rank), Key: key,
			CRC32C: fmt.Sprintf("%08x", checksum(data, yield)),
			Block:  Block{Offset: slices.Clone(p.Offset), Shape: slices.Clone(p.Block.Shape), Lo: p.Lo, Hi: p.Hi}})
		g[p.Name] = tr
	}
	if len(entries) > 0 {
		fr.File = rankFile(rank)
		sv := saver{shardCRCs: true, yield: yield, maxRate: maxRate}
		if yield {
			sv.chunkBytes = yieldBytes
		}
		rec, st, err := sv.writeShardFile(ctx, filepath.Join(tmp, fr.File), name+"/"+fr.File, entries, yield)
		if err != nil {
			return ws, fmt.Errorf("ckpt: rank %d: %w", rank, err)
		}
		fr.Record, ws = rec, st
	}
	js, err := json.Marshal(fr)
	if err != nil {
		return ws, fmt.Errorf("ckpt: rank %d: %w", rank, err)
	}
	path := filepath.Join(tmp, fragmentFile(rank))
	os.Remove(path) // a retry of the same save
	if err := writeSynced(path, js); err != nil {
		return ws, fmt.Errorf("ckpt: rank %d: %w", rank, err)
	}
	return ws, nil
}

// FinishSharded completes a sharded save once every one of the layout's
// WorldSize ranks has returned from WriteShards: it merges their reports,
// checks that every tensor's elements are stored exactly once, writes
// checkpoint.json (the completion marker), renames the directory into
// place and points the tracker file at it, all fsynced. One rank calls it.
// A failure, or a crash, at any point leaves the previous checkpoint as
// the latest.
func FinishSharded(dir string, iteration int, meta Meta, layout Layout) error {
	tmp := ShardedTempDir(dir, iteration)
	name := IterDirName(iteration)
	meta.Iteration = iteration
	for _, raw := range []json.RawMessage{meta.Args, meta.RNGState, meta.Scheduler} {
		if raw != nil && !json.Valid(raw) {
			return fmt.Errorf("ckpt: FinishSharded: Meta holds invalid JSON %.40q", raw)
		}
	}
	sm := shardedMeta{Format: FormatName, FormatVersion: shardedVersion, Meta: meta, Layout: layout,
		Files: map[string]fileRecord{}, Tensors: map[string]map[string]TensorRecord{}}
	for r := range layout.WorldSize {
		raw, err := os.ReadFile(filepath.Join(tmp, fragmentFile(r)))
		if err != nil {
			return fmt.Errorf("ckpt: save of %s incomplete: rank %d wrote no %s: %w", name, r, fragmentFile(r), err)
		}
		var fr fragment
		if err := json.Unmarshal(raw, &fr); err != nil || fr.Rank != r {
			return fmt.Errorf("ckpt: save of %s: %s is not rank %d's report (%v)", name, fragmentFile(r), r, err)
		}
		if fr.File != "" {
			sm.Files[fr.File] = fr.Record
		}
		for g, ts := range fr.Tensors {
			if sm.Tensors[g] == nil {
				sm.Tensors[g] = map[string]TensorRecord{}
			}
			for n, tr := range ts {
				have, ok := sm.Tensors[g][n]
				if ok && (!slices.Equal(have.Shape, tr.Shape) || have.DType != tr.DType) {
					return fmt.Errorf("ckpt: save of %s: tensor %s/%s is %s%v on one rank and %s%v on rank %d", name, g, n, have.DType, have.Shape, tr.DType, tr.Shape, r)
				}
				have.DType, have.Shape = tr.DType, tr.Shape
				have.Shards = append(have.Shards, tr.Shards...)
				sm.Tensors[g][n] = have
			}
		}
	}
	if err := checkCoverage(name, sm.Tensors); err != nil {
		return err
	}
	js, err := json.MarshalIndent(sm, "", " ")
	if err != nil {
		return fmt.Errorf("ckpt: %s/%s: %w", name, MetaFile, err)
	}
	if err := writeSynced(filepath.Join(tmp, MetaFile), append(js, '\n')); err != nil {
		return err
	}
	for r := range layout.WorldSize {
		os.Remove(filepath.Join(tmp, fragmentFile(r)))
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := replaceDir(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	tracker := filepath.Join(dir, TrackerFile)
	if err := writeSyncedAtomic(tracker, tmpPrefix+TrackerFile+"-", []byte(strconv.Itoa(iteration))); err != nil {
		return err
	}
	return syncDir(dir)
}

// AbortSharded removes the temporary directory of a failed sharded save.
func AbortSharded(dir string, iteration int) error {
	return os.RemoveAll(ShardedTempDir(dir, iteration))
}

// checkCoverage verifies that the shards of every tensor store each of its
// elements once: no shard outside the tensor, no two overlapping, and the
// stored counts adding up to its size.
func checkCoverage(name string, tensors map[string]map[string]TensorRecord) error {
	var errs []error
	for _, g := range slices.Sorted(maps.Keys(tensors)) {
		for _, n := range slices.Sorted(maps.Keys(tensors[g])) {
			tr := tensors[g][n]
			if err := checkShape(tr.Shape); err != nil {
				errs = append(errs, fmt.Errorf("ckpt: %s: tensor %s/%s: %v", name, g, n, err))
				continue
			}
			stored, bad := 0, false
			for _, s := range tr.Shards {
				if err := s.Block.check(tr.Shape); err != nil {
					errs = append(errs, fmt.Errorf("ckpt: %s: tensor %s/%s: %v", name, g, n, err))
					bad = true
					continue
				}
				var ok bool
				if stored, ok = checked.AddInt(stored, s.Len()); !ok {
					errs = append(errs, fmt.Errorf("ckpt: %s: tensor %s/%s: its shards' element counts overflow", name, g, n))
					bad = true
					break
				}
			}
			if bad {
				continue
			}
			if err := disjoint(tr.Shards); err != nil {
				errs = append(errs, fmt.Errorf("ckpt: %s: tensor %s/%s: %v", name, g, n, err))
				continue
			}
			if stored != numel(tr.Shape) {
				errs = append(errs, fmt.Errorf("ckpt: %s: tensor %s/%s of shape %v (%d elements): its shards store %d",
					name, g, n, tr.Shape, numel(tr.Shape), stored))
			}
		}
	}
	return errors.Join(errs...)
}

// disjoint checks that no element is stored by two shards.
func disjoint(shards []ShardRecord) error {
	for i := range shards {
		for j := range i {
			a, b := shards[i], shards[j]
			if len(a.Offset) == len(b.Offset) && overlaps(a.Block, b.Block) && copyOverlap(a.Block, nil, b.Block, nil) > 0 {
				return fmt.Errorf("shards %s:%s and %s:%s store the same elements", a.File, a.Key, b.File, b.Key)
			}
		}
	}
	return nil
}

// checkShardKeys refuses metadata in which two shard records name the same
// stored tensor (file and key): a save gives every shard a key of its own,
// so such a checkpoint.json points one tensor at another's bytes, and the
// CRC-32C it copied with them would let it pass.
func checkShardKeys(name string, tensors map[string]map[string]TensorRecord) error {
	owner := map[[2]string]string{}
	for _, g := range slices.Sorted(maps.Keys(tensors)) {
		for _, n := range slices.Sorted(maps.Keys(tensors[g])) {
			for _, s := range tensors[g][n].Shards {
				k := [2]string{s.File, s.Key}
				if prev, ok := owner[k]; ok {
					return fmt.Errorf("ckpt: %s/%s: tensors %s and %s/%s both name shard %s:%s (each shard is stored once)",
						name, MetaFile, prev, g, n, s.File, s.Key)
				}
				owner[k] = g + "/" + n
			}
		}
	}
	return nil
}

// Reader reads tensors, or blocks of them, from a checkpoint of either
// format version. It is not safe for concurrent use.
type Reader struct {
	Meta Meta
	// Layout is the parallel layout of a sharded checkpoint (zero for one
	// written whole by Save).
	Layout Layout
	// Version is the checkpoint's format version.
	Version int

	iterDir string // "iter_0000100"
	path    string // its full path
	tensors map[string]map[string]TensorRecord
	files   map[string]fileRecord
	open    map[string]*safetensors.File
	// checked holds the shard records ("file key crc") whose bytes have
	// been checked against their CRC-32C. The recorded CRC is part of the
	// key: a record is verified against its own checksum, never on the
	// strength of another record that names the same bytes.
	checked map[string]bool
	// copied counts the values Read has filled in (ValuesRead).
	copied int64
}

// ValuesRead is how many tensor values Read has filled in so far: what a
// rank that reads its part of a checkpoint took out of it.
func (r *Reader) ValuesRead() int64 { return r.copied }

// Open opens the checkpoint of iteration in dir (the latest when iteration
// is negative) for reading. It reads checkpoint.json and checks the sizes
// of the files it lists; tensor data are read, and checksummed, on demand.
// The Reader must be closed.
func Open(dir string, iteration int) (*Reader, error) {
	iteration, name, iterDir, mf, raw, err := locate(dir, iteration)
	if err != nil {
		return nil, err
	}
	r := &Reader{Meta: mf.Meta, Version: mf.FormatVersion, iterDir: name, path: iterDir,
		open: map[string]*safetensors.File{}, checked: map[string]bool{}}
	if mf.FormatVersion == layoutVersion1 {
		// Whole tensors, one file per group, checked whole.
		c, err := Load(dir, iteration)
		if err != nil {
			return nil, err
		}
		r.tensors = map[string]map[string]TensorRecord{}
		for g, ts := range c.Groups {
			file := g + ".safetensors"
			r.tensors[g] = map[string]TensorRecord{}
			for n, t := range ts {
				r.tensors[g][n] = TensorRecord{DType: t.DType.String(), Shape: t.Shape,
					Shards: []ShardRecord{{File: file, Key: n, Block: Whole(t.Shape)}}}
				r.checked[file+" "+n+" "] = true
			}
		}
		for _, f := range c.files {
			r.open[filepath.Base(f.Name())] = f
		}
		return r, nil
	}
	var sm shardedMeta
	if err := json.Unmarshal(raw, &sm); err != nil {
		return nil, fmt.Errorf("ckpt: %s/%s: %v", name, MetaFile, err)
	}
	if len(sm.Tensors) == 0 {
		return nil, fmt.Errorf("ckpt: %s/%s: format version %d lists no tensors", name, MetaFile, sm.FormatVersion)
	}
	r.Layout, r.tensors, r.files = sm.Layout, sm.Tensors, sm.Files
	for _, f := range slices.Sorted(maps.Keys(sm.Files)) {
		if strings.ContainsAny(f, `/\`) || f == MetaFile {
			return nil, fmt.Errorf("ckpt: %s/%s: invalid file name %q", name, MetaFile, f)
		}
		st, err := os.Stat(filepath.Join(iterDir, f))
		if err != nil {
			return nil, fmt.Errorf("ckpt: %s/%s: missing (listed in %s)", name, f, MetaFile)
		}
		if st.Size() != sm.Files[f].Bytes {
			return nil, fmt.Errorf("ckpt: %s/%s: %d bytes, %s records %d (truncated or overwritten)", name, f, st.Size(), MetaFile, sm.Files[f].Bytes)
		}
	}
	if err := checkCoverage(name, sm.Tensors); err != nil {
		return nil, err
	}
	if err := checkShardKeys(name, sm.Tensors); err != nil {
		return nil, err
	}
	for g, ts := range sm.Tensors {
		for n, tr := range ts {
			if tr.DType != safetensors.F32.String() {
				return nil, fmt.Errorf("ckpt: %s: tensor %s/%s has dtype %s: only F32 shards are read", name, g, n, tr.DType)
			}
			for _, s := range tr.Shards {
				fr, ok := sm.Files[s.File]
				if !ok {
					return nil, fmt.Errorf("ckpt: %s: tensor %s/%s has a shard in %s, which %s does not list", name, g, n, s.File, MetaFile)
				}
				// Readers allocate a tensor's elements before reading its
				// shards: each must fit in its (size-checked) file.
				if int64(s.Len()) > fr.Bytes/4 {
					return nil, fmt.Errorf("ckpt: %s: tensor %s/%s: shard %s:%s of %d F32 values does not fit in the file's %d bytes", name, g, n, s.File, s.Key, s.Len(), fr.Bytes)
				}
			}
		}
	}
	return r, nil
}

// Close unmaps every file the Reader opened.
func (r *Reader) Close() error {
	var errs []error
	for _, f := range r.open {
		errs = append(errs, f.Close())
	}
	r.open = nil
	return errors.Join(errs...)
}

// Groups returns the tensor groups, sorted.
func (r *Reader) Groups() []string { return slices.Sorted(maps.Keys(r.tensors)) }

// Tensors returns the records of a group's tensors (nil if there is no such
// group). The caller must not modify them.
func (r *Reader) Tensors(group string) map[string]TensorRecord { return r.tensors[group] }

// Has reports whether the checkpoint has the group.
func (r *Reader) Has(group string) bool { _, ok := r.tensors[group]; return ok }

// Expect compares a group with the tensors the caller expects (see
// Checkpoint.Expect): missing and unexpected tensors and shape or dtype
// mismatches, one error line each. unexpectedOK skips the unexpected ones
// (Megatron's assume_ok_unexpected strictness).
func (r *Reader) Expect(group string, want map[string]Spec, unexpectedOK bool) error {
	c := &Checkpoint{iterDir: r.iterDir, Groups: map[string]map[string]safetensors.Tensor{}}
	if ts, ok := r.tensors[group]; ok {
		g := map[string]safetensors.Tensor{}
		for n, tr := range ts {
			dt, _ := safetensors.ParseDType(tr.DType)
			if unexpectedOK {
				if _, ok := want[n]; !ok {
					continue
				}
			}
			g[n] = safetensors.Tensor{DType: dt, Shape: tr.Shape}
		}
		c.Groups[group] = g
	}
	return c.expect(group, want, r.Version >= shardedVersion)
}

// Read fills dst with block b of tensor group/name, viewed with the given
// global shape: the tensor's own, or, for a tensor stored whole in one
// shard (as format 1 stores optimizer buffers, flat), any shape with as many
// elements. dst must have b.Len() elements.
func (r *Reader) Read(group, name string, shape []int, b Block, dst []float32) error {
	where := fmt.Sprintf("ckpt: %s: tensor %s/%s", r.iterDir, group, name)
	tr, ok := r.tensors[group][name]
	if !ok {
		return fmt.Errorf("%s: not in the checkpoint", where)
	}
	shards := tr.Shards
	if !slices.Equal(shape, tr.Shape) {
		if len(shards) != 1 || numel(shape) != numel(tr.Shape) || shards[0].Len() != numel(tr.Shape) {
			return fmt.Errorf("%s has shape %v, read as %v", where, tr.Shape, shape)
		}
		s := shards[0]
		s.Block = Whole(shape)
		shards = []ShardRecord{s}
	}
	if err := b.check(shape); err != nil {
		return fmt.Errorf("%s: %v", where, err)
	}
	if len(dst) != b.Len() {
		return fmt.Errorf("%s: %d values to fill for a block of %d", where, len(dst), b.Len())
	}
	got := 0
	for _, s := range shards {
		if !overlaps(b, s.Block) {
			continue
		}
		sv, err := r.shardData(s)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		got += copyOverlap(b, dst, s.Block, sv)
	}
	r.copied += int64(got)
	if got != b.Len() {
		return fmt.Errorf("%s: the shards cover %d of the %d values of block %v+%v", where, got, b.Len(), b.Offset, b.Shape)
	}
	return nil
}

// overlaps reports whether the rectangles of a and b intersect.
func overlaps(a, b Block) bool {
	for i := range a.Offset {
		if a.Offset[i] >= b.Offset[i]+b.Shape[i] || b.Offset[i] >= a.Offset[i]+a.Shape[i] {
			return false
		}
	}
	return true
}

// shardData maps the shard's file (once) and returns its values, checking
// its CRC-32C on first use.
func (r *Reader) shardData(s ShardRecord) ([]float32, error) {
	f := r.open[s.File]
	if f == nil {
		var err error
		f, err = safetensors.Open(filepath.Join(r.path, s.File))
		if err != nil {
			return nil, err
		}
		r.open[s.File] = f
	}
	t, err := f.Tensor(s.Key)
	if err != nil {
		return nil, err
	}
	if t.DType != safetensors.F32 || t.NumElements() != s.Len() {
		return nil, fmt.Errorf("%s: %s is %v%v, %s records a shard of %d F32 values", s.File, s.Key, t.DType, t.Shape, MetaFile, s.Len())
	}
	id := s.File + " " + s.Key + " " + s.CRC32C
	if !r.checked[id] {
		if got := fmt.Sprintf("%08x", crc32.Checksum(t.Data, castagnoli)); got != s.CRC32C {
			return nil, fmt.Errorf("%s: %s: CRC-32C %s, %s records %s (corrupted)", s.File, s.Key, got, MetaFile, s.CRC32C)
		}
		r.checked[id] = true
	}
	if v, ok := t.Float32View(); ok {
		return v, nil
	}
	v := make([]float32, s.Len())
	return v, t.DecodeFloat32(v)
}

// ReadWhole returns all of tensor group/name.
func (r *Reader) ReadWhole(group, name string) ([]float32, []int, error) {
	tr, ok := r.tensors[group][name]
	if !ok {
		return nil, nil, fmt.Errorf("ckpt: %s: tensor %s/%s: not in the checkpoint", r.iterDir, group, name)
	}
	v := make([]float32, numel(tr.Shape))
	return v, tr.Shape, r.Read(group, name, tr.Shape, Whole(tr.Shape), v)
}

// loadSharded is Load for a sharded checkpoint: every tensor assembled
// whole, in memory.
func loadSharded(dir string, iteration int) (*Checkpoint, error) {
	r, err := Open(dir, iteration)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	c := &Checkpoint{Meta: r.Meta, Groups: map[string]map[string]safetensors.Tensor{}, iterDir: r.iterDir}
	for _, g := range r.Groups() {
		c.Groups[g] = map[string]safetensors.Tensor{}
		for n := range r.tensors[g] {
			v, shape, err := r.ReadWhole(g, n)
			if err != nil {
				return nil, err
			}
			c.Groups[g][n] = safetensors.Tensor{DType: safetensors.F32, Shape: shape, Data: safetensors.Float32Bytes(v)}
		}
	}
	return c, nil
}
