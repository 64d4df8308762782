package megatron

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/parallel/ddp"
)

// The distributed optimizer (--use-distributed-optimizer) keeps each
// (tensor, pipeline) rank's parameter state in distrib_optim.pt beside its
// model_optim_rng.pt. The format read here is Megatron-LM's
// get_parameter_state_dp_zero (megatron/core/optimizer/distrib_optimizer.py),
// "buckets_coalesced" since Megatron commit 369e698d (2024-04-03), checked
// against commit d98e8a64 (2026-08-22):
//
//	{"buckets_coalesced": True,
//	 gbuf_index: {(param_dtype, grad_dtype): {"param": fp32[n], "exp_avg": fp32[n],
//	                                          "exp_avg_sq": fp32[n], "numel_unpadded": n}}}
//
// one gradient buffer per model chunk and parameter dtype (chunk by chunk),
// each buffer's buckets concatenated without their end padding. The layout
// inside a buffer is that of Megatron's DDP (package ddp): the chunk's
// parameters in reverse named_parameters() order, each start rounded up to
// 64 elements (since commit 5467bef3, 2024-07-01; the unaligned layout before
// it is accepted too, told apart by numel_unpadded), buckets of
// --ddp-bucket-size elements with --overlap-grad-reduce on the first chunk of
// the first pipeline stage only, the shared embedding (tied embeddings under
// pipeline parallelism) in a bucket of its own.

// DistOptimFile is the distributed optimizer's parameter state beside each
// rank's FileName.
const DistOptimFile = "distrib_optim.pt"

// distBuffer is one gradient buffer of a distrib_optim.pt.
type distBuffer struct {
	dtype    string // the param dtype of the key, "bfloat16"
	key      string // the key as written, for messages
	unpadded int64
	tensors  map[string]*torchpt.Tensor // "param" and the optimizer's kinds, 1-D, unpadded elements
}

// distArgs reads what args say about the distributed optimizer's buffers:
// the bucket sizes that Megatron's rules allow (0: one bucket).
func (o *optImport) distArgs() (string, error) {
	a, f0 := o.c.args, o.c.files[0][0].Path
	if o.res.Kind != "adamw" {
		return fmt.Sprintf("%s: args.optimizer=%s with the distributed optimizer: gotron reads the distributed optimizer's Adam state only", f0, o.res.Kind), nil
	}
	for _, flag := range []string{"use_megatron_fsdp", "use_torch_fsdp2", "use_layer_wise_distributed_optimizer", "use_precision_aware_optimizer"} {
		if on, err := a.boolOr(flag, false); err != nil {
			return "", err
		} else if on {
			return fmt.Sprintf("%s: args.%s=True: the distributed optimizer's state is then not in the layout gotron reads", f0, flag), nil
		}
	}
	if n, err := a.intOr("num_distributed_optimizer_instances", 1); err != nil {
		return "", err
	} else if n != 1 {
		return fmt.Sprintf("%s: args.num_distributed_optimizer_instances=%d: not supported (one instance)", f0, n), nil
	}
	if n, err := a.intOr("ddp_num_buckets", 0); err != nil {
		return "", err
	} else if n != 0 {
		return fmt.Sprintf("%s: args.ddp_num_buckets=%d: the bucket layout it gives is not derived (use --ddp-bucket-size)", f0, n), nil
	}
	overlap, err := a.boolOr("overlap_grad_reduce", false)
	if err != nil {
		return "", err
	}
	withStep, err := a.boolOr("overlap_param_gather_with_optimizer_step", false)
	if err != nil {
		return "", err
	}
	o.dp = 1
	if dp, err := a.intOr("data_parallel_size", 1); err != nil {
		return "", err
	} else if dp > 0 {
		o.dp = int(dp)
	}
	untie, err := a.boolOr("untie_embeddings_and_output_weights", false)
	if err != nil {
		return "", err
	}
	o.tiedEmb = !untie
	o.bucketSizes = []int{0}
	if overlap && !withStep {
		size, err := a.intOr("ddp_bucket_size", 0)
		if err != nil {
			return "", err
		}
		if size < 0 || size > 1<<50 {
			return "", fmt.Errorf("%s: args.ddp_bucket_size=%d", f0, size)
		}
		o.bucketSizes = []int{int(size)}
		if size == 0 { // Megatron's default: max(40M, 1M × the data-parallel size, with or without CP by version)
			cp, err := a.intOr("context_parallel_size", 1)
			if err != nil {
				return "", err
			}
			o.bucketSizes = []int{ddp.DefaultBucketSize(o.dp * int(max(cp, 1)))}
			if alt := ddp.DefaultBucketSize(o.dp); alt != o.bucketSizes[0] {
				o.bucketSizes = append(o.bucketSizes, alt)
			}
		}
	}
	return "", nil
}

// readDistSection reads a rank file's optimizer section as the distributed
// optimizer writes it: {optimizer: {param_groups (without params)},
// grad_scaler}; the per-parameter state is in distrib_optim.pt.
func readDistSection(f *torchpt.File) (*rankOptimizer, string, error) {
	sd, _ := stateDict(f)
	v, ok := sd.Get("optimizer")
	if !ok || v == nil {
		return nil, fmt.Sprintf("%s holds no optimizer state (other ranks do)", f.Path), nil
	}
	ro := &rankOptimizer{file: f, wrapper: "DistributedOptimizer"}
	var x *torchpt.Dict
	switch s := v.(type) {
	case *torchpt.List:
		return nil, fmt.Sprintf("%s: the optimizer section is a list of %d state dicts (Megatron's ChainedOptimizer): not supported", f.Path, len(s.Items)), nil
	case *torchpt.Dict:
		x = s
	default:
		return nil, "", fmt.Errorf("%s: the optimizer section is a %T, not a Megatron optimizer state dict", f.Path, v)
	}
	iv, ok := x.Get("optimizer")
	if !ok {
		return nil, "", fmt.Errorf("%s: the distributed optimizer's section has no optimizer entry (keys %s)", f.Path, strings.Join(x.StringKeys(), ", "))
	}
	inner, ok := iv.(*torchpt.Dict)
	if !ok {
		return nil, "", fmt.Errorf("%s: optimizer.optimizer is a %T, not a torch optimizer state dict", f.Path, iv)
	}
	if _, ok := x.Get("fp32_from_fp16_params"); ok {
		return nil, fmt.Sprintf("%s: args.use_distributed_optimizer=True, but the optimizer section is the non-distributed optimizer's (it holds fp32_from_fp16_params)", f.Path), nil
	}
	if s, ok := inner.Get("state"); ok {
		if d, ok := s.(*torchpt.Dict); !ok || d.Len() > 0 {
			return nil, fmt.Sprintf("%s: args.use_distributed_optimizer=True, but the optimizer section holds per-parameter state (the non-distributed optimizer's?)", f.Path), nil
		}
	}
	if s, ok := x.Get("grad_scaler"); ok && s != nil {
		if ro.scaler, ok = s.(*torchpt.Dict); !ok {
			return nil, "", fmt.Errorf("%s: optimizer.grad_scaler is a %T, not a dict", f.Path, s)
		}
	}
	groups, err := paramGroups(f.Path, inner)
	if err != nil {
		return nil, "", err
	}
	for i, d := range groups {
		if p, ok := d.Get("params"); ok {
			if l, ok := p.(*torchpt.List); !ok || len(l.Items) > 0 {
				return nil, fmt.Sprintf("%s: args.use_distributed_optimizer=True, but optimizer param_groups[%d] lists params (the non-distributed optimizer's section?)", f.Path, i), nil
			}
		}
		ro.groups = append(ro.groups, d)
	}
	if len(ro.groups) == 0 {
		return nil, "", fmt.Errorf("%s: the optimizer state dict has no param groups", f.Path)
	}
	return ro, "", nil
}

// readDistOptim opens and checks the distrib_optim.pt at path: the
// coalesced dp_zero layout, each buffer holding "param" and kinds as flat
// fp32 tensors of numel_unpadded elements. why says why it is not taken
// (another layout); err is a malformed file.
func readDistOptim(path string, kinds []string) (*torchpt.File, []distBuffer, string, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Sprintf("args.use_distributed_optimizer=True, but there is no %s (the distributed optimizer's state)", path), nil
	}
	f, err := torchpt.Open(path)
	if err != nil {
		if !strings.Contains(err.Error(), path) {
			err = fmt.Errorf("%s: %w", path, err)
		}
		return nil, nil, "", err
	}
	bufs, why, err := parseDistOptim(f, kinds)
	if err != nil || why != "" {
		f.Close()
		return nil, nil, why, err
	}
	return f, bufs, "", nil
}

func parseDistOptim(f *torchpt.File, kinds []string) ([]distBuffer, string, error) {
	path := f.Path
	var root *torchpt.Dict
	switch r := f.Root.(type) {
	case *torchpt.List:
		return nil, fmt.Sprintf("%s is a list of %d parameter states (Megatron's ChainedOptimizer over several optimizers): not supported", path, len(r.Items)), nil
	case *torchpt.Dict:
		root = r
	default:
		return nil, "", fmt.Errorf("%s holds a %T, not the distributed optimizer's parameter state (a dict)", path, f.Root)
	}
	if st, ok := root.Get("param_state_sharding_type"); ok {
		// The distributed checkpoint's wrapping of the same state.
		s, _ := st.(string)
		if s != "dp_zero_gather_scatter" {
			return nil, fmt.Sprintf("%s: param_state_sharding_type %v: gotron reads the dp_zero_gather_scatter layout (the torch format's) only", path, st), nil
		}
		// A missing param_state is reported below as a <nil>, not a dict.
		ps, _ := root.Get("param_state")
		if root, ok = ps.(*torchpt.Dict); !ok {
			return nil, "", fmt.Errorf("%s: param_state is a %T, not a dict", path, ps)
		}
	}
	bc, ok := root.Get("buckets_coalesced")
	if !ok {
		_, legacy := root.Get("per_bucket_numel")
		if b0, ok := root.Get(int64(0)); ok && !legacy {
			legacy = hasLists(b0)
		}
		if legacy {
			return nil, fmt.Sprintf("%s: per-bucket tensors without buckets_coalesced, the layout of Megatron before April 2024 (commit 369e698d): not supported (Megatron rewrites it with --ckpt-convert-update-legacy-dist-opt-format)", path), nil
		}
		return nil, "", fmt.Errorf("%s has no buckets_coalesced entry (keys %s): not the distributed optimizer's parameter state", path, keyList(root))
	}
	if bc != true {
		return nil, "", fmt.Errorf("%s: buckets_coalesced is %v, want True", path, bc)
	}
	var bufs []distBuffer
	for i, k := range root.Keys() {
		if k == "buckets_coalesced" {
			continue
		}
		g, ok := k.(int64)
		if !ok || g != int64(len(bufs)) {
			return nil, "", fmt.Errorf("%s: key %v: want the gradient buffer index %d", path, k, len(bufs))
		}
		at := fmt.Sprintf("%s: gradient buffer %d", path, g)
		d, ok := root.Values()[i].(*torchpt.Dict)
		if !ok {
			return nil, "", fmt.Errorf("%s is a %T, not a dict keyed by dtype", at, root.Values()[i])
		}
		if d.Len() != 1 {
			return nil, "", fmt.Errorf("%s holds %d dtypes (%s), want one", at, d.Len(), keyList(d))
		}
		b := distBuffer{tensors: map[string]*torchpt.Tensor{}}
		kt, ok := d.Keys()[0].(torchpt.Tuple)
		if !ok || len(kt) != 2 {
			return nil, "", fmt.Errorf("%s: dtype key %v: want (param_dtype, grad_dtype)", at, d.Keys()[0])
		}
		for _, x := range kt {
			if gl, ok := x.(*torchpt.Global); !ok || gl.Module != "torch" {
				return nil, "", fmt.Errorf("%s: dtype key %v: want (param_dtype, grad_dtype), torch dtypes", at, d.Keys()[0])
			}
		}
		b.dtype = kt[0].(*torchpt.Global).Name
		b.key = fmt.Sprintf("(%s, %s)", b.dtype, kt[1].(*torchpt.Global).Name)
		at += " " + b.key
		e, ok := d.Values()[0].(*torchpt.Dict)
		if !ok {
			return nil, "", fmt.Errorf("%s is a %T, not a dict of tensors", at, d.Values()[0])
		}
		// A missing entry is reported below as a <nil>, with the keys there are.
		nu, _ := e.Get("numel_unpadded")
		if b.unpadded, ok = nu.(int64); !ok || b.unpadded <= 0 {
			return nil, "", fmt.Errorf("%s: numel_unpadded is %v, want a positive element count (keys %s)", at, nu, keyList(e))
		}
		want := append([]string{"param"}, kinds...)
		for j, kk := range e.Keys() {
			ks, _ := kk.(string)
			if ks == "numel_unpadded" {
				continue
			}
			if !slices.Contains(want, ks) {
				if _, isT := e.Values()[j].(*torchpt.Tensor); isT {
					return nil, fmt.Sprintf("%s holds %v, which gotron's adamw does not keep", at, kk), nil
				}
				return nil, "", fmt.Errorf("%s: unexpected entry %v (a %T)", at, kk, e.Values()[j])
			}
		}
		for _, kind := range want {
			x, ok := e.Get(kind)
			if !ok {
				return nil, "", fmt.Errorf("%s has no %s (keys %s)", at, kind, keyList(e))
			}
			t, ok := x.(*torchpt.Tensor)
			if !ok {
				return nil, "", fmt.Errorf("%s: %s is a %T, not a tensor", at, kind, x)
			}
			if len(t.Shape) != 1 || t.Shape[0] != b.unpadded {
				return nil, "", fmt.Errorf("%s: %s has shape %v, want [%d] (numel_unpadded)", at, kind, t.Shape, b.unpadded)
			}
			if t.DType() != safetensors.F32 {
				return nil, "", fmt.Errorf("%s: %s is %v, want float32", at, kind, t.DType())
			}
			b.tensors[kind] = t
		}
		bufs = append(bufs, b)
	}
	if len(bufs) == 0 {
		return nil, "", fmt.Errorf("%s holds no gradient buffers", path)
	}
	return bufs, "", nil
}

// hasLists reports whether a buffer entry holds lists of tensors (the
// per-bucket layout before buckets_coalesced).
func hasLists(v any) bool {
	d, ok := v.(*torchpt.Dict)
	if !ok {
		return false
	}
	for _, x := range d.Values() {
		e, ok := x.(*torchpt.Dict)
		if !ok {
			continue
		}
		for _, y := range e.Values() {
			if _, ok := y.(*torchpt.List); ok {
				return true
			}
		}
	}
	return false
}

func keyList(d *torchpt.Dict) string {
	var ks []string
	for _, k := range d.Keys() {
		ks = append(ks, fmt.Sprint(k))
	}
	return strings.Join(ks, ", ")
}

// torchDType maps torch's dtype names to the weights' element types.
var torchDType = map[string]safetensors.DType{
	"float32": safetensors.F32, "float": safetensors.F32, "bfloat16": safetensors.BF16,
	"float16": safetensors.F16, "half": safetensors.F16,
}

// distBufferParams lists rank ri's gradient buffers as Megatron's DDP
// builds them: per model chunk (in order), one buffer per parameter dtype
// in order of first appearance, each the indices of its parameters in
// o.locals[ri] (named_parameters() order).
func (o *optImport) distBufferParams(ri int) [][]int {
	var out [][]int
	p := ri / o.c.TP
	for v := range o.c.VP {
		ci := v*o.c.PP + p
		var order []safetensors.DType
		by := map[safetensors.DType][]int{}
		for i, lp := range o.locals[ri] {
			if lp.src.chunk != ci {
				continue
			}
			dt := lp.weight.DType()
			if _, ok := by[dt]; !ok {
				order = append(order, dt)
			}
			by[dt] = append(by[dt], i)
		}
		for _, dt := range order {
			out = append(out, by[dt])
		}
	}
	return out
}

// sharedEmbedding reports whether Megatron gives the parameter a bucket of
// its own: with tied embeddings under pipeline parallelism, the word
// embedding of the first chunk (when it is not also the last) and the
// last chunk's copy of it.
func (o *optImport) sharedEmbedding(lp localParam) bool {
	if !o.tiedEmb || o.c.PP == 1 {
		return false
	}
	last := o.c.PP*o.c.VP - 1
	switch {
	case lp.tied:
		return lp.src.chunk == last && lp.src.chunk != 0
	case lp.src.key == "embedding.word_embeddings.weight":
		return lp.src.chunk == 0 && last != 0
	}
	return false
}

// distLayout places a buffer's parameters in its coalesced world tensors:
// the offset of each, trying the layouts Megatron's versions and args
// allow and keeping the one whose size is the file's numel_unpadded.
func (o *optImport) distLayout(at string, ri, chunk int, params []int, b distBuffer) ([]int64, string) {
	lps := o.locals[ri]
	infos := make([]ddp.ParamInfo, len(params))
	for k, i := range params {
		infos[k] = ddp.ParamInfo{Name: lps[i].name(), Numel: int(lps[i].weight.Numel()), SharedEmbedding: o.sharedEmbedding(lps[i])}
	}
	sizes := []int{0}
	if chunk == 0 { // bucketing: the first virtual chunk of the first pipeline stage only
		sizes = o.bucketSizes
	}
	var found []int64
	var tried []string
	for _, aligned := range []bool{true, false} {
		for _, size := range sizes {
			l, err := ddp.NewLayout(infos, ddp.LayoutConfig{BucketSize: size, DPSize: o.dp, DistributedOptimizer: aligned})
			if err != nil {
				return nil, fmt.Sprintf("%s: %v", at, err)
			}
			offs, total := coalesced(l, len(params))
			desc := "parameters 64-aligned"
			if !aligned {
				desc = "parameters unaligned (Megatron before July 2024)"
			}
			if size > 0 {
				desc += fmt.Sprintf(", buckets of %d elements", size)
			} else {
				desc += ", one bucket"
			}
			tried = append(tried, fmt.Sprintf("%d (%s)", total, desc))
			if total != b.unpadded {
				continue
			}
			if found != nil && !slices.Equal(found, offs) {
				return nil, fmt.Sprintf("%s: numel_unpadded %d fits more than one of Megatron's layouts (%s): which one was saved cannot be told", at, b.unpadded, strings.Join(tried, "; "))
			}
			found = offs
		}
	}
	if found == nil {
		return nil, fmt.Sprintf("%s holds %d elements (numel_unpadded), but Megatron's layout of the chunk's %d parameters gives %s: not a layout gotron derives from the model and args", at, b.unpadded, len(params), strings.Join(tried, "; "))
	}
	return found, ""
}

// coalesced maps a layout to the offsets of its parameters once each
// bucket's end padding is dropped and the buckets concatenated.
func coalesced(l ddp.Layout, n int) ([]int64, int64) {
	offs := make([]int64, n)
	var base int64
	for _, bk := range l.Buckets {
		for _, i := range bk.Params {
			offs[i] = base + int64(l.Range[i][0]-bk.Start)
		}
		base += int64(bk.Unpadded)
	}
	return offs, base
}

// view is elements [off, off+numel(shape)) of a 1-D tensor, in shape.
func view(t *torchpt.Tensor, off int64, shape []int64) (*torchpt.Tensor, error) {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if off < 0 || off+n > t.Shape[0] {
		return nil, fmt.Errorf("elements [%d, %d) past its %d", off, off+n, t.Shape[0])
	}
	s := t.Stride[0]
	stride := make([]int64, len(shape))
	acc := s
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = acc
		acc *= shape[i]
	}
	return &torchpt.Tensor{Storage: t.Storage, Offset: t.Offset + off*s, Shape: slices.Clone(shape), Stride: stride}, nil
}

// collectDist maps every rank's distrib_optim.pt buffers to its parameters
// and gathers their moments and main params, each main param checked
// against its weight; the step count comes from the param groups.
func (o *optImport) collectDist() (string, error) {
	for ri, ro := range o.ranks {
		for gi, g := range ro.groups {
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
		}
		path := filepath.Join(filepath.Dir(ro.file.Path), DistOptimFile)
		lps := o.locals[ri]
		groups := o.distBufferParams(ri)
		if len(groups) != len(ro.dist) {
			return fmt.Sprintf("%s holds %d gradient buffers, but the rank's %d model chunk(s) make %d (one per chunk and parameter dtype)", path, len(ro.dist), o.c.VP, len(groups)), nil
		}
		for g, params := range groups {
			b := ro.dist[g]
			at := fmt.Sprintf("%s: gradient buffer %d %s", path, g, b.key)
			wdt := lps[params[0]].weight.DType()
			if dt, ok := torchDType[b.dtype]; !ok || dt != wdt {
				return fmt.Sprintf("%s: its parameters are %v in %s", at, wdt, ro.file.Path), nil
			}
			offs, why := o.distLayout(at, ri, lps[params[0]].src.chunk, params, b)
			if why != "" {
				return why, nil
			}
			for k, i := range params {
				lp := lps[i]
				n := lp.weight.Numel()
				pat := fmt.Sprintf("%s, elements [%d, %d) (%s)", at, offs[k], offs[k]+n, lp.name())
				if o.bufs[lp.src] == nil {
					o.bufs[lp.src] = map[string][]*torchpt.Tensor{}
				}
				for _, kind := range append([]string{"param"}, o.kinds...) {
					vt, err := view(b.tensors[kind], offs[k], lp.weight.Shape)
					if err != nil {
						return "", fmt.Errorf("%s: %s: %w", pat, kind, err)
					}
					if kind == "param" {
						if err := checkDistParam(pat, vt, lp.weight); err != nil {
							return "", err
						}
						if dt := lp.weight.DType(); dt == safetensors.BF16 || dt == safetensors.F16 {
							if o.mains[lp.src] == nil {
								o.mains[lp.src] = make([]*torchpt.Tensor, o.c.TP)
							}
							o.mains[lp.src][lp.t] = vt
						}
						continue
					}
					if o.bufs[lp.src][kind] == nil {
						o.bufs[lp.src][kind] = make([]*torchpt.Tensor, o.c.TP)
					}
					o.bufs[lp.src][kind][lp.t] = vt
				}
			}
		}
	}
	return "", nil
}

// checkDistParam checks a parameter's slice of the buffer's "param"
// against the model's weight: a 16-bit weight is the rounding of its fp32
// main param, an fp32 weight is the parameter itself. A layout that put
// the parameters elsewhere cannot pass.
func checkDistParam(at string, main, weight *torchpt.Tensor) error {
	const blame = "the buffer layout does not place the parameters where this distrib_optim.pt has them"
	if weight.DType() != safetensors.F32 {
		return checkMain(at+": param", main, weight, blame)
	}
	mv, err := main.Float32s()
	if err != nil {
		return err
	}
	wv, err := weight.Float32s()
	if err != nil {
		return err
	}
	for i, x := range mv {
		if x != wv[i] && !(x != x && wv[i] != wv[i]) {
			return fmt.Errorf("%s: param: element %d is %g, but the fp32 weight holds %g: %s", at, i, x, wv[i], blame)
		}
	}
	return nil
}
