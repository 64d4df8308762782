package megatron

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/internal/half"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// OptimizerState is a Megatron checkpoint's optimizer and training state,
// merged over the tensor- and pipeline-parallel ranks exactly as the
// weights are and named as gotron's checkpoints name it.
type OptimizerState struct {
	// Kind is gotron's optimizer: "adamw" (Megatron's adam, Adam with
	// decoupled weight decay) or "sgd".
	Kind string
	// Steps is the number of optimizer steps taken (Adam's step, which
	// its bias correction uses; SGD keeps none: the iteration).
	Steps int64
	// Buffers maps "<kind>/<param>" (exp_avg and exp_avg_sq, or
	// momentum_buffer) to the whole tensor, row-major in the parameter's
	// shape: gotron's optimizer checkpoint entries.
	Buffers map[string][]float32
	// MainParams reports that the model's weights are the optimizer's fp32
	// main params (Float16OptimizerWithFloat16Params: bf16 or fp16
	// training), not their bf16/fp16 copies in the model state dicts.
	MainParams bool
	// Scheduler is opt_param_scheduler, field for field.
	Scheduler optim.SchedulerState
	// LossScaler is fp16's dynamic loss scaler (grad_scaler); nil without.
	LossScaler *optim.LossScalerState
	// ConsumedTrainSamples, SkippedTrainSamples and ConsumedValidSamples
	// come from args, FLOPs from num_floating_point_operations_so_far.
	ConsumedTrainSamples, SkippedTrainSamples, ConsumedValidSamples int64
	FLOPs                                                           float64
	// Seed is args.seed.
	Seed int64
	// Source describes what was read, for messages: "Adam state of
	// Float16OptimizerWithFloat16Params (bf16), step 1190".
	Source string
}

// An OptimizerError is a malformed optimizer section: the weights alone can
// still be imported (Load).
type OptimizerError struct{ Err error }

func (e *OptimizerError) Error() string { return e.Err.Error() }
func (e *OptimizerError) Unwrap() error { return e.Err }

// Import opens the checkpoint under dir (see Open) and converts the model
// and its optimizer state (see Checkpoint.Import).
func Import(dir string, opts Options) (*gpt.Model, *OptimizerState, Info, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, nil, Info{}, err
	}
	defer c.Close()
	return c.Import(opts)
}

// Import converts the model and, when the files hold a non-distributed
// optimizer's state that gotron's optimizers can take (Adam, SGD with
// momentum), that state: each rank's parameters are listed as Megatron's
// optimizer saw them (named_parameters() of the rank's model chunks, split
// into param groups by weight decay and decoupled learning rate), which
// maps the optimizer state dict's indices to names; the per-rank tensors
// are then merged by the weights' plan (QKV query groups, SwiGLU halves,
// padded vocabulary rows, ...). With fp32 main params (bf16/fp16 training)
// those become the weights. When the state cannot be taken (none saved, a
// release checkpoint, the distributed optimizer, another optimizer, state
// missing), the optimizer state is nil and Info.Warnings says why, naming
// the file; a malformed optimizer section is an *OptimizerError.
func (c *Checkpoint) Import(opts Options) (*gpt.Model, *OptimizerState, Info, error) {
	copies := 1
	if c.Optimizer {
		copies = 3 // the weights, Adam's two moments (SGD: one buffer)
	}
	m, info, conv, err := c.model(opts, copies)
	if err != nil {
		return nil, nil, Info{}, err
	}
	if !c.Optimizer {
		return m, nil, info, nil // Info.Optimizer says so
	}
	st, why, err := c.optimizer(m, conv)
	if err != nil {
		return nil, nil, Info{}, &OptimizerError{fmt.Errorf("megatron: %w", err)}
	}
	if why != "" {
		info.Warnings = append(info.Warnings, "optimizer state not imported: "+why)
		return m, nil, info, nil
	}
	if st.tiedDiff != "" {
		info.Warnings = append(info.Warnings, st.tiedDiff)
	}
	return m, &st.OptimizerState, info, nil
}

// groupSig is what decides a parameter's param group in Megatron's
// _get_param_groups: no weight decay (biases and 1-D parameters) and the
// decoupled learning rate (embedding and output layer, --decoupled-lr).
type groupSig struct{ noWD, decoupled bool }

// localParam is one parameter of a rank as its optimizer saw it.
type localParam struct {
	src    *source // the plan's source (or the tied output layer's copy)
	t      int     // the tensor-parallel rank: src.slices[t] is its weight
	tied   bool
	sig    groupSig
	weight *torchpt.Tensor
}

// name is the parameter's key in the file and, where it differs,
// gotron's name.
func (p localParam) name() string {
	switch {
	case p.tied:
		return p.src.from + " (the last stage's copy of the tied embeddings)"
	case p.src.key != p.src.name:
		return p.src.from + " → " + p.src.name
	}
	return p.src.from
}

// rankOptimizer is one rank file's optimizer section.
type rankOptimizer struct {
	file    *torchpt.File
	wrapper string // "Float16OptimizerWithFloat16Params" or "FP32Optimizer"
	state   *torchpt.Dict
	groups  []*torchpt.Dict
	mains   [][]*torchpt.Tensor // fp32_from_fp16_params, by group
	scaler  *torchpt.Dict       // grad_scaler, or nil
	// dist is the distributed optimizer's distrib_optim.pt beside the file:
	// its gradient buffers (distFile open until the import ends).
	dist     []distBuffer
	distFile *torchpt.File
}

// optimizerResult is the optimizer import's outcome.
type optimizerResult struct {
	OptimizerState
	tiedDiff string // a warning: the tied copy's state differs
}

// optimizer imports the optimizer state and, with main params, the
// weights of m. why says why nothing was imported; err is a malformed
// section.
func (c *Checkpoint) optimizer(m *gpt.Model, conv converted) (optimizerResult, string, error) {
	o := &optImport{c: c, conv: conv, bufs: map[*source]map[string][]*torchpt.Tensor{},
		mains: map[*source][]*torchpt.Tensor{}, steps: map[int64]string{}}
	defer func() {
		for _, ro := range o.ranks {
			if ro.distFile != nil {
				ro.distFile.Close()
			}
		}
	}()
	collect := func() (string, error) {
		if o.dist {
			return o.collectDist()
		}
		return o.collect()
	}
	for _, step := range []func() (string, error){o.optimizerKind, o.readRanks, collect, o.stepCount} {
		if why, err := step(); err != nil || why != "" {
			return o.res, why, err
		}
	}
	if err := o.merge(m); err != nil {
		return o.res, "", err
	}
	if err := c.trainingState(&o.res.OptimizerState, o.ranks[0]); err != nil {
		return o.res, "", err
	}
	name := map[string]string{"adamw": "Adam", "sgd": "SGD"}[o.res.Kind]
	o.res.Source = fmt.Sprintf("%s state of %s (%s), step %d", name, o.ranks[0].wrapper, precision(o.locals[0]), o.res.Steps)
	if o.dist {
		o.res.Source = fmt.Sprintf("%s state of the distributed optimizer (%s files, %s), step %d", name, DistOptimFile, precision(o.locals[0]), o.res.Steps)
	}
	return o.res, "", nil
}

// optImport is one optimizer import in progress.
type optImport struct {
	c     *Checkpoint
	conv  converted
	res   optimizerResult
	kinds []string // the per-parameter state gotron's optimizer keeps
	// tiedSeparate: the tied embeddings' copy on the last stage is a
	// parameter of its own (in a chunk without the embeddings).
	tiedSeparate bool
	// dist: the distributed optimizer (distrib_optim.pt files); dp, the
	// data-parallel size, bucketSizes the DDP bucket sizes args allow (0:
	// one bucket) and tiedEmb tied embeddings, for its buffer layout.
	dist        bool
	dp          int
	bucketSizes []int
	tiedEmb     bool
	ranks       []*rankOptimizer // pipeline rank by pipeline rank, TP ranks within
	locals      [][]localParam   // each rank's parameters, named_parameters() order
	// bufs holds each parameter's per-kind TP slices of the state, mains
	// its fp32 main params' slices, steps the step counts found (value →
	// where).
	bufs  map[*source]map[string][]*torchpt.Tensor
	mains map[*source][]*torchpt.Tensor
	steps map[int64]string
}

// optimizerKind checks what args say about the optimizer: gotron takes the
// non-distributed Adam (decoupled weight decay) and SGD of a non-release
// checkpoint.
func (o *optImport) optimizerKind() (string, error) {
	c, f0 := o.c, o.c.files[0][0]
	if c.Release {
		return fmt.Sprintf("%s is a release checkpoint, whose optimizer state Megatron does not load either", c.Dir), nil
	}
	dist, err := c.args.boolOr("use_distributed_optimizer", false)
	if err != nil {
		return "", err
	}
	o.dist = dist
	kind, err := c.args.strOr("optimizer", "adam")
	if err != nil {
		return "", err
	}
	switch kind {
	case "adam", "adamw":
		if dwd, _ := c.args.boolOr("decoupled_weight_decay", true); !dwd {
			return fmt.Sprintf("%s: args.decoupled_weight_decay=False: Adam with L2 weight decay; gotron's Adam decouples it (AdamW)", f0.Path), nil
		}
		o.res.Kind, o.kinds = "adamw", []string{"exp_avg", "exp_avg_sq"}
	case "sgd":
		mom, err := c.args.floatOr("sgd_momentum", 0.9)
		if err != nil {
			return "", err
		}
		o.res.Kind = "sgd"
		if mom != 0 {
			o.kinds = []string{"momentum_buffer"}
		}
	default:
		return fmt.Sprintf("%s: args.optimizer=%q: gotron's optimizers are Adam (AdamW) and SGD", f0.Path, kind), nil
	}
	if o.dist {
		return o.distArgs()
	}
	return "", nil
}

// readRanks reads every rank's optimizer section and lists its parameters
// as its optimizer saw them, each with its param-group signature.
func (o *optImport) readRanks() (string, error) {
	c, conv := o.c, o.conv
	chunks, err := c.chunks()
	if err != nil {
		return "", err
	}
	byKey := map[chunkKey]*source{}
	for _, s := range conv.plan {
		byKey[chunkKey{s.chunk, s.key}] = s
	}
	if t := conv.tied; t != nil {
		// A copy in a chunk of its own is a parameter of its own (Megatron's
		// last-stage copy); in the embedding's chunk it would be the same one.
		emb := byKey[chunkKey{0, "embedding.word_embeddings.weight"}]
		o.tiedSeparate = emb == nil || emb.chunk != t.chunk
		if o.tiedSeparate {
			byKey[chunkKey{t.chunk, t.key}] = t
		}
	}
	decoupled := false
	for p := range c.PP {
		for t := range c.TP {
			f := c.files[t][p]
			dpath := filepath.Join(filepath.Dir(f.Path), DistOptimFile)
			var ro *rankOptimizer
			var why string
			if o.dist {
				if ro, why, err = readDistSection(f); err != nil || why != "" {
					return why, err
				}
				// The file stays open (closed when the import ends): its
				// tensors are read as the parameters merge.
				if ro.distFile, ro.dist, why, err = readDistOptim(dpath, o.kinds); err != nil || why != "" {
					return why, err
				}
			} else {
				if ro, why, err = readRankOptimizer(f); err != nil || why != "" {
					return why, err
				}
				if _, err := os.Stat(dpath); err == nil {
					return fmt.Sprintf("%s has a %s beside it, but args.use_distributed_optimizer is not set: which optimizer's state to take is unclear", f.Path, DistOptimFile), nil
				} else if !errors.Is(err, fs.ErrNotExist) {
					return "", err
				}
			}
			var lp []localParam
			for v := range c.VP {
				ci := v*c.PP + p
				d := chunks[ci].dicts[t]
				for i, k := range d.Keys() {
					ks, _ := k.(string)
					s := byKey[chunkKey{ci, ks}]
					if s == nil && o.dist && !isExtraState(ks) {
						// The buffer layout needs every parameter of the chunk.
						ro.distFile.Close()
						return fmt.Sprintf("%s: %s.%s is not a parameter of its own to the import: the distributed optimizer's buffer layout cannot be derived", f.Path, chunks[ci].key, ks), nil
					}
					if isExtraState(ks) || s == nil { // nil: the tied copy in the embedding's own chunk
						continue
					}
					w, _ := d.Values()[i].(*torchpt.Tensor) // plan checked the types
					lp = append(lp, localParam{src: s, t: t, tied: s == conv.tied, weight: w,
						sig: groupSig{noWD: strings.HasSuffix(ks, ".bias") || len(w.Shape) == 1}})
				}
			}
			for _, g := range ro.groups {
				decoupled = decoupled || groupDecoupled(g)
			}
			o.ranks = append(o.ranks, ro)
			o.locals = append(o.locals, lp)
		}
	}
	if decoupled { // --decoupled-lr: the embedding and output layer in groups of their own
		for _, lp := range o.locals {
			for i := range lp {
				k := lp[i].src.key
				lp[i].sig.decoupled = k == "embedding.word_embeddings.weight" || k == "output_layer.weight"
			}
		}
	}
	return "", nil
}

// collect maps every rank's optimizer indices to its parameters and
// gathers their state, main params and step counts.
func (o *optImport) collect() (string, error) {
	for ri, ro := range o.ranks {
		assigned, why, err := assignIndices(ro, o.locals[ri])
		if err != nil || why != "" {
			return why, err
		}
		for gi, idx := range assigned {
			g := ro.groups[gi]
			if v, ok := g.Get("step"); ok && v != nil {
				n, err := stepValue(v)
				if err != nil {
					return "", fmt.Errorf("%s: optimizer param_groups[%d].step: %w", ro.file.Path, gi, err)
				}
				o.steps[n] = fmt.Sprintf("%s param_groups[%d]", ro.file.Path, gi)
			}
			if v, ok := g.Get("amsgrad"); ok && v == true {
				return fmt.Sprintf("%s: optimizer param_groups[%d] has amsgrad=True: gotron's Adam keeps no max_exp_avg_sq", ro.file.Path, gi), nil
			}
			for _, a := range idx {
				if why, err := o.collectState(ro, gi, a.index, o.locals[ri][a.local]); err != nil || why != "" {
					return why, err
				}
			}
			if ro.mains != nil {
				if err := o.collectMains(ro, gi, idx, o.locals[ri]); err != nil {
					return "", err
				}
			}
		}
	}
	return "", nil
}

// collectState takes state[index] of rank ro as the state of lp.
func (o *optImport) collectState(ro *rankOptimizer, gi int, index int64, lp localParam) (string, error) {
	at := fmt.Sprintf("%s: optimizer state[%d] (%s, param group %d)", ro.file.Path, index, lp.name(), gi)
	v, ok := ro.state.Get(index)
	if !ok || v == nil {
		return fmt.Sprintf("%s: no optimizer state for parameter %d (%s): saved before the optimizer's first step?", ro.file.Path, index, lp.name()), nil
	}
	d, ok := v.(*torchpt.Dict)
	if !ok {
		return "", fmt.Errorf("%s is a %T, not a dict of tensors", at, v)
	}
	for i, k := range d.Keys() {
		ks, _ := k.(string)
		switch {
		case d.Values()[i] == nil: // torch's SGD without momentum: momentum_buffer None
		case ks == "step":
			n, err := stepValue(d.Values()[i])
			if err != nil {
				return "", fmt.Errorf("%s: step: %w", at, err)
			}
			o.steps[n] = at
		case !slices.Contains(o.kinds, ks):
			return fmt.Sprintf("%s holds %v, which gotron's %s does not keep", at, k, o.res.Kind), nil
		}
	}
	if o.bufs[lp.src] == nil {
		o.bufs[lp.src] = map[string][]*torchpt.Tensor{}
	}
	for _, kind := range o.kinds {
		x, ok := d.Get(kind)
		if !ok || x == nil {
			return fmt.Sprintf("%s has no %s (keys %s)", at, kind, strings.Join(d.StringKeys(), ", ")), nil
		}
		tt, ok := x.(*torchpt.Tensor)
		if !ok {
			return "", fmt.Errorf("%s: %s is a %T, not a tensor", at, kind, x)
		}
		if !slices.Equal(tt.Shape, lp.weight.Shape) {
			return "", fmt.Errorf("%s: %s has shape %v, but the parameter the param groups give this index, %s, has shape %v", at, kind, tt.Shape, lp.name(), lp.weight.Shape)
		}
		if o.bufs[lp.src][kind] == nil {
			o.bufs[lp.src][kind] = make([]*torchpt.Tensor, o.c.TP)
		}
		o.bufs[lp.src][kind][lp.t] = tt
	}
	return "", nil
}

// collectMains takes fp32_from_fp16_params[gi] of rank ro as the main
// params of the group's 16-bit parameters, in order, each checked to round
// to its weight.
func (o *optImport) collectMains(ro *rankOptimizer, gi int, idx []assigned, locals []localParam) error {
	var sixteen []localParam
	for _, a := range idx {
		if dt := locals[a.local].weight.DType(); dt == safetensors.BF16 || dt == safetensors.F16 {
			sixteen = append(sixteen, locals[a.local]) // fp32 parameters are updated directly
		}
	}
	if len(sixteen) != len(ro.mains[gi]) {
		return fmt.Errorf("%s: optimizer fp32_from_fp16_params[%d] holds %d tensors, param group %d has %d 16-bit parameters", ro.file.Path, gi, len(ro.mains[gi]), gi, len(sixteen))
	}
	for k, lp := range sixteen {
		mt := ro.mains[gi][k]
		at := fmt.Sprintf("%s: optimizer fp32_from_fp16_params[%d][%d] (%s)", ro.file.Path, gi, k, lp.name())
		if !slices.Equal(mt.Shape, lp.weight.Shape) {
			return fmt.Errorf("%s has shape %v, the parameter %v", at, mt.Shape, lp.weight.Shape)
		}
		if err := checkMain(at, mt, lp.weight, "the main params do not belong to the parameters the param groups give them"); err != nil {
			return err
		}
		if o.mains[lp.src] == nil {
			o.mains[lp.src] = make([]*torchpt.Tensor, o.c.TP)
		}
		o.mains[lp.src][lp.t] = mt
	}
	return nil
}

// stepCount settles the step count: one value everywhere.
func (o *optImport) stepCount() (string, error) {
	switch {
	case len(o.steps) > 1:
		var where []string
		for n, at := range o.steps {
			where = append(where, fmt.Sprintf("%d (%s)", n, at))
		}
		sort.Strings(where)
		return fmt.Sprintf("the step counts differ: %s", strings.Join(where, ", ")), nil
	case len(o.steps) == 1:
		for n := range o.steps {
			o.res.Steps = n
		}
	case o.res.Kind == "adamw":
		return fmt.Sprintf("%s: the Adam state has no step count (neither in param_groups nor per parameter)", o.c.files[0][0].Path), nil
	default:
		o.res.Steps = o.c.Iteration // SGD counts no steps; any count > 0 keeps its momentum
	}
	return "", nil
}

// merge merges the collected slices by the weights' plan: the buffers,
// and the main params into m's weights.
func (o *optImport) merge(m *gpt.Model) error {
	params := map[string]*tensor.Tensor{}
	for _, p := range m.Params() {
		params[p.Name] = p
	}
	slicesOf := func(s *source, sl []*torchpt.Tensor, what string) error {
		if len(sl) == 0 || slices.Contains(sl, nil) {
			return fmt.Errorf("%s: %s: its %s is missing on some tensor-parallel rank", s.file, s.from, what)
		}
		return nil
	}
	o.res.Buffers = map[string][]float32{}
	for _, s := range o.conv.plan {
		for _, kind := range o.kinds {
			if err := slicesOf(s, o.bufs[s][kind], kind); err != nil {
				return err
			}
			ms := *s
			ms.slices, ms.addOne = o.bufs[s][kind], false // moments of w are those of 1 + w
			dst := make([]float32, params[s.name].Numel())
			if err := ms.merge(dst, params[s.name].Shape()); err != nil {
				return err
			}
			o.res.Buffers[kind+"/"+s.name] = dst
		}
		if len(o.mains[s]) > 0 { // none: an fp32 parameter (or FP32Optimizer)
			if err := slicesOf(s, o.mains[s], "fp32 main param"); err != nil {
				return err
			}
			ms := *s
			ms.slices = o.mains[s]
			if err := ms.fill(params[s.name]); err != nil {
				return err
			}
			o.res.MainParams = true
		}
	}
	if t := o.conv.tied; t != nil && o.tiedSeparate {
		for _, kind := range o.kinds {
			if err := slicesOf(t, o.bufs[t][kind], kind); err != nil {
				return err
			}
			ms := *t
			ms.slices, ms.addOne = o.bufs[t][kind], false
			d, err := maxDiff(&ms, o.res.Buffers[kind+"/embedding.word_embeddings.weight"])
			if err != nil {
				return err
			}
			if d != 0 {
				o.res.tiedDiff = fmt.Sprintf("tied embeddings: the last pipeline stage's %s of output_layer.weight differs from the word embeddings' by up to %g; using the word embeddings'", kind, d)
			}
		}
	}
	return nil
}

type chunkKey struct {
	chunk int
	key   string
}

// precision names the 16-bit type of the rank's parameters.
func precision(lp []localParam) string {
	for _, p := range lp {
		switch p.weight.DType() {
		case safetensors.BF16:
			return "bf16"
		case safetensors.F16:
			return "fp16"
		}
	}
	return "fp32"
}

// readRankOptimizer reads a rank file's optimizer section: Megatron's
// Float16OptimizerWithFloat16Params ({optimizer, grad_scaler,
// fp32_from_fp16_params}) or FP32Optimizer (the torch optimizer's own
// state dict).
func readRankOptimizer(f *torchpt.File) (*rankOptimizer, string, error) {
	sd, _ := stateDict(f)
	v, ok := sd.Get("optimizer")
	if !ok || v == nil {
		return nil, fmt.Sprintf("%s holds no optimizer state (other ranks do)", f.Path), nil
	}
	ro := &rankOptimizer{file: f}
	var inner *torchpt.Dict
	switch x := v.(type) {
	case *torchpt.List:
		return nil, fmt.Sprintf("%s: the optimizer section is a list of %d state dicts (Megatron's ChainedOptimizer): not supported", f.Path, len(x.Items)), nil
	case *torchpt.Dict:
		if o, ok := x.Get("optimizer"); ok {
			ro.wrapper = "Float16OptimizerWithFloat16Params"
			if inner, ok = o.(*torchpt.Dict); !ok {
				return nil, "", fmt.Errorf("%s: optimizer.optimizer is a %T, not a torch optimizer state dict", f.Path, o)
			}
			if s, ok := x.Get("grad_scaler"); ok && s != nil {
				if ro.scaler, ok = s.(*torchpt.Dict); !ok {
					return nil, "", fmt.Errorf("%s: optimizer.grad_scaler is a %T, not a dict", f.Path, s)
				}
			}
			mv, ok := x.Get("fp32_from_fp16_params")
			if !ok {
				mv, ok = x.Get("fp32_from_fp16") // older Megatron
			}
			if !ok {
				if _, has := inner.Get("state"); !has {
					return nil, fmt.Sprintf("%s: the optimizer section holds no per-parameter state and no fp32 main params (the distributed optimizer's, whose state is in %s files? args.use_distributed_optimizer is not set)", f.Path, DistOptimFile), nil
				}
				return nil, "", fmt.Errorf("%s: the optimizer section (Float16OptimizerWithFloat16Params) has no fp32_from_fp16_params (keys %s)", f.Path, strings.Join(x.StringKeys(), ", "))
			}
			groups, ok := mv.(*torchpt.List)
			if !ok {
				return nil, "", fmt.Errorf("%s: optimizer.fp32_from_fp16_params is a %T, not a list", f.Path, mv)
			}
			for i, g := range groups.Items {
				gl, ok := g.(*torchpt.List)
				if !ok {
					return nil, "", fmt.Errorf("%s: optimizer.fp32_from_fp16_params[%d] is a %T, not a list of tensors", f.Path, i, g)
				}
				var ts []*torchpt.Tensor
				for j, t := range gl.Items {
					tt, ok := t.(*torchpt.Tensor)
					if !ok {
						return nil, "", fmt.Errorf("%s: optimizer.fp32_from_fp16_params[%d][%d] is a %T, not a tensor", f.Path, i, j, t)
					}
					ts = append(ts, tt)
				}
				ro.mains = append(ro.mains, ts)
			}
		} else {
			ro.wrapper, inner = "FP32Optimizer", x
		}
	default:
		return nil, "", fmt.Errorf("%s: the optimizer section is a %T, not a Megatron optimizer state dict", f.Path, v)
	}
	groups, err := paramGroups(f.Path, inner)
	if err != nil {
		return nil, "", err
	}
	for i, d := range groups {
		if _, ok := d.Get("params"); !ok {
			return nil, fmt.Sprintf("%s: optimizer param_groups[%d] lists no params: the distributed optimizer's state (kept in %s files), but args.use_distributed_optimizer is not set", f.Path, i, DistOptimFile), nil
		}
		ro.groups = append(ro.groups, d)
	}
	sv, ok := inner.Get("state")
	if !ok {
		return nil, "", fmt.Errorf("%s: the optimizer state dict has no state (keys %s)", f.Path, strings.Join(inner.StringKeys(), ", "))
	}
	if ro.state, ok = sv.(*torchpt.Dict); !ok {
		return nil, "", fmt.Errorf("%s: optimizer state is a %T, not a dict", f.Path, sv)
	}
	if ro.state.Len() == 0 {
		return nil, fmt.Sprintf("%s: the optimizer holds no per-parameter state (saved before its first step)", f.Path), nil
	}
	if ro.mains != nil && len(ro.mains) != len(ro.groups) {
		return nil, "", fmt.Errorf("%s: optimizer fp32_from_fp16_params has %d groups, param_groups %d", f.Path, len(ro.mains), len(ro.groups))
	}
	return ro, "", nil
}

// paramGroups returns the optimizer state dict's param_groups, each a
// dict; path names the file in errors.
func paramGroups(path string, inner *torchpt.Dict) ([]*torchpt.Dict, error) {
	pg, ok := inner.Get("param_groups")
	if !ok {
		return nil, fmt.Errorf("%s: the optimizer state dict has no param_groups (keys %s)", path, strings.Join(inner.StringKeys(), ", "))
	}
	gl, ok := pg.(*torchpt.List)
	if !ok {
		return nil, fmt.Errorf("%s: optimizer param_groups is a %T, not a list", path, pg)
	}
	groups := make([]*torchpt.Dict, len(gl.Items))
	for i, g := range gl.Items {
		if groups[i], ok = g.(*torchpt.Dict); !ok {
			return nil, fmt.Errorf("%s: optimizer param_groups[%d] is a %T, not a dict", path, i, g)
		}
	}
	return groups, nil
}

// groupDecoupled reports whether a param group has a learning rate of its
// own: --decoupled-lr's embedding and output layer (is_decoupled_lr, or
// at Megatron HEAD a group that does not follow the default schedule).
func groupDecoupled(g *torchpt.Dict) bool {
	if v, ok := g.Get("is_decoupled_lr"); ok && v == true {
		return true
	}
	v, ok := g.Get("default_config")
	return ok && v == false
}

// assigned is one optimizer index and the local parameter it is.
type assigned struct {
	index int64
	local int
}

// assignIndices maps each param group's indices to the rank's parameters:
// a group holds, in named_parameters() order, the parameters of its
// signature (Megatron's _get_param_groups), whatever the groups' order.
func assignIndices(ro *rankOptimizer, lp []localParam) ([][]assigned, string, error) {
	f := ro.file
	queues := map[groupSig][]int{}
	for i, p := range lp {
		queues[p.sig] = append(queues[p.sig], i)
	}
	seenSig := map[groupSig]int{}
	seenIdx := map[int64]bool{}
	out := make([][]assigned, len(ro.groups))
	for gi, g := range ro.groups {
		sig, why, err := groupSignature(f, gi, g)
		if err != nil || why != "" {
			return nil, why, err
		}
		if prev, dup := seenSig[sig]; dup {
			return nil, fmt.Sprintf("%s: optimizer param_groups[%d] and [%d] are both %s: which parameters each holds cannot be derived", f.Path, prev, gi, sig), nil
		}
		seenSig[sig] = gi
		pv, _ := g.Get("params")
		pl, ok := pv.(*torchpt.List)
		if !ok {
			return nil, "", fmt.Errorf("%s: optimizer param_groups[%d].params is a %T, not a list of indices", f.Path, gi, pv)
		}
		q := queues[sig]
		if len(pl.Items) != len(q) {
			return nil, "", fmt.Errorf("%s: optimizer param_groups[%d] (%s) holds %d parameters, but the rank's model has %d such parameters", f.Path, gi, sig, len(pl.Items), len(q))
		}
		for j, x := range pl.Items {
			idx, ok := x.(int64)
			if !ok || idx < 0 {
				return nil, "", fmt.Errorf("%s: optimizer param_groups[%d].params[%d] is %v, not an index", f.Path, gi, j, x)
			}
			if seenIdx[idx] {
				return nil, "", fmt.Errorf("%s: optimizer param_groups list index %d twice", f.Path, idx)
			}
			seenIdx[idx] = true
			out[gi] = append(out[gi], assigned{index: idx, local: q[j]})
		}
		delete(queues, sig)
	}
	for _, p := range lp { // a signature no group took, first in model order
		if q, ok := queues[p.sig]; ok {
			return nil, "", fmt.Errorf("%s: no optimizer param group holds the rank's %d %s parameters (%s, ...)", f.Path, len(q), p.sig, lp[q[0]].name())
		}
	}
	return out, "", nil
}

func (s groupSig) String() string {
	wd := "weight-decay"
	if s.noWD {
		wd = "no-weight-decay"
	}
	if s.decoupled {
		return wd + ", decoupled-learning-rate"
	}
	return wd
}

// groupSignature reads which parameters a param group holds from its
// Megatron keys (wd_mult, else weight_decay; is_decoupled_lr or
// default_config); other groupings are not derived.
func groupSignature(f *torchpt.File, gi int, g *torchpt.Dict) (groupSig, string, error) {
	num := func(k string) (float64, bool, error) {
		v, ok := g.Get(k)
		if !ok || v == nil {
			return 0, false, nil
		}
		switch x := v.(type) {
		case float64:
			return x, true, nil
		case int64:
			return float64(x), true, nil
		case bool:
			if x {
				return 1, true, nil
			}
			return 0, true, nil
		}
		return 0, false, fmt.Errorf("%s: optimizer param_groups[%d].%s is a %T, not a number", f.Path, gi, k, v)
	}
	var sig groupSig
	if v, ok, err := num("lr_mult"); err != nil {
		return sig, "", err
	} else if ok && v != 1 {
		return sig, fmt.Sprintf("%s: optimizer param_groups[%d] has lr_mult=%g (a --scale-lr-cond grouping): which parameters it holds cannot be derived", f.Path, gi, v), nil
	}
	if v, ok := g.Get("is_expert_parallel"); ok && v == true {
		return sig, fmt.Sprintf("%s: optimizer param_groups[%d] holds expert-parallel parameters: mixture of experts is not supported", f.Path, gi), nil
	}
	if wd, ok, err := num("wd_mult"); err != nil {
		return sig, "", err
	} else if ok {
		sig.noWD = wd == 0
	} else if wd, ok, err := num("weight_decay"); err != nil {
		return sig, "", err
	} else if ok {
		sig.noWD = wd == 0
	} else {
		return sig, "", fmt.Errorf("%s: optimizer param_groups[%d] has neither wd_mult nor weight_decay", f.Path, gi)
	}
	sig.decoupled = groupDecoupled(g)
	return sig, "", nil
}

// stepValue reads a step count: an int, a float or a scalar tensor.
func stepValue(v any) (int64, error) {
	var x float64
	switch s := v.(type) {
	case int64:
		x = float64(s)
	case float64:
		x = s
	case *big.Int:
		return 0, fmt.Errorf("%v is out of range", s)
	case *torchpt.Tensor:
		f, err := stepScalar(s)
		if err != nil {
			return 0, err
		}
		x = float64(f)
	default:
		return 0, fmt.Errorf("a %T, not a number", v)
	}
	if x < 0 || x != math.Trunc(x) || x > 1<<53 {
		return 0, fmt.Errorf("%v is not a step count", x)
	}
	return int64(x), nil
}

// checkMain checks that an fp32 main param rounds to the model's 16-bit
// weight, as Megatron's copy after every step leaves them: a main param
// taken for another parameter cannot pass.
func checkMain(at string, main, weight *torchpt.Tensor, blame string) error {
	mv, err := main.Float32s()
	if err != nil {
		return err
	}
	wv, err := weight.Float32s()
	if err != nil {
		return err
	}
	bf := weight.DType() == safetensors.BF16
	for i, x := range mv {
		r := half.Float16From(x).Float32()
		if bf {
			r = half.BFloat16From(x).Float32()
		}
		if r != wv[i] && !(r != r && wv[i] != wv[i]) {
			return fmt.Errorf("%s: element %d is %g, which rounds to %g, but the %s weight holds %g: %s", at, i, x, r, weight.DType(), wv[i], blame)
		}
	}
	return nil
}

// trainingState fills the scheduler, loss scaler, sample counts, FLOPs
// and seed from rank 0's file and args.
func (c *Checkpoint) trainingState(st *OptimizerState, ro *rankOptimizer) error {
	f := c.files[0][0]
	sd, _ := stateDict(f)
	v, ok := sd.Get("opt_param_scheduler")
	if !ok || v == nil {
		return fmt.Errorf("%s has optimizer state but no opt_param_scheduler", f.Path)
	}
	d, ok := v.(*torchpt.Dict)
	if !ok {
		return fmt.Errorf("%s: opt_param_scheduler is a %T, not a dict", f.Path, v)
	}
	get := func(k string) (any, error) {
		x, ok := d.Get(k)
		if !ok || x == nil {
			return nil, fmt.Errorf("%s: opt_param_scheduler has no %s (keys %s)", f.Path, k, strings.Join(d.StringKeys(), ", "))
		}
		return x, nil
	}
	float := func(k string) (float64, error) {
		x, err := get(k)
		if err != nil {
			return 0, err
		}
		switch n := x.(type) {
		case float64:
			return n, nil
		case int64:
			return float64(n), nil
		}
		return 0, fmt.Errorf("%s: opt_param_scheduler.%s is a %T, not a number", f.Path, k, x)
	}
	integer := func(k string) (int64, error) {
		x, err := float(k)
		if err != nil {
			return 0, err
		}
		if x != math.Trunc(x) || math.Abs(x) > 1<<62 {
			return 0, fmt.Errorf("%s: opt_param_scheduler.%s=%v is not a whole number", f.Path, k, x)
		}
		return int64(x), nil
	}
	str := func(k string) (string, error) {
		x, err := get(k)
		if err != nil {
			return "", err
		}
		s, ok := x.(string)
		if !ok {
			return "", fmt.Errorf("%s: opt_param_scheduler.%s is a %T, not a string", f.Path, k, x)
		}
		return s, nil
	}
	var errs []error
	s := &st.Scheduler
	var err error
	s.MaxLR, err = float("max_lr")
	errs = append(errs, err)
	s.LRWarmupSteps, err = float("lr_warmup_steps")
	errs = append(errs, err)
	s.NumSteps, err = integer("num_steps")
	errs = append(errs, err)
	ds, err := str("lr_decay_style")
	errs = append(errs, err)
	s.LRDecayStyle = optim.DecayStyle(ds)
	s.LRDecaySteps, err = integer("lr_decay_steps")
	errs = append(errs, err)
	s.MinLR, err = float("min_lr")
	errs = append(errs, err)
	s.StartWD, err = float("start_wd")
	errs = append(errs, err)
	s.EndWD, err = float("end_wd")
	errs = append(errs, err)
	ws, err := str("wd_incr_style")
	errs = append(errs, err)
	s.WDIncrStyle = optim.WDIncrStyle(ws)
	s.WDIncrSteps, err = integer("wd_incr_steps")
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if ro.scaler != nil {
		if sv, ok := ro.scaler.Get("scale"); ok && sv != nil {
			var ls optim.LossScalerState
			switch x := sv.(type) {
			case *torchpt.Tensor:
				v, err := stepScalar(x)
				if err != nil {
					return fmt.Errorf("%s: optimizer.grad_scaler.scale: %w", ro.file.Path, err)
				}
				ls.Scale = v
			case float64:
				ls.Scale = float32(x)
			default:
				return fmt.Errorf("%s: optimizer.grad_scaler.scale is a %T", ro.file.Path, sv)
			}
			for _, k := range []struct {
				name string
				dst  *int
			}{{"growth_tracker", &ls.GrowthTracker}, {"hysteresis_tracker", &ls.HysteresisTracker}} {
				x, _ := ro.scaler.Get(k.name)
				n, ok := x.(int64)
				if !ok || n < 0 || n > 1<<31 {
					return fmt.Errorf("%s: optimizer.grad_scaler.%s is %v, not a count", ro.file.Path, k.name, x)
				}
				*k.dst = int(n)
			}
			st.LossScaler = &ls
		}
	}
	if st.ConsumedTrainSamples, err = c.args.intOr("consumed_train_samples", 0); err != nil {
		return err
	}
	if st.SkippedTrainSamples, err = c.args.intOr("skipped_train_samples", 0); err != nil {
		return err
	}
	if st.ConsumedValidSamples, err = c.args.intOr("consumed_valid_samples", 0); err != nil {
		return err
	}
	if st.Seed, err = c.args.intOr("seed", 1234); err != nil {
		return err
	}
	if x, ok := sd.Get("num_floating_point_operations_so_far"); ok {
		switch n := x.(type) {
		case float64:
			st.FLOPs = n
		case int64:
			st.FLOPs = float64(n)
		}
	}
	return nil
}

// stepScalar reads a one-element tensor (a step count, a loss scale).
func stepScalar(t *torchpt.Tensor) (float32, error) {
	if t.Numel() != 1 {
		return 0, fmt.Errorf("a tensor of shape %v, not a scalar", t.Shape)
	}
	v, err := t.Float32s()
	if err != nil {
		return 0, err
	}
	return v[0], nil
}
