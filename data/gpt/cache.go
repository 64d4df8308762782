package gpt

import (
	"fmt"
	"os"
	"path/filepath"
)

// cacheSet names the files of one cached index build:
// <dir>/<md5>-<class>-<split>-description.txt and -<name>.npy, Megatron's
// names (gpt_dataset.py's _build_document_sample_shuffle_indices and
// blended_dataset.py), so gotron and Megatron runs with the same
// description share caches.
type cacheSet struct {
	description string
	arrays      []string
}

func cacheFiles(dir, hash, class string, split Split, names ...string) *cacheSet {
	if dir == "" {
		return nil
	}
	base := filepath.Join(dir, fmt.Sprintf("%s-%s-%s-", hash, class, split))
	c := &cacheSet{description: base + "description.txt"}
	for _, n := range names {
		c.arrays = append(c.arrays, base+n+".npy")
	}
	return c
}

// loadCache returns the cached arrays when every file exists and the stored
// description equals desc byte for byte. Any problem is a miss: the caller
// rebuilds and overwrites.
func loadCache(c *cacheSet, desc string) ([]*npyArray, bool) {
	if c == nil {
		return nil, false
	}
	stored, err := os.ReadFile(c.description)
	if err != nil || string(stored) != desc {
		return nil, false
	}
	out := make([]*npyArray, len(c.arrays))
	for i, p := range c.arrays {
		if out[i], err = readNpy(p); err != nil {
			return nil, false
		}
	}
	return out, true
}

// saveCache writes the arrays, then the description, each atomically by
// rename: a description on disk means the arrays next to it are complete.
func saveCache(c *cacheSet, desc string, arrays []npyArray) error {
	if err := os.MkdirAll(filepath.Dir(c.description), 0o755); err != nil {
		return fmt.Errorf("gpt: --data-cache-path: %w", err)
	}
	for i, a := range arrays {
		if err := writeNpy(c.arrays[i], a.descr, a.shape, a.data); err != nil {
			return err
		}
	}
	return writeAtomic(c.description, []byte(desc))
}
