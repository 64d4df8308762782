package ckpt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// Prefixes of the temporary names Save and Prune create in the save
// directory; staleName matches them for cleanup.
const (
	tmpPrefix = ".tmp-"
	delPrefix = ".del-"
)

var staleName = regexp.MustCompile(`^\.(tmp|del)-(iter_[0-9]{7,}|` + regexp.QuoteMeta(TrackerFile) + `)-`)

// writeChunkBytes bounds one write, so cancellation and progress are seen
// at least this often.
const writeChunkBytes = 4 << 20

// saver holds the test seam of Save: event, when set, is called at every
// step (each chunk written, each fsync and rename) with a description.
type saver struct {
	event      func(string)
	chunkBytes int // 0 means writeChunkBytes
	// shardCRCs: the file's tensors carry their own CRC-32Cs (format 2),
	// so the file's is not computed, sparing a pass over the data.
	shardCRCs bool
	// yield: a background writer yields the processor before each chunk,
	// and, with maxRate > 0, sleeps as needed to write at most maxRate
	// bytes per second.
	yield   bool
	maxRate float64
}

func (s saver) at(format string, args ...any) {
	if s.event != nil {
		s.event(fmt.Sprintf(format, args...))
	}
}

// Save writes c as iteration of the save directory dir (created if needed)
// and then points the tracker file at it; see the package doc for the crash
// safety. It sets c.Meta.Iteration to iteration. An existing directory of
// the same iteration is replaced atomically where the OS allows (Linux
// renameat2 RENAME_EXCHANGE). Leftover temporary files of interrupted saves
// are removed first. If ctx is cancelled the partial save is removed and
// ctx.Err() returned; the previous checkpoint stays current.
func Save(ctx context.Context, dir string, iteration int, c *Checkpoint) error {
	return saver{}.save(ctx, dir, iteration, c)
}

func (s saver) save(ctx context.Context, dir string, iteration int, c *Checkpoint) (err error) {
	if err := validate(iteration, c); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := removeStale(dir); err != nil {
		return err
	}
	name := IterDirName(iteration)
	tmp, err := os.MkdirTemp(dir, tmpPrefix+name+"-")
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	c.Meta.Iteration = iteration
	mf := metaFile{Format: FormatName, FormatVersion: layoutVersion1, Meta: c.Meta, Files: map[string]fileRecord{}}
	for _, group := range slices.Sorted(maps.Keys(c.Groups)) {
		file := group + ".safetensors"
		rec, err := s.writeGroup(ctx, filepath.Join(tmp, file), name+"/"+file, c.Groups[group])
		if err != nil {
			return err
		}
		mf.Files[file] = rec
	}
	js, err := json.MarshalIndent(mf, "", "  ")
	if err != nil {
		return fmt.Errorf("ckpt: %s/%s: %w", name, MetaFile, err) // invalid RawMessage from the caller
	}
	if err := writeSynced(filepath.Join(tmp, MetaFile), append(js, '\n')); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.at("rename %s", name)
	if err := replaceDir(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	// From here the new directory is in place; a failure below leaves the
	// tracker at the previous iteration, which is still complete.
	s.at("tracker %s", name)
	tracker := filepath.Join(dir, TrackerFile)
	if err := writeSyncedAtomic(tracker, tmpPrefix+TrackerFile+"-", []byte(strconv.Itoa(iteration))); err != nil {
		return err
	}
	s.at("tracker renamed %s", name)
	return syncDir(dir)
}

// validate rejects what Save cannot write, before anything is created.
func validate(iteration int, c *Checkpoint) error {
	if c == nil {
		return errors.New("ckpt: Save: nil Checkpoint")
	}
	if iteration < 0 {
		return fmt.Errorf("ckpt: Save: iteration %d, want >= 0", iteration)
	}
	for _, raw := range []json.RawMessage{c.Meta.Args, c.Meta.RNGState, c.Meta.Scheduler} {
		if raw != nil && !json.Valid(raw) {
			return fmt.Errorf("ckpt: Save: Meta holds invalid JSON %.40q", raw)
		}
	}
	for group, tensors := range c.Groups {
		if !groupName.MatchString(group) {
			return fmt.Errorf("ckpt: Save: group name %q: want lower-case letters, digits and '_', starting with a letter", group)
		}
		for name, t := range tensors {
			if err := t.Validate(); err != nil {
				return fmt.Errorf("ckpt: Save: group %s: tensor %s: %v", group, name, err)
			}
		}
	}
	return nil
}

// writeGroup writes one safetensors file, fsyncs it, and returns its size
// and CRC-32C.
func (s saver) writeGroup(ctx context.Context, path, rel string, tensors map[string]safetensors.Tensor) (fileRecord, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fileRecord{}, fmt.Errorf("ckpt: %w", err)
	}
	defer f.Close()
	cw := &chunkWriter{ctx: ctx, w: f, s: s, rel: rel, chunk: s.chunkBytes}
	if !s.shardCRCs {
		cw.crc = crc32.New(castagnoli)
	}
	if cw.chunk <= 0 {
		cw.chunk = writeChunkBytes
	}
	bw := bufio.NewWriterSize(cw, 1<<20)
	if _, err := safetensors.Encode(bw, tensors, nil); err != nil {
		return fileRecord{}, fmt.Errorf("ckpt: write %s: %w", rel, err)
	}
	if err := bw.Flush(); err != nil {
		return fileRecord{}, fmt.Errorf("ckpt: write %s: %w", rel, err)
	}
	s.at("fsync %s", rel)
	if err := f.Sync(); err != nil {
		return fileRecord{}, fmt.Errorf("ckpt: fsync %s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fileRecord{}, fmt.Errorf("ckpt: close %s: %w", rel, err)
	}
	rec := fileRecord{Bytes: cw.n}
	if cw.crc != nil {
		rec.CRC32C = fmt.Sprintf("%08x", cw.crc.Sum32())
	}
	return rec, nil
}

// chunkWriter writes in chunks of at most writeChunkBytes, checking ctx and
// reporting progress before each, and checksums what it writes.
type chunkWriter struct {
	ctx   context.Context
	w     *os.File
	crc   hash.Hash32
	n     int64
	s     saver
	rel   string
	chunk int
	start time.Time // of a paced write
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	done := 0
	for len(p) > 0 {
		if err := c.ctx.Err(); err != nil {
			return done, err
		}
		k := min(len(p), c.chunk)
		if c.s.yield {
			runtime.Gosched()
			if c.s.maxRate > 0 {
				if c.start.IsZero() {
					c.start = time.Now()
				}
				if ahead := time.Duration(float64(c.n)/c.s.maxRate*1e9) - time.Since(c.start); ahead > 0 {
					time.Sleep(ahead)
				}
			}
		}
		c.s.at("write %s @%d", c.rel, c.n)
		m, err := c.w.Write(p[:k])
		if c.crc != nil {
			c.crc.Write(p[:m])
		}
		c.n += int64(m)
		done += m
		if err != nil {
			return done, err
		}
		p = p[k:]
	}
	return done, nil
}

// writeSynced creates path with data and fsyncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	return finishFile(f, data)
}

// finishFile writes data to f, fsyncs and closes it.
func finishFile(f *os.File, data []byte) error {
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("ckpt: write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("ckpt: fsync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ckpt: close %s: %w", f.Name(), err)
	}
	return nil
}

// writeSyncedAtomic replaces path with data via a synced temporary file
// named with tmpPattern in the same directory.
func writeSyncedAtomic(path, tmpPattern string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), tmpPattern)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := finishFile(f, data); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("ckpt: %w", err)
	}
	return nil
}

// syncDir fsyncs a directory so that renames and creations in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("ckpt: fsync %s: %w", dir, err)
	}
	return nil
}

// replaceDir renames the complete directory tmp to final. If final exists
// it is swapped out atomically where supported, else moved aside first (a
// crash between the two renames then leaves no final directory); the old
// contents are then deleted.
func replaceDir(tmp, final string) error {
	err := os.Rename(tmp, final)
	if err == nil {
		return nil
	}
	if _, statErr := os.Stat(final); statErr != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if exchangeDirs(tmp, final) == nil {
		// tmp now holds the old checkpoint under a temporary name.
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("ckpt: remove replaced %w", err)
		}
		return nil
	}
	aside := filepath.Join(filepath.Dir(final), delPrefix+filepath.Base(final)+"-"+filepath.Base(tmp))
	if err := os.Rename(final, aside); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if err := os.RemoveAll(aside); err != nil {
		return fmt.Errorf("ckpt: remove replaced %w", err)
	}
	return nil
}

// removeStale deletes the temporary files and directories that interrupted
// saves and prunes left in dir.
func removeStale(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	for _, e := range entries {
		if staleName.MatchString(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("ckpt: remove stale %w", err)
			}
		}
	}
	return nil
}

// Prune deletes the oldest iteration directories of dir so that at most
// keep remain, never deleting the one the tracker names. Each directory is
// first renamed to a temporary name, so a crash mid-delete never leaves a
// partial iter_* directory behind. keep must be at least 1.
func Prune(dir string, keep int) error { return saver{}.prune(dir, keep) }

func (s saver) prune(dir string, keep int) error {
	if keep < 1 {
		return fmt.Errorf("ckpt: Prune: keep = %d, want >= 1", keep)
	}
	its, err := List(dir)
	if err != nil {
		return err
	}
	latest, err := Latest(dir)
	if err != nil && !errors.Is(err, ErrNoCheckpoint) {
		return err
	}
	hasLatest := err == nil
	var victims []int
	for i := len(its) - 1; i >= 0; i-- {
		if hasLatest && its[i] == latest {
			continue // always kept, counted below
		}
		victims = append(victims, its[i])
	}
	// victims is newest first; keep the newest (keep-1 if latest is kept).
	room := keep
	if hasLatest && slices.Contains(its, latest) {
		room--
	}
	if room >= len(victims) {
		return nil
	}
	for _, it := range victims[room:] {
		name := IterDirName(it)
		aside := filepath.Join(dir, delPrefix+name+"-prune")
		if err := os.RemoveAll(aside); err != nil { // left by a crashed Prune
			return fmt.Errorf("ckpt: prune: %w", err)
		}
		s.at("prune rename %s", name)
		if err := os.Rename(filepath.Join(dir, name), aside); err != nil {
			return fmt.Errorf("ckpt: prune: %w", err)
		}
		if err := syncDir(dir); err != nil {
			return err
		}
		s.at("prune remove %s", name)
		if err := os.RemoveAll(aside); err != nil {
			return fmt.Errorf("ckpt: prune: %w", err)
		}
	}
	return nil
}
