package preprocess

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/data/indexed"
)

// outputs holds one builder per partition and key. Every builder writes
// under a temporary prefix (the output name plus tmpSuffix); only when all
// of them are complete does finish rename them to the output names, so a
// failed run (a bad line, a full disk) leaves an existing dataset at
// --output-prefix as it was.
type outputs struct {
	cfg       Config
	level     string
	dtype     indexed.DType
	tmpSuffix string
	builders  [][]*indexed.Builder // [partition][key]
	prefixes  [][]string           // temporary prefixes, [partition][key]
}

func newOutputs(cfg Config) (*outputs, error) {
	o := &outputs{cfg: cfg, level: "document", dtype: indexed.OptimalDType(cfg.Tokenizer.VocabSize()),
		tmpSuffix: fmt.Sprintf(".tmp-%s-%d", thisHost(), os.Getpid())}
	if cfg.SplitSentences {
		o.level = "sentence"
	}
	for p := range cfg.Partitions {
		base := cfg.OutputPrefix
		if cfg.Partitions > 1 {
			base = fmt.Sprintf("%s_%d", cfg.OutputPrefix, p) // Megatron's partition output prefix
		}
		var bs []*indexed.Builder
		var ps []string
		for _, key := range cfg.JSONKeys {
			prefix := fmt.Sprintf("%s_%s_%s", base, key, o.level) + o.tmpSuffix
			b, err := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: o.dtype})
			if err != nil {
				o.builders, o.prefixes = append(o.builders, bs), append(o.prefixes, ps)
				o.abort()
				return nil, fmt.Errorf("preprocess: --output-prefix: %w", err)
			}
			bs, ps = append(bs, b), append(ps, prefix)
		}
		o.builders, o.prefixes = append(o.builders, bs), append(o.prefixes, ps)
	}
	return o, nil
}

// finalName is the output prefix of key k.
func (o *outputs) finalName(key string) string {
	return fmt.Sprintf("%s_%s_%s", o.cfg.OutputPrefix, key, o.level)
}

// finish finalizes every builder, with partitions merges them in partition
// order (add_index), and renames the results to the output names. On error
// nothing at the output names has changed and the temporary files are gone.
func (o *outputs) finish() ([]string, error) {
	done, err := o.complete()
	if err != nil {
		o.abort()
		for _, tmp := range done {
			removeDataset(tmp)
		}
		return nil, err
	}
	final := make([]string, len(done))
	for k, key := range o.cfg.JSONKeys {
		final[k] = o.finalName(key)
		if err := renameDataset(done[k], final[k]); err != nil {
			return nil, fmt.Errorf("preprocess: --output-prefix: %w", err)
		}
	}
	return final, nil
}

// complete finalizes the builders and returns the temporary prefix of each
// key's finished dataset.
func (o *outputs) complete() ([]string, error) {
	for _, bs := range o.builders {
		for _, b := range bs {
			if err := b.Finalize(); err != nil {
				return nil, err
			}
		}
	}
	if o.cfg.Partitions == 1 {
		return o.prefixes[0], nil
	}
	var merged []string
	for k, key := range o.cfg.JSONKeys {
		prefix := o.finalName(key) + o.tmpSuffix
		m, err := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: o.dtype})
		if err != nil {
			return merged, fmt.Errorf("preprocess: --output-prefix: %w", err)
		}
		for p := range o.builders {
			if err := m.AddIndex(o.prefixes[p][k]); err != nil {
				m.Abort()
				return merged, err
			}
		}
		if err := m.Finalize(); err != nil {
			return merged, err
		}
		merged = append(merged, prefix)
		for p := range o.builders {
			removeDataset(o.prefixes[p][k])
		}
	}
	return merged, nil
}

// abort stops every builder and removes everything written so far; the
// output names are not touched.
func (o *outputs) abort() {
	for p, bs := range o.builders {
		for k, b := range bs {
			b.Abort()
			if p < len(o.prefixes) && k < len(o.prefixes[p]) {
				removeDataset(o.prefixes[p][k])
			}
		}
	}
}

// removeDataset deletes a .bin/.idx pair, best effort: it only cleans up
// temporary files.
func removeDataset(prefix string) {
	_ = os.Remove(prefix + ".bin")
	_ = os.Remove(prefix + ".idx")
}

// renameDataset moves a finished .bin/.idx pair to another prefix (.bin
// first, as indexed.Builder.Finalize).
func renameDataset(from, to string) error {
	for _, ext := range []string{".bin", ".idx"} {
		if err := os.Rename(from+ext, to+ext); err != nil {
			return err
		}
	}
	return nil
}

// progress prints Megatron-style progress: docs/s and MB/s.
type progress struct {
	cfg       Config
	total     int64 // input bytes, 0 if unknown
	start     time.Time
	lastDocs  int64
	lastPrint time.Time
}

func newProgress(cfg Config, totalBytes int64) *progress {
	p := &progress{cfg: cfg, total: totalBytes}
	if cfg.Progress != nil {
		p.start = cfg.Now()
	}
	return p
}

// update reports docs and bytes processed; final forces a last line.
func (p *progress) update(docs, bytes int64, final bool) {
	w := p.cfg.Progress
	if w == nil || docs == p.lastDocs && !final {
		return
	}
	now := p.cfg.Now()
	if p.cfg.ProgressTerminal {
		// Redraw at most 10 times a second.
		if !final && !p.lastPrint.IsZero() && now.Sub(p.lastPrint) < 100*time.Millisecond {
			p.lastDocs = docs
			return
		}
	} else if !final && docs/int64(p.cfg.LogInterval) == p.lastDocs/int64(p.cfg.LogInterval) {
		p.lastDocs = docs
		return
	}
	p.lastDocs, p.lastPrint = docs, now
	secs := now.Sub(p.start).Seconds()
	if secs <= 0 {
		secs = 1e-9
	}
	line := fmt.Sprintf("Processed %d documents (%.1f docs/s, %.2f MB/s).", docs, float64(docs)/secs, float64(bytes)/secs/1024/1024)
	if p.cfg.ProgressTerminal {
		fmt.Fprintf(w, "\r%s%s    ", bar(bytes, p.total), line)
		if final {
			fmt.Fprintln(w)
		}
		return
	}
	fmt.Fprintln(w, line)
}

// bar draws a 30-cell progress bar with a percentage, or nothing when the
// total is unknown.
func bar(done, total int64) string {
	if total <= 0 {
		return ""
	}
	frac := min(float64(done)/float64(total), 1)
	full := int(frac * 30)
	return fmt.Sprintf("[%s%s] %3.0f%% ", strings.Repeat("#", full), strings.Repeat("-", 30-full), 100*frac)
}

// staleTemp matches the temporary files of a run: the output name, then
// ".tmp-HOST-PID" (".tmp-PID" before hosts were named), then ".bin" or
// ".idx", with indexed.Builder's own ".tmp" while a builder is open.
var staleTemp = regexp.MustCompile(`^.+\.tmp-(?:(.+)-)?([0-9]+)\.(?:bin|idx)(?:\.tmp)?$`)

// removeStaleTemps removes the temporary files beside outputPrefix that a
// run on this host left when it was killed (SIGKILL, a crash, power loss:
// nothing ran to remove them): those whose process is gone. Files of a
// live process, ours included, and of other hosts sharing the directory
// are left alone. It returns the paths removed.
func removeStaleTemps(outputPrefix string) ([]string, error) {
	dir, base := filepath.Dir(outputPrefix), filepath.Base(outputPrefix)+"_"
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // NewBuilder reports the missing directory
		}
		return nil, fmt.Errorf("preprocess: --output-prefix: %w", err)
	}
	host, self := thisHost(), os.Getpid()
	var removed []string
	for _, e := range ents {
		name := e.Name()
		m := staleTemp.FindStringSubmatch(name)
		if m == nil || !strings.HasPrefix(name, base) || !e.Type().IsRegular() {
			continue
		}
		pid, err := strconv.Atoi(m[2])
		if err != nil || (m[1] != "" && m[1] != host) || pid == self || processAlive(pid) {
			continue
		}
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("preprocess: remove a temporary file of an interrupted run: %w", err)
		}
		removed = append(removed, path)
	}
	return removed, nil
}

// thisHost is the host name as it appears in temporary file names: letters,
// digits, '.' and '-' kept, anything else '_'.
func thisHost() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, h)
}
