package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// Names and versions of the on-disk format.
const (
	// FormatVersion is the newest layout Load and Open read: 2, the sharded
	// layout WriteShards and FinishSharded write (Save writes version 1,
	// whole tensors in one file per group).
	FormatVersion = shardedVersion
	// FormatName is the "format" value of checkpoint.json, its magic.
	FormatName = "gotron-checkpoint"
	// TrackerFile names the latest iteration, as in Megatron-LM.
	TrackerFile = "latest_checkpointed_iteration.txt"
	// MetaFile is the metadata file of an iteration directory.
	MetaFile = "checkpoint.json"
	// GroupModel and GroupOptimizer are the conventional group names.
	GroupModel     = "model"
	GroupOptimizer = "optimizer"
)

// ErrNoCheckpoint is returned (wrapped) by Latest and Load when the save
// directory has no tracker file, that is no complete checkpoint yet.
var ErrNoCheckpoint = errors.New("no checkpoint")

var (
	groupName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	iterName  = regexp.MustCompile(`^iter_([0-9]{7,})$`)
)

// Meta is the training state saved beside the tensors, in checkpoint.json.
// The JSON names follow Megatron's state dict and args.
type Meta struct {
	// Iteration is the training iteration; Save sets it to its argument.
	Iteration int `json:"iteration"`
	// ConsumedTrainSamples, SkippedTrainSamples and ConsumedValidSamples
	// let the data sampler resume exactly (Megatron keeps them in args).
	ConsumedTrainSamples int64 `json:"consumed_train_samples"`
	SkippedTrainSamples  int64 `json:"skipped_train_samples"`
	ConsumedValidSamples int64 `json:"consumed_valid_samples"`
	// FloatingPointOperationsSoFar is num_floating_point_operations_so_far.
	FloatingPointOperationsSoFar float64 `json:"num_floating_point_operations_so_far"`
	// Args, RNGState and Scheduler are the caller's JSON, stored verbatim
	// (nil is omitted): the training arguments, the RNG state and the
	// LR/WD scheduler state (Megatron's opt_param_scheduler).
	Args      json.RawMessage `json:"args,omitempty"`
	RNGState  json.RawMessage `json:"rng_state,omitempty"`
	Scheduler json.RawMessage `json:"opt_param_scheduler,omitempty"`
}

// fileRecord is checkpoint.json's entry for one tensor file.
type fileRecord struct {
	Bytes  int64  `json:"bytes"`
	CRC32C string `json:"crc32c,omitempty"` // 8 lower-case hex digits; format 2 checksums each shard instead
}

// metaFile is the whole of checkpoint.json.
type metaFile struct {
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`
	Meta
	Files map[string]fileRecord `json:"files"`
}

// Checkpoint is one saved iteration: tensor groups plus metadata.
//
// Each group is written to <group>.safetensors; group names are lower-case
// letters, digits and '_', starting with a letter. A Checkpoint returned by
// Load aliases read-only memory mappings of its files: its tensors' Data
// must not be modified and are valid until Close.
type Checkpoint struct {
	Meta   Meta
	Groups map[string]map[string]safetensors.Tensor

	iterDir string              // e.g. "iter_0000100", for errors; set by Load
	files   []*safetensors.File // to close
}

// Close releases the mappings of a loaded checkpoint; it is a no-op for one
// built by the caller.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files = nil
	return errors.Join(errs...)
}

// castagnoli is the CRC-32C table (hardware-accelerated on amd64/arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// IterDirName returns Megatron's directory name for an iteration,
// "iter_0000100".
func IterDirName(iteration int) string { return fmt.Sprintf("iter_%07d", iteration) }

// Latest returns the iteration named by dir's tracker file. Without one it
// returns an error wrapping ErrNoCheckpoint. Megatron's "release" tracker
// is rejected.
func Latest(dir string) (int, error) {
	path := filepath.Join(dir, TrackerFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("ckpt: %s: no %s: %w", dir, TrackerFile, ErrNoCheckpoint)
	}
	if err != nil {
		return 0, fmt.Errorf("ckpt: %w", err)
	}
	s := strings.TrimSpace(string(raw))
	if s == "release" {
		return 0, fmt.Errorf("ckpt: %s: release checkpoints are not supported, want an iteration number", path)
	}
	it, err := strconv.Atoi(s)
	if err != nil || it < 0 {
		return 0, fmt.Errorf("ckpt: %s: %q is not an iteration number", path, s)
	}
	return it, nil
}

// List returns the iterations that have a directory in dir, ascending.
// Temporary directories of unfinished saves are not listed.
func List(dir string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	var its []int
	for _, e := range entries {
		if m := iterName.FindStringSubmatch(e.Name()); m != nil && e.IsDir() {
			it, err := strconv.Atoi(m[1])
			if err == nil {
				its = append(its, it)
			}
		}
	}
	slices.Sort(its)
	return its, nil
}

// Load opens the checkpoint of the given iteration in dir, or of the
// latest one (see Latest) when iteration is negative. It checks the format
// version, that every file checkpoint.json lists exists with the recorded
// size and CRC-32C and has a valid header. The result must be Closed.
func Load(dir string, iteration int) (*Checkpoint, error) {
	iteration, name, iterDir, mf, _, err := locate(dir, iteration)
	if err != nil {
		return nil, err
	}
	if mf.FormatVersion == shardedVersion {
		return loadSharded(dir, iteration)
	}
	c := &Checkpoint{Meta: mf.Meta, Groups: map[string]map[string]safetensors.Tensor{}, iterDir: name}
	for _, file := range slices.Sorted(maps.Keys(mf.Files)) {
		group, ok := strings.CutSuffix(file, ".safetensors")
		if !ok || !groupName.MatchString(group) {
			c.Close()
			return nil, fmt.Errorf("ckpt: %s/%s: %q is not a tensor group file", name, MetaFile, file)
		}
		f, err := openVerified(filepath.Join(iterDir, file), name+"/"+file, mf.Files[file])
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, f)
		c.Groups[group] = f.Tensors()
	}
	return c, nil
}

// readMeta reads and checks checkpoint.json; rel is the iteration directory
// name used in errors.
func readMeta(path, rel string, iteration int) (*metaFile, []byte, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("ckpt: %s: no %s (not a checkpoint directory, or missing): %w", rel, MetaFile, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: %w", err)
	}
	var mf metaFile
	if err := json.Unmarshal(raw, &mf); err != nil {
		return nil, nil, fmt.Errorf("ckpt: %s/%s: %v", rel, MetaFile, err)
	}
	switch {
	case mf.Format != FormatName:
		return nil, nil, fmt.Errorf("ckpt: %s/%s: format %q, want %q", rel, MetaFile, mf.Format, FormatName)
	case mf.FormatVersion > FormatVersion:
		return nil, nil, fmt.Errorf("ckpt: %s/%s: format version %d is newer than this gotron reads (%d): upgrade gotron",
			rel, MetaFile, mf.FormatVersion, FormatVersion)
	case mf.FormatVersion < 1:
		return nil, nil, fmt.Errorf("ckpt: %s/%s: invalid format version %d", rel, MetaFile, mf.FormatVersion)
	case mf.Iteration != iteration:
		return nil, nil, fmt.Errorf("ckpt: %s/%s: records iteration %d", rel, MetaFile, mf.Iteration)
	}
	return &mf, raw, nil
}

// locate resolves iteration (the latest when negative) in dir and reads its
// checkpoint.json: the iteration, its directory's name and path, the
// checked common fields and the raw file (for format 2's own fields).
func locate(dir string, iteration int) (it int, name, iterDir string, mf *metaFile, raw []byte, err error) {
	if iteration < 0 {
		if iteration, err = Latest(dir); err != nil {
			return 0, "", "", nil, nil, err
		}
	}
	name = IterDirName(iteration)
	iterDir = filepath.Join(dir, name)
	mf, raw, err = readMeta(filepath.Join(iterDir, MetaFile), name, iteration)
	return iteration, name, iterDir, mf, raw, err
}

// openVerified maps a tensor file and checks its size and checksum.
func openVerified(path, rel string, rec fileRecord) (*safetensors.File, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ckpt: %s: missing (listed in %s)", rel, MetaFile)
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	if st.Size() != rec.Bytes {
		return nil, fmt.Errorf("ckpt: %s: %d bytes, %s records %d (truncated or overwritten)", rel, st.Size(), MetaFile, rec.Bytes)
	}
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	defer fd.Close()
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %s: %w", rel, err)
	}
	h := crc32.New(castagnoli)
	if _, err := fd.WriteTo(h); err != nil {
		f.Close()
		return nil, fmt.Errorf("ckpt: %s: %w", rel, err)
	}
	if got := fmt.Sprintf("%08x", h.Sum32()); got != rec.CRC32C {
		f.Close()
		return nil, fmt.Errorf("ckpt: %s: CRC-32C %s, %s records %s (corrupted)", rel, got, MetaFile, rec.CRC32C)
	}
	return f, nil
}

// Spec is the dtype and shape a caller expects of a tensor.
type Spec struct {
	DType safetensors.DType
	Shape []int
}

// Expect checks group against want, the tensors the caller's model (or
// optimizer) expects, and returns one error line per mismatch, sorted by
// tensor name, e.g.
//
//	ckpt: iter_0000100/model.safetensors: tensor decoder.layers.0.mlp.fc1.weight has shape [1536 384], model expects [2048 384]
//
// Missing tensors, unexpected ones, dtype and shape mismatches are all
// reported; nil means every tensor matches.
func (c *Checkpoint) Expect(group string, want map[string]Spec) error {
	return c.expect(group, want, false)
}

// expect is Expect; sharded names tensors as "group/name" of the iteration
// directory rather than of a group's file.
func (c *Checkpoint) expect(group string, want map[string]Spec, sharded bool) error {
	where := c.iterDir
	if where == "" {
		where = "(unsaved)"
	}
	got, ok := c.Groups[group]
	if !ok {
		return fmt.Errorf("ckpt: %s: no tensor group %q (have %v)", where, group, slices.Sorted(maps.Keys(c.Groups)))
	}
	prefix := fmt.Sprintf("ckpt: %s/%s.safetensors: tensor", where, group)
	tensorName := func(name string) string { return name }
	if sharded {
		prefix = fmt.Sprintf("ckpt: %s: tensor", where)
		tensorName = func(name string) string { return group + "/" + name }
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w := want[name]
		g, ok := got[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s %s missing, %s expects %v%v", prefix, tensorName(name), group, w.DType, w.Shape))
		case !slices.Equal(g.Shape, w.Shape) && g.DType != w.DType:
			errs = append(errs, fmt.Errorf("%s %s is %v%v, %s expects %v%v", prefix, tensorName(name), g.DType, g.Shape, group, w.DType, w.Shape))
		case !slices.Equal(g.Shape, w.Shape):
			errs = append(errs, fmt.Errorf("%s %s has shape %v, %s expects %v", prefix, tensorName(name), g.Shape, group, w.Shape))
		case g.DType != w.DType:
			errs = append(errs, fmt.Errorf("%s %s has dtype %v, %s expects %v", prefix, tensorName(name), g.DType, group, w.DType))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[name]; !ok {
			errs = append(errs, fmt.Errorf("%s %s (%v%v) is not expected by %s", prefix, tensorName(name), got[name].DType, got[name].Shape, group))
		}
	}
	return errors.Join(errs...)
}
