package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/megatron"
	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// CkptFormatTorch is --ckpt-format torch: Megatron's legacy checkpoints,
// one torch.save file per tensor- and pipeline-parallel rank
// (iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt), loaded only by the
// layout that saved them, as Megatron loads them.
//
// A save writes the run's sharded checkpoint into a staging directory
// (<save>/.gotron-torch-staging, every rank its shards, as any save), then
// world rank 0 reads it whole and writes Megatron's files (package
// megatron's Save) with gotron's own metadata under megatron.ResumeKey,
// and removes the staging. A load imports the files (package megatron's
// Import: weights, Adam or SGD state, scheduler, counters), writes them as
// a one-rank gotron checkpoint in a temporary directory of this rank's and
// resumes from it as from any gotron checkpoint; the metadata under
// ResumeKey (RNG streams, loss scaler, NaN count) makes the resume of a
// gotron-saved run exact, a Megatron-saved run resumes as 'gotron convert
// --from megatron' would (Megatron's torch and CUDA RNG states have no
// gotron counterpart).
const CkptFormatTorch = "torch"

// stagingDir is where a torch-format save writes its sharded checkpoint.
const stagingDir = ".gotron-torch-staging"

// saveTorch is save for --ckpt-format torch.
func (ck *checkpointer) saveTorch(root string) error {
	stage := filepath.Join(root, stagingDir)
	var err error
	if isWriter(ck.par) {
		err = os.RemoveAll(stage) // a crashed save's leftovers
	}
	if err = ck.agreeSave(err, "prepare"); err != nil {
		return err
	}
	ck.shownRoot, ck.shownFormat = root, CkptFormatTorch
	err = ck.saveUntimed(stage, false)
	ck.shownRoot, ck.shownFormat = "", ""
	if err != nil {
		return err
	}
	if isWriter(ck.par) {
		err = ck.exportTorch(stage, root)
		if rerr := os.RemoveAll(stage); err == nil {
			err = rerr
		}
	}
	return ck.agreeSave(err, "write Megatron's files")
}

// exportTorch writes the checkpoint under stage in Megatron's layout
// under root.
func (ck *checkpointer) exportTorch(stage, root string) error {
	r, err := ckpt.Open(stage, -1)
	if err != nil {
		return err
	}
	defer r.Close()
	var ra RunArgs
	if err := json.Unmarshal(r.Meta.Args, &ra); err != nil {
		return fmt.Errorf("%s: args: %w", stage, err)
	}
	var sched optim.SchedulerState
	if err := json.Unmarshal(r.Meta.Scheduler, &sched); err != nil {
		return fmt.Errorf("%s: scheduler: %w", stage, err)
	}
	resume, err := json.Marshal(r.Meta)
	if err != nil {
		return err
	}
	e := megatron.Export{Model: ra.Model, SeqLength: ra.SeqLength, TP: ck.par.TP.Size(), PP: ck.par.PP.Size(),
		Iteration: int64(r.Meta.Iteration), LR: sched.MaxLR, DecoupledLR: ck.cfg.DecoupledLR, WeightDecay: sched.StartWD,
		Beta1: ck.cfg.Adam.Beta1, Beta2: ck.cfg.Adam.Beta2, Eps: ck.cfg.Adam.Eps, Resume: resume,
		Args: map[string]any{"micro_batch_size": int64(ck.cfg.MicroBatchSize), "global_batch_size": int64(ck.cfg.GlobalBatchSize),
			"data_parallel_size": int64(ck.par.DP.Size()), "lr": sched.MaxLR, "min_lr": sched.MinLR}}
	// What Megatron's check_checkpoint_args compares, from the command line
	// where gotron keeps no field for it (Megatron's defaults otherwise).
	argv, _ := ck.cfg.Args["argv"].([]string)
	e.Args["make_vocab_size_divisible_by"] = int64(128)
	if v, ok := flagValue(argv, "make-vocab-size-divisible-by"); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			e.Args["make_vocab_size_divisible_by"] = n
		}
	}
	e.Args["tokenizer_type"] = nil
	if v, ok := flagValue(argv, "tokenizer-type"); ok {
		e.Args["tokenizer_type"] = v
	}
	e.Args["data_parallel_random_init"] = false
	// Megatron keeps the sample counters in args, with or without the
	// optimizer state (--no-save-optim).
	e.Args["consumed_train_samples"] = r.Meta.ConsumedTrainSamples
	e.Args["skipped_train_samples"] = r.Meta.SkippedTrainSamples
	e.Args["consumed_valid_samples"] = r.Meta.ConsumedValidSamples
	e.Args["add_position_embedding"] = ra.Model.PositionEmbeddingType != gpt.NoPositionEmbedding
	e.Args["gotron_argv"] = argvList(argv)
	if e.Beta1 == 0 {
		e.Beta1, e.Beta2, e.Eps = 0.9, 0.999, 1e-8
	}
	if ck.stepper.pipelined() {
		e.VP = len(ck.stepper.stages)
		// gotron's split (even, uneven or accounting for the embedding and
		// loss) is the files' split, and args say how Megatron makes it.
		split := ck.cfg.pipelineSplit()
		e.LayerRanges = func(p int) ([][2]int, error) { return split.LayerRanges(ra.Model.NumLayers, p) }
		for k, v := range map[string]any{"decoder_first_pipeline_num_layers": split.FirstLayers, "decoder_last_pipeline_num_layers": split.LastLayers} {
			if v != 0 {
				e.Args[k] = int64(v.(int))
			}
		}
		e.Args["account_for_embedding_in_pipeline_split"] = split.AccountForEmbedding
		e.Args["account_for_loss_in_pipeline_split"] = split.AccountForLoss
	}
	e.Param = func(name string, shape []int) ([]float32, error) {
		v, got, err := r.ReadWhole(ckpt.GroupModel, name)
		if err == nil && fmt.Sprint(got) != fmt.Sprint(shape) {
			err = fmt.Errorf("shape %v in the staging checkpoint, Megatron's layout wants %v", got, shape)
		}
		return v, err
	}
	if r.Has(ckpt.GroupOptimizer) {
		st := &megatron.OptimizerState{Kind: ra.OptimizerKind, Steps: ra.OptimizerSteps, Buffers: map[string][]float32{},
			Scheduler: sched, LossScaler: ra.LossScaler, ConsumedTrainSamples: r.Meta.ConsumedTrainSamples,
			SkippedTrainSamples: r.Meta.SkippedTrainSamples, ConsumedValidSamples: r.Meta.ConsumedValidSamples,
			FLOPs: r.Meta.FloatingPointOperationsSoFar, Seed: ck.cfg.Seed}
		for name := range r.Tensors(ckpt.GroupOptimizer) {
			v, _, err := r.ReadWhole(ckpt.GroupOptimizer, name)
			if err != nil {
				return err
			}
			st.Buffers[name] = v
		}
		e.Optimizer = st
	}
	return megatron.Save(root, e)
}

// loadTorch is load for --ckpt-format torch: root holds Megatron's legacy
// layout (saved by Megatron or by gotron), read by the layout it was
// saved with.
func (ck *checkpointer) loadTorch(root string) error {
	if _, err := os.Stat(filepath.Join(root, ckpt.TrackerFile)); errors.Is(err, os.ErrNotExist) {
		if ck.cfg.CkptConvertFormat != "" {
			return fmt.Errorf("train: --ckpt-convert-format: --load %s holds no checkpoint (%s)", root, ckpt.TrackerFile) // Megatron's exit_on_missing_checkpoint
		}
		ck.rawf("WARNING: could not find the metadata file %s", filepath.Join(root, ckpt.TrackerFile))
		ck.rawf("    will not load any checkpoints and will start from random")
		return nil
	}
	if !megatron.IsMegatronDir(root) {
		return fmt.Errorf("train: --load %s --ckpt-format torch: not a Megatron legacy (torch format) checkpoint directory; a gotron checkpoint loads with --ckpt-format %s", root, ckpt.FormatName)
	}
	c, err := megatron.Open(root)
	if err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	defer c.Close()
	tp, pp, vp := ck.par.TP.Size(), ck.par.PP.Size(), 1
	if ck.stepper.pipelined() {
		vp = len(ck.stepper.stages)
	}
	if c.TP != tp || c.PP != pp || max(c.VP, 1) != vp {
		return fmt.Errorf("train: --load %s (--ckpt-format torch) was saved with tensor-parallel size %d, pipeline-parallel size %d, virtual stages %d; this run has %d, %d, %d: the legacy format holds one file per rank and loads only with the layout that saved it (as Megatron). Resume with that layout, or convert it with 'gotron convert --from megatron --load %s --save DIR' and --load DIR (gotron's format reshards)",
			root, c.TP, c.PP, max(c.VP, 1), tp, pp, vp, root)
	}
	m, st, info, err := c.Import(megatron.Options{})
	if err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	resume, err := c.Resume()
	if err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	for _, w := range info.Warnings {
		if resume != nil && strings.HasPrefix(w, "dropout not imported") {
			continue // this run's flags set it, as they did for the run that saved
		}
		ck.printf("WARNING: --load %s: %s", root, w)
	}
	if st == nil && c.Optimizer && !ck.cfg.Finetune && !ck.cfg.NoLoadOptim {
		// The files hold optimizer state gotron cannot take (the warnings
		// say why): resuming without it must be asked for.
		return fmt.Errorf("train: --load %s: the checkpoint's optimizer state cannot be imported (%s): add --no-load-optim to start from its weights with a fresh optimizer at iteration 0, or --finetune",
			root, strings.Join(info.Warnings, "; "))
	}
	tmp, err := os.MkdirTemp("", "gotron-torch-load-*")
	if err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	defer os.RemoveAll(tmp)
	if err := saveImported(context.Background(), tmp, int(c.Iteration), m, st, ck.cfg.SeqLength, resume,
		map[string]any{"load": root, "ckpt_format": CkptFormatTorch}); err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	ck.shownRoot, ck.shownFormat = root, CkptFormatTorch
	defer func() { ck.shownRoot, ck.shownFormat = "", "" }()
	if err := ck.loadGotron(tmp); err != nil {
		// Name the directory the user gave, not this rank's import of it.
		return errors.New(strings.ReplaceAll(err.Error(), tmp, root+" (imported)"))
	}
	return nil
}

// saveImported writes an imported Megatron model and optimizer state as
// the checkpoint gotron train would have saved at that iteration with one
// rank. resume, when not nil, is the gotron metadata the files carried
// (megatron.ResumeKey) and is taken whole; otherwise the metadata is
// rebuilt from st. Without st (weights only) it is SaveModel's checkpoint.
func saveImported(ctx context.Context, dir string, iteration int, m *gpt.Model, st *megatron.OptimizerState, seq int, resume []byte, cli map[string]any) error {
	if st == nil && resume == nil {
		return SaveModel(ctx, dir, 0, m, seq, cli)
	}
	var meta ckpt.Meta
	if resume != nil { // st is nil for a checkpoint saved with --no-save-optim
		if err := json.Unmarshal(resume, &meta); err != nil {
			return fmt.Errorf("%s: %w", megatron.ResumeKey, err)
		}
		if meta.Iteration != iteration {
			return fmt.Errorf("%s is of iteration %d, the files of %d", megatron.ResumeKey, meta.Iteration, iteration)
		}
	} else {
		args, err := json.Marshal(RunArgs{Model: m.Config, SeqLength: seq, OptimizerKind: st.Kind, OptimizerSteps: st.Steps,
			CLI: cli, LossScaler: st.LossScaler})
		if err != nil {
			return err
		}
		rng, err := json.Marshal(tensor.NewRNG(uint64(st.Seed)).Fork("dropout").State())
		if err != nil {
			return err
		}
		sched, err := json.Marshal(st.Scheduler)
		if err != nil {
			return err
		}
		meta = ckpt.Meta{Iteration: iteration, ConsumedTrainSamples: st.ConsumedTrainSamples, SkippedTrainSamples: st.SkippedTrainSamples,
			ConsumedValidSamples: st.ConsumedValidSamples, FloatingPointOperationsSoFar: st.FLOPs, Args: args, RNGState: rng, Scheduler: sched}
	}
	shapes := map[string][]int{}
	var pieces []ckpt.Piece
	for _, p := range m.Params() {
		shapes[p.Name] = p.Shape()
		pieces = append(pieces, ckpt.Piece{Group: ckpt.GroupModel, Name: p.Name, GlobalShape: p.Shape(), Block: ckpt.Whole(p.Shape()), Data: p.Float32s()})
	}
	var buffers map[string][]float32
	if st != nil {
		buffers = st.Buffers
	}
	for k, v := range buffers {
		_, name, _ := strings.Cut(k, "/")
		shape, ok := shapes[name]
		n := 1
		for _, d := range shape {
			n *= d
		}
		if !ok || len(v) != n {
			return fmt.Errorf("optimizer buffer %s matches no parameter of the model", k)
		}
		pieces = append(pieces, ckpt.Piece{Group: ckpt.GroupOptimizer, Name: k, GlobalShape: shape, Block: ckpt.Whole(shape), Data: v})
	}
	if err := ckpt.BeginSharded(dir, iteration); err != nil {
		return err
	}
	err := ckpt.WriteShards(ctx, dir, iteration, 0, pieces)
	if err == nil {
		err = ckpt.FinishSharded(dir, iteration, meta, ckpt.Layout{WorldSize: 1, TensorParallel: 1, PipelineParallel: 1, DataParallel: 1})
	}
	if err != nil {
		ckpt.AbortSharded(dir, iteration)
	}
	return err
}

// SaveMegatronImport writes an imported Megatron model and optimizer
// state (package megatron's Import) as a gotron checkpoint that train
// --load resumes from at that iteration ('gotron convert --from megatron').
// Megatron's RNG states (torch's, CUDA's) have no gotron counterpart: the
// dropout stream is the one a fresh gotron run with Megatron's --seed
// starts with.
func SaveMegatronImport(ctx context.Context, dir string, iteration int, m *gpt.Model, st *megatron.OptimizerState, seq int, cli map[string]any) error {
	if err := saveImported(ctx, dir, iteration, m, st, seq, nil, cli); err != nil {
		return fmt.Errorf("convert: save %s: %w", dir, err)
	}
	return nil
}

// convertCheckpoint is --ckpt-convert-format: the loaded state saved at its
// iteration in that format under --ckpt-convert-save/<format>, as
// Megatron's setup_model_and_optimizer does before it exits.
func (t *Trainer) convertCheckpoint() error {
	from := t.cfg.CkptFormat
	if from == "" {
		from = ckpt.FormatName
	}
	dir := filepath.Join(t.cfg.CkptConvertSave, t.cfg.CkptConvertFormat)
	if isWriter(t.cfg.Parallel) {
		if err := checkSaveDir(dir); err != nil {
			return err
		}
	}
	t.cfg.CkptFormat = t.cfg.CkptConvertFormat
	if t.cfg.CkptFormat == "torch_dist" {
		t.cfg.CkptFormat = ""
	}
	if err := t.checkpointer.save(dir, false); err != nil {
		return err
	}
	t.reporter.rawf("> converted checkpoint: %s -> %s.", from, t.cfg.CkptConvertFormat)
	return nil
}

// flagValue is the last value of --name in argv ("--name value" or
// "--name=value").
func flagValue(argv []string, name string) (string, bool) {
	v, found := "", false
	for i, a := range argv {
		switch {
		case a == "--"+name && i+1 < len(argv):
			v, found = argv[i+1], true
		case strings.HasPrefix(a, "--"+name+"="):
			v, found = strings.TrimPrefix(a, "--"+name+"="), true
		}
	}
	return v, found
}

// argvList is argv as a Python list of str.
func argvList(argv []string) *torchpt.List {
	l := &torchpt.List{}
	for _, a := range argv {
		l.Items = append(l.Items, strings.ToValidUTF8(a, "\uFFFD")) // pickled as str
	}
	return l
}
