package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// Checkpoint layout (Megatron's, spec §2.13), single process:
//
//	<save>/latest_checkpointed_iteration.txt   the last complete iteration
//	<save>/iter_0000100/model.safetensors      parameters, Megatron names, F32
//	<save>/iter_0000100/optimizer.safetensors  optimizer buffers ("exp_avg/<name>", ...)
//	<save>/iter_0000100/metadata.json          iteration, samples, scheduler, RNG, args
//
// A save writes iter_N.tmp-<pid>/, fsyncs every file and the directory,
// renames it to iter_N/, fsyncs <save>, then replaces the tracker file the
// same way. A crash at any point leaves the previous tracker pointing at a
// complete directory.

// CheckpointVersion is written to metadata.json; loading rejects others.
const CheckpointVersion = 1

// Meta is metadata.json.
type Meta struct {
	Format         string               `json:"format"`
	Version        int                  `json:"checkpoint_version"`
	Iteration      int64                `json:"iteration"`
	ConsumedTrain  int64                `json:"consumed_train_samples"`
	ConsumedValid  int64                `json:"consumed_valid_samples"`
	SkippedTrain   int64                `json:"skipped_train_samples"`
	NaNIterations  int64                `json:"nan_iterations"`
	FLOPsSoFar     float64              `json:"num_floating_point_operations_so_far"`
	Scheduler      optim.SchedulerState `json:"opt_param_scheduler"`
	OptimizerKind  string               `json:"optimizer_kind,omitempty"`
	OptimizerSteps int64                `json:"optimizer_steps"`
	RNG            tensor.RNGState      `json:"rng_state"`
	Model          gpt.Config           `json:"model"`
	Args           map[string]any       `json:"args,omitempty"`
}

// IterDir is Megatron's iter_%07d directory name.
func IterDir(root string, iteration int64) string {
	return filepath.Join(root, fmt.Sprintf("iter_%07d", iteration))
}

const trackerName = "latest_checkpointed_iteration.txt"

// LatestIteration reads the tracker file of root.
func LatestIteration(root string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(root, trackerName))
	if err != nil {
		return 0, fmt.Errorf("train: checkpoint %s: %w", root, err)
	}
	s := strings.TrimSpace(string(b))
	it, err := strconv.ParseInt(s, 10, 64)
	if err != nil || it < 0 {
		return 0, fmt.Errorf("train: %s: %q is not an iteration number", filepath.Join(root, trackerName), s)
	}
	return it, nil
}

func (t *Trainer) save(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("train: --save %s: %w", root, err)
	}
	// Temporary directories of saves a crash interrupted are never loaded;
	// clear them.
	if stale, _ := filepath.Glob(filepath.Join(root, "iter_*.tmp-*")); len(stale) > 0 {
		for _, s := range stale {
			os.RemoveAll(s)
		}
	}
	final := IterDir(root, t.Iteration)
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	model := map[string]safetensors.Tensor{}
	for _, p := range t.Model.Params() {
		st, err := safetensors.FromFloat32(safetensors.F32, p.Shape(), p.Float32s())
		if err != nil {
			return err
		}
		model[p.Name] = st
	}
	if err := writeSynced(filepath.Join(tmp, "model.safetensors"), model); err != nil {
		return err
	}
	os0 := t.opt.State()
	if !t.cfg.NoSaveOptim {
		opt := map[string]safetensors.Tensor{}
		for name, buf := range os0.Buffers {
			st, err := safetensors.FromFloat32(safetensors.F32, []int{len(buf)}, buf)
			if err != nil {
				return err
			}
			opt[name] = st
		}
		if err := writeSynced(filepath.Join(tmp, "optimizer.safetensors"), opt); err != nil {
			return err
		}
	}
	meta := Meta{Format: "gotron", Version: CheckpointVersion, Iteration: t.Iteration, ConsumedTrain: t.Consumed,
		ConsumedValid: t.ConsumedValid, SkippedTrain: t.Skipped, NaNIterations: t.NaNIterations, FLOPsSoFar: t.FLOPsSoFar,
		Scheduler: t.sched.State(), OptimizerKind: os0.Kind, OptimizerSteps: os0.Steps, RNG: t.rng.State(),
		Model: t.Model.Config, Args: t.cfg.Args}
	mb, err := json.MarshalIndent(meta, "", " ")
	if err != nil {
		return err
	}
	if err := writeFileSynced(filepath.Join(tmp, "metadata.json"), mb); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	os.RemoveAll(final) // an older save of the same iteration
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	if err := syncDir(root); err != nil {
		return err
	}
	tracker := filepath.Join(root, trackerName)
	if err := writeFileSynced(tracker+".tmp", []byte(strconv.FormatInt(t.Iteration, 10))); err != nil {
		return err
	}
	if err := os.Rename(tracker+".tmp", tracker); err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	if err := syncDir(root); err != nil {
		return err
	}
	t.printf("saved checkpoint at iteration %7d to %s", t.Iteration, root)
	return nil
}

func writeSynced(path string, tensors map[string]safetensors.Tensor) error {
	if err := safetensors.WriteFile(path, tensors, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("train: save %s: %w", path, err)
	}
	return nil
}

func writeFileSynced(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("train: save %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("train: save %s: %w", path, err)
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("train: save: fsync %s: %w", dir, err)
	}
	return nil
}

// ReadMeta reads the metadata of the latest checkpoint under root.
func ReadMeta(root string) (Meta, string, error) {
	it, err := LatestIteration(root)
	if err != nil {
		return Meta{}, "", err
	}
	dir := IterDir(root, it)
	b, err := os.ReadFile(filepath.Join(dir, "metadata.json"))
	if err != nil {
		return Meta{}, "", fmt.Errorf("train: checkpoint: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, "", fmt.Errorf("train: %s: %w", filepath.Join(dir, "metadata.json"), err)
	}
	if m.Format != "gotron" || m.Version != CheckpointVersion {
		return Meta{}, "", fmt.Errorf("train: %s: format %q version %d, want gotron version %d", dir, m.Format, m.Version, CheckpointVersion)
	}
	return m, dir, nil
}

// LoadWeights copies a checkpoint's parameters into m, checking every name
// and shape and naming the first mismatch.
func LoadWeights(m *gpt.Model, dir string) error {
	path := filepath.Join(dir, "model.safetensors")
	f, err := safetensors.ReadFile(path)
	if err != nil {
		return fmt.Errorf("train: load: %w", err)
	}
	defer f.Close()
	want := map[string]bool{}
	for _, p := range m.Params() {
		want[p.Name] = true
		info, ok := f.Info(p.Name)
		if !ok {
			return fmt.Errorf("train: %s: missing tensor %s (the model expects shape %v)", path, p.Name, p.Shape())
		}
		if !tensor.SameShape(info.Shape, p.Shape()) {
			return fmt.Errorf("train: %s: tensor %s has shape %v, model expects %v", path, p.Name, info.Shape, p.Shape())
		}
		st, err := f.Tensor(p.Name)
		if err != nil {
			return err
		}
		if err := st.DecodeFloat32(p.Float32s()); err != nil {
			return fmt.Errorf("train: %s: tensor %s: %w", path, p.Name, err)
		}
	}
	for _, in := range f.Infos() {
		if !want[in.Name] {
			return fmt.Errorf("train: %s: tensor %s is not a parameter of this model (check --num-layers, --untie-embeddings-and-output-weights, ...)", path, in.Name)
		}
	}
	return nil
}

func (t *Trainer) load(root string) error {
	meta, dir, err := ReadMeta(root)
	if err != nil {
		return err
	}
	if err := LoadWeights(t.Model, dir); err != nil {
		return err
	}
	if t.cfg.Finetune {
		t.printf("loaded weights from %s (--finetune: iteration, optimizer and scheduler start fresh)", dir)
		return nil
	}
	t.Iteration, t.Consumed, t.ConsumedValid = meta.Iteration, meta.ConsumedTrain, meta.ConsumedValid
	t.Skipped, t.NaNIterations, t.FLOPsSoFar = meta.SkippedTrain, meta.NaNIterations, meta.FLOPsSoFar
	t.rng.SetState(meta.RNG)
	if err := t.sched.LoadState(meta.Scheduler); err != nil {
		return fmt.Errorf("train: %s: %w", dir, err)
	}
	if !t.cfg.NoLoadOptim {
		path := filepath.Join(dir, "optimizer.safetensors")
		f, err := safetensors.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("train: %s has no optimizer state (saved with --no-save-optim?): use --no-load-optim", dir)
		}
		if err != nil {
			return fmt.Errorf("train: load: %w", err)
		}
		defer f.Close()
		st := optim.State{Kind: meta.OptimizerKind, Steps: meta.OptimizerSteps, Buffers: map[string][]float32{}}
		for _, in := range f.Infos() {
			x, err := f.Tensor(in.Name)
			if err != nil {
				return err
			}
			buf := make([]float32, x.NumElements())
			if err := x.DecodeFloat32(buf); err != nil {
				return fmt.Errorf("train: %s: %s: %w", path, in.Name, err)
			}
			st.Buffers[in.Name] = buf
		}
		if err := t.opt.LoadState(st); err != nil {
			return fmt.Errorf("train: %s: %w", path, err)
		}
	}
	t.printf("loaded checkpoint from %s at iteration %d (consumed samples %d)", dir, t.Iteration, t.Consumed)
	return nil
}
