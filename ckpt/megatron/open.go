package megatron

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/torchpt"
)

// TrackerFile names the iteration to load, as in Megatron.
const TrackerFile = "latest_checkpointed_iteration.txt"

// FileName is the name of each rank's state dict.
const FileName = "model_optim_rng.pt"

// Checkpoint is an opened Megatron checkpoint in the legacy torch format:
// one torch.save file per (tensor, pipeline) rank, their structure read,
// their tensors read on demand until Close.
type Checkpoint struct {
	// Dir is the iteration directory (<load>/iter_0000100 or <load>/release).
	Dir string
	// Iteration is the state dict's iteration (0 for a release checkpoint).
	Iteration int64
	Release   bool
	// TP, PP and VP are the tensor-, pipeline- and virtual-pipeline sizes
	// the checkpoint was saved with (VP 1 without virtual stages).
	TP, PP, VP int
	// Version is the state dict's checkpoint_version (3.0 for Megatron core).
	Version float64
	// Optimizer reports whether the files hold optimizer state (which the
	// import does not convert).
	Optimizer bool

	// EP is the expert-parallel size: each (tp, pp) rank's experts are
	// spread over EP files (mp_rank_TT[_PPP]_EEE), the rest replicated.
	EP int

	args  argset
	files [][]*torchpt.File // [tp][pp]: expert-parallel rank 0's
	// experts holds every expert-parallel rank's file when EP > 1:
	// [tp][pp][ep] (ep 0 is files[tp][pp]).
	experts [][][]*torchpt.File
}

// Close closes every file.
func (c *Checkpoint) Close() error {
	var first error
	for _, row := range c.files {
		for _, f := range row {
			if f != nil {
				if err := f.Close(); err != nil && first == nil {
					first = err
				}
			}
		}
	}
	for _, row := range c.experts {
		for _, fs := range row {
			for _, f := range fs[min(1, len(fs)):] { // fs[0] is in c.files
				if f != nil {
					if err := f.Close(); err != nil && first == nil {
						first = err
					}
				}
			}
		}
	}
	return first
}

var rankDirRE = regexp.MustCompile(`^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$`)

// IsMegatronDir reports whether dir looks like a Megatron legacy-format
// checkpoint: a tracker file beside iter_* directories, or an iteration
// directory holding mp_rank_* directories.
func IsMegatronDir(dir string) bool {
	iter, err := findIterDir(dir)
	if err != nil {
		return false
	}
	ents, err := os.ReadDir(iter)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if rankDirRE.MatchString(e.Name()) {
			return true
		}
	}
	return false
}

// findIterDir resolves the load directory to the iteration directory to
// read: the tracker's iteration (or release) under dir, or dir itself when
// it holds mp_rank_* directories.
func findIterDir(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, TrackerFile))
	switch {
	case err == nil:
		s := strings.TrimSpace(string(b))
		if s == "release" {
			return filepath.Join(dir, "release"), nil
		}
		it, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil || it < 0 {
			return "", fmt.Errorf("%s holds %q, want an iteration number or release", filepath.Join(dir, TrackerFile), s)
		}
		return filepath.Join(dir, fmt.Sprintf("iter_%07d", it)), nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var iters []string
	for _, e := range ents {
		if rankDirRE.MatchString(e.Name()) {
			return dir, nil // an iteration directory itself
		}
		if strings.HasPrefix(e.Name(), "iter_") {
			iters = append(iters, e.Name())
		}
	}
	if len(iters) > 0 {
		return "", fmt.Errorf("%s has no %s (iterations %s): pass one iteration directory as --load", dir, TrackerFile, strings.Join(iters, ", "))
	}
	return "", fmt.Errorf("%s is not a Megatron checkpoint: no %s and no mp_rank_* directories", dir, TrackerFile)
}

// Open finds the iteration to load under dir (as Megatron does, from
// latest_checkpointed_iteration.txt; or dir is an iteration directory),
// opens mp_rank_00[_000]/model_optim_rng.pt to learn the parallel layout
// from its args, then every other rank's file, and checks that they agree.
// Errors name the file or directory at fault.
func Open(dir string) (*Checkpoint, error) {
	iterDir, err := findIterDir(dir)
	if err != nil {
		return nil, fmt.Errorf("megatron: %w", err)
	}
	c, err := open(iterDir)
	if err != nil {
		return nil, fmt.Errorf("megatron: %w", err)
	}
	return c, nil
}

func open(iterDir string) (*Checkpoint, error) {
	ents, err := os.ReadDir(iterDir)
	if err != nil {
		return nil, err
	}
	ranks := map[string]bool{}
	var names []string
	for _, e := range ents {
		n := e.Name()
		switch {
		case rankDirRE.MatchString(n):
			ranks[n] = true
			names = append(names, n)
		case n == ".metadata" || n == "metadata.json" || n == "common.pt" || strings.HasSuffix(n, ".distcp"):
			return nil, fmt.Errorf("%s is a distributed checkpoint (--ckpt-format torch_dist, %s): only the legacy torch format is read; convert it with Megatron itself (--ckpt-convert-format torch --ckpt-convert-save DIR)", iterDir, n)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s holds no mp_rank_* directories", iterDir)
	}
	sort.Strings(names)
	first := names[0]
	if first != "mp_rank_00" && first != "mp_rank_00_000" && first != "mp_rank_00_000_000" {
		return nil, fmt.Errorf("%s has no mp_rank_00 or mp_rank_00_000 (first rank directory is %s)", iterDir, first)
	}
	f0, err := torchpt.Open(filepath.Join(iterDir, first, FileName))
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: iterDir, Release: filepath.Base(iterDir) == "release"}
	ok := false
	defer func() {
		if !ok {
			f0.Close()
			c.Close()
		}
	}()
	sd, err := stateDict(f0)
	if err != nil {
		return nil, err
	}
	if c.args, err = readArgs(f0, sd); err != nil {
		return nil, err
	}
	tp, err := c.args.intOr("tensor_model_parallel_size", 1)
	if err != nil {
		return nil, err
	}
	pp, err := c.args.intOr("pipeline_model_parallel_size", 1)
	if err != nil {
		return nil, err
	}
	vp, err := c.args.intOr("virtual_pipeline_model_parallel_size", 1)
	if err != nil {
		return nil, err
	}
	if tp < 1 || pp < 1 || vp < 1 || tp*pp > 1<<16 {
		return nil, fmt.Errorf("%s: args.tensor_model_parallel_size=%d, pipeline_model_parallel_size=%d, virtual_pipeline_model_parallel_size=%d: want sizes >= 1", f0.Path, tp, pp, vp)
	}
	ep, err := c.args.intOr("expert_model_parallel_size", 1)
	if err != nil {
		return nil, err
	}
	if ep < 1 || tp*pp*ep > 1<<16 {
		return nil, fmt.Errorf("%s: args.expert_model_parallel_size=%d: want a size >= 1", f0.Path, ep)
	}
	c.TP, c.PP, c.VP, c.EP = int(tp), int(pp), int(vp), int(ep)
	if c.Iteration, c.Version, err = header(f0, sd); err != nil {
		return nil, err
	}
	layout := fmt.Sprintf("args: tensor_model_parallel_size=%d, pipeline_model_parallel_size=%d", c.TP, c.PP)
	if c.EP > 1 {
		layout += fmt.Sprintf(", expert_model_parallel_size=%d", c.EP)
		c.experts = make([][][]*torchpt.File, c.TP)
	}
	want := map[string]bool{}
	c.files = make([][]*torchpt.File, c.TP)
	for t := range c.TP {
		c.files[t] = make([]*torchpt.File, c.PP)
		if c.EP > 1 {
			c.experts[t] = make([][]*torchpt.File, c.PP)
		}
		for p := range c.PP {
			for e := range c.EP {
				name := rankDir(t, p, c.PP)
				if c.EP > 1 {
					name += fmt.Sprintf("_%03d", e) // Megatron's get_checkpoint_name
				} else if !ranks[name] && c.PP == 1 && ranks[rankDir(t, 0, 2)] {
					name = rankDir(t, 0, 2) // mp_rank_TT_000 without pipeline parallelism
				}
				want[name] = true
				path := filepath.Join(iterDir, name, FileName)
				if !ranks[name] {
					return nil, fmt.Errorf("%s is missing (%s, so %d rank files are expected)", path, layout, c.TP*c.PP*c.EP)
				}
				f := f0
				if name != first {
					if f, err = torchpt.Open(path); err != nil {
						return nil, err
					}
				}
				if e == 0 {
					c.files[t][p] = f
				}
				if c.EP > 1 {
					c.experts[t][p] = append(c.experts[t][p], f)
				}
				if name != first {
					if err := c.checkSame(f); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	for _, n := range names {
		if !want[n] {
			return nil, fmt.Errorf("%s: unexpected rank directory %s (%s)", iterDir, n, layout)
		}
	}
	for _, row := range c.files {
		for _, f := range row {
			sd, _ := stateDict(f)
			if v, ok := sd.Get("optimizer"); ok && v != nil {
				c.Optimizer = true
			}
		}
	}
	ok = true
	return c, nil
}

func rankDir(t, p, pp int) string {
	if pp == 1 {
		return fmt.Sprintf("mp_rank_%02d", t)
	}
	return fmt.Sprintf("mp_rank_%02d_%03d", t, p)
}

// stateDict is the file's top-level dict.
func stateDict(f *torchpt.File) (*torchpt.Dict, error) {
	sd, ok := f.Root.(*torchpt.Dict)
	if !ok {
		return nil, fmt.Errorf("%s holds a %T, not a Megatron state dict", f.Path, f.Root)
	}
	return sd, nil
}

// header reads iteration and checkpoint_version.
func header(f *torchpt.File, sd *torchpt.Dict) (iteration int64, version float64, err error) {
	if v, ok := sd.Get("iteration"); ok {
		it, ok := v.(int64)
		if !ok || it < 0 {
			return 0, 0, fmt.Errorf("%s: iteration %v is not an iteration number", f.Path, v)
		}
		iteration = it
	}
	v, ok := sd.Get("checkpoint_version")
	if !ok {
		return 0, 0, fmt.Errorf("%s has no checkpoint_version: a checkpoint of Megatron before 2020 (QKV in an older layout) is not supported", f.Path)
	}
	switch x := v.(type) {
	case float64:
		version = x
	case int64:
		version = float64(x)
	default:
		return 0, 0, fmt.Errorf("%s: checkpoint_version is a %T", f.Path, v)
	}
	if version < 3 {
		return 0, 0, fmt.Errorf("%s: checkpoint_version %g: only 3.0 (Megatron core's fused QKV layout) is supported", f.Path, version)
	}
	return iteration, version, nil
}

// checkSame checks that another rank's file was saved by the same run.
func (c *Checkpoint) checkSame(f *torchpt.File) error {
	sd, err := stateDict(f)
	if err != nil {
		return err
	}
	it, _, err := header(f, sd)
	if err != nil {
		return err
	}
	if it != c.Iteration {
		return fmt.Errorf("%s is at iteration %d, %s at %d: files from different saves", f.Path, it, c.files[0][0].Path, c.Iteration)
	}
	a, err := readArgs(f, sd)
	if err != nil {
		return err
	}
	for _, k := range []string{"tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size"} {
		x, _ := a.intOr(k, 1)
		y, _ := c.args.intOr(k, 1)
		if x != y {
			return fmt.Errorf("%s: args.%s=%d but %s has %d: files from different runs", f.Path, k, x, c.files[0][0].Path, y)
		}
	}
	return nil
}
