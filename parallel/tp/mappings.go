// Package tp is Megatron's tensor (and sequence) parallelism for gotron:
// the communication mappings as autograd functions on the tape (Megatron's
// megatron/core/tensor_parallel/mappings.py), vocab-parallel embedding and
// cross-entropy (tensor_parallel/layers.py's VocabParallelEmbedding,
// tensor_parallel/cross_entropy.py), and the split styles (Style, Shard) by
// which model/gpt's TPPlan cuts a plain GPT model's parameters across the
// tensor-parallel ranks (column-parallel QKV and fc1, row-parallel
// projection and fc2, vocab-parallel embedding and output layer).
//
// The collectives run inside tape functions, which have no error result:
// they run under the tape's context (tensor.Tape.Context) and record a
// failure on the tape (tensor.Tape.Fail), which Backward returns (or Err,
// after a forward-only pass on a tape from tensor.NewNoGradTape; a nil tape
// has nowhere to keep a failure and panics with it). Once a tape holds a
// failure the region's later collectives on it are skipped: the step is
// abandoned.
package tp

import (
	"context"
	"fmt"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Region is one tensor-parallel group seen from the tape: the mappings of
// Megatron's tensor_parallel/mappings.py as tape functions over Group.
type Region struct {
	Group comm.ProcessGroup
	// SequenceParallel (--sequence-parallel) shards activations outside the
	// tensor-parallel regions along the sequence dimension.
	SequenceParallel bool

	comm time.Duration // time spent in collectives
}

// CommTime is the total time this rank has spent in the region's
// collectives (the tensor-parallel communication cost of the steps so far).
func (r *Region) CommTime() time.Duration { return r.comm }

// collective runs f, a collective named op, under tp's context, adding its
// duration to CommTime, and records its failure on tp naming the op and the
// rank. It runs nothing when tp holds a failure already, and reports
// whether f ran and succeeded.
func (r *Region) collective(tp *tensor.Tape, op string, f func(ctx context.Context) error) bool {
	if tp.Err() != nil {
		return false
	}
	start := time.Now()
	err := f(tp.Context())
	r.comm += time.Since(start)
	if err != nil {
		tp.Fail(fmt.Errorf("tp: rank %d: %s over the tensor-parallel group: %w", r.Rank(), op, err))
		return false
	}
	return true
}

// Size is the tensor-parallel size; Rank this rank's index.
func (r *Region) Size() int { return r.Group.Size() }
func (r *Region) Rank() int { return r.Group.Rank() }

// allReduce reduces the contiguous tensor x in place over the group with
// red: on the device when the group offers comm.DeviceCollectives for x
// (comm/nccl on CUDA, comm.SimDevice on sim), else on host memory: x's own
// storage on the CPU, or a host copy (comm staging) copied back into x. A
// failure is recorded on tp.
func (r *Region) allReduce(tp *tensor.Tape, op string, x *tensor.Tensor, red comm.ReduceOp) {
	if r.Size() == 1 {
		return
	}
	if dc, ok := r.device(x); ok {
		r.collective(tp, op, func(ctx context.Context) error { return dc.AllReduceTensor(ctx, x, red) })
		return
	}
	buf := stageOut(x)
	if r.collective(tp, op, func(ctx context.Context) error { return r.Group.AllReduce(ctx, comm.Float32s(buf), red) }) {
		stageIn(x, buf)
	}
}

// device returns the group's DeviceCollectives when it works on every
// tensor of ts in place (off the CPU only: on the CPU the host collectives
// already work on the tensors' own storage).
func (r *Region) device(ts ...*tensor.Tensor) (comm.DeviceCollectives, bool) {
	if ts[0].Device() == tensor.CPU {
		return nil, false
	}
	return comm.DeviceOf(r.Group, ts...)
}

// Comm staging: collectives read and write host memory, so a tensor on a
// device crosses to the host before a collective and back after it, through
// the tensor package's explicit (counted) copies. On the CPU the
// collectives work on the tensors' own storage and nothing is copied.

// stageOut returns the values of x, which must be contiguous on the CPU,
// in host memory: x's own storage on the CPU, else a fresh host copy.
func stageOut(x *tensor.Tensor) []float32 {
	if x.Device() == tensor.CPU {
		return x.Float32s()
	}
	return tensor.ToHost(x).Float32s()
}

// hostBuffer returns host memory a collective may write x's values into:
// x's own storage on the CPU, else a fresh buffer for stageIn.
func hostBuffer(x *tensor.Tensor) []float32 {
	if x.Device() == tensor.CPU {
		return x.Float32s()
	}
	return make([]float32, x.Numel())
}

// stageIn copies buf, from stageOut(x) or hostBuffer(x), into x when x is
// on a device (on the CPU buf is x's storage already).
func stageIn(x *tensor.Tensor, buf []float32) {
	if x.Device() != tensor.CPU {
		tensor.Copy(x, tensor.FromFloat32(buf, len(buf)))
	}
}

// fn adapts two closures to tensor.Function.
type fn struct {
	fwd func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor
	bwd func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor
}

func (f fn) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor { return f.fwd(tp, in) }
func (f fn) Backward(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor { return f.bwd(tp, g) }

// clone returns a contiguous copy of x owned by tp.
func clone(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	out := tp.EmptyLike(x, x.Shape()...)
	tensor.Copy(out, x)
	return out
}

// CopyTo is Megatron's copy_to_tensor_model_parallel_region: identity
// forward, all-reduce of the gradient backward. It sits at the input of a
// column-parallel linear.
func (r *Region) CopyTo(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor { return []*tensor.Tensor{clone(tp, in[0])} },
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			d := clone(tp, g[0])
			r.allReduce(tp, "copy_to backward all_reduce", d, comm.Sum)
			return []*tensor.Tensor{d}
		},
	}, x)[0]
}

// ReduceFrom is reduce_from_tensor_model_parallel_region: all-reduce
// forward, identity backward. It sums a row-parallel linear's partial
// outputs.
func (r *Region) ReduceFrom(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			out := clone(tp, in[0])
			r.allReduce(tp, "reduce_from all_reduce", out, comm.Sum)
			return []*tensor.Tensor{out}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor { return []*tensor.Tensor{g[0]} },
	}, x)[0]
}

// GatherLast is gather_from_tensor_model_parallel_region: all-gather along
// the last dimension forward, keep this rank's slice backward.
func (r *Region) GatherLast(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.gatherDim(tp, in[0], in[0].NDim()-1, "gather_from")}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.sliceDim(tp, g[0], g[0].NDim()-1)}
		},
	}, x)[0]
}

// ScatterLast is scatter_to_tensor_model_parallel_region: keep this rank's
// slice of the last dimension forward, all-gather backward.
func (r *Region) ScatterLast(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.sliceDim(tp, in[0], in[0].NDim()-1)}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.gatherDim(tp, g[0], g[0].NDim()-1, "scatter_to backward all_gather")}
		},
	}, x)[0]
}

// GatherSeq is gather_from_sequence_parallel_region for gotron's (b, t, h)
// activations: all-gather of the sequence shards (dimension 1) forward,
// reduce-scatter backward.
func (r *Region) GatherSeq(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.gatherDim(tp, in[0], 1, "gather_from_sequence_parallel all_gather")}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.reduceScatterDim(tp, g[0], 1, "gather_from_sequence_parallel backward reduce_scatter")}
		},
	}, x)[0]
}

// ReduceScatterSeq is reduce_scatter_to_sequence_parallel_region: sum the
// ranks' partial (b, t, h) and keep this rank's sequence shard forward,
// all-gather backward.
func (r *Region) ReduceScatterSeq(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.reduceScatterDim(tp, in[0], 1, "reduce_scatter_to_sequence_parallel")}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.gatherDim(tp, g[0], 1, "reduce_scatter_to_sequence_parallel backward all_gather")}
		},
	}, x)[0]
}

// ScatterSeq is scatter_to_sequence_parallel_region: keep this rank's
// sequence shard forward, all-gather backward.
func (r *Region) ScatterSeq(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if r.Size() == 1 {
		return x
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.sliceDim(tp, in[0], 1)}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{r.gatherDim(tp, g[0], 1, "scatter_to_sequence_parallel backward all_gather")}
		},
	}, x)[0]
}

// split3 views a contiguous tensor as (outer, n, inner) around dimension d.
func split3(shape []int, d int) (outer, n, inner int) {
	outer, inner = 1, 1
	for i, s := range shape {
		switch {
		case i < d:
			outer *= s
		case i > d:
			inner *= s
		}
	}
	return outer, shape[d], inner
}

// sliceDim returns this rank's 1/size slice of dimension d.
func (r *Region) sliceDim(tp *tensor.Tape, x *tensor.Tensor, d int) *tensor.Tensor {
	shape := x.Shape()
	n := shape[d]
	if n%r.Size() != 0 {
		panic(fmt.Sprintf("tp: dimension %d of %v does not divide by the tensor-parallel size %d", d, shape, r.Size()))
	}
	k := n / r.Size()
	oshape := append([]int(nil), shape...)
	oshape[d] = k
	out := tp.EmptyLike(x, oshape...)
	tensor.Copy(out, (*tensor.Tape)(nil).Narrow(x, d, r.Rank()*k, k))
	return out
}

// gatherDim all-gathers every rank's x along dimension d. The host slices
// are comm staging: the collective fills buf, which is then unpacked (on the
// host, into out's storage or a host buffer copied to out's device).
func (r *Region) gatherDim(tp *tensor.Tape, x *tensor.Tensor, d int, op string) *tensor.Tensor {
	shape := x.Shape()
	outer, k, inner := split3(shape, d)
	p := r.Size()
	oshape := append([]int(nil), shape...)
	oshape[d] = k * p
	if out, ok := r.gatherDimDevice(tp, x, oshape, outer, k*inner, op); ok {
		return out
	}
	buf := make([]float32, p*x.Numel()) // (p, outer, k, inner)
	r.collective(tp, op, func(ctx context.Context) error {
		return r.Group.AllGather(ctx, comm.Float32s(buf), comm.Float32s(stageOut(x.Contiguous())), nil)
	})
	out := tp.EmptyLike(x, oshape...)
	dst := hostBuffer(out)
	defer stageIn(out, dst)
	for q := range p {
		for o := range outer {
			copy(dst[(o*k*p+q*k)*inner:(o*k*p+(q+1)*k)*inner], buf[(q*outer+o)*k*inner:(q*outer+o+1)*k*inner])
		}
	}
	return out
}

// reduceScatterDim sums every rank's x and keeps this rank's 1/size slice of
// dimension d. The host slices are comm staging: x is packed rank-major
// for the collective, which writes out.
func (r *Region) reduceScatterDim(tp *tensor.Tape, x *tensor.Tensor, d int, op string) *tensor.Tensor {
	shape := x.Shape()
	outer, n, inner := split3(shape, d)
	p := r.Size()
	if n%p != 0 {
		panic(fmt.Sprintf("tp: dimension %d of %v does not divide by the tensor-parallel size %d", d, shape, p))
	}
	k := n / p
	oshape := append([]int(nil), shape...)
	oshape[d] = k
	if out, ok := r.reduceScatterDimDevice(tp, x, oshape, outer, k*inner, op); ok {
		return out
	}
	src := stageOut(x.Contiguous())
	packed := make([]float32, len(src)) // (p, outer, k, inner)
	for q := range p {
		for o := range outer {
			copy(packed[(q*outer+o)*k*inner:(q*outer+o+1)*k*inner], src[(o*n+q*k)*inner:(o*n+(q+1)*k)*inner])
		}
	}
	out := tp.EmptyLike(x, oshape...)
	dst := hostBuffer(out)
	r.collective(tp, op, func(ctx context.Context) error {
		return r.Group.ReduceScatter(ctx, comm.Float32s(dst), comm.Float32s(packed), comm.Sum, nil)
	})
	stageIn(out, dst)
	return out
}

// gatherDimDevice is gatherDim in place on the device, when the group
// offers DeviceCollectives for x: the ranks' x land rank-major in a
// (p, outer, block) tensor, which one device copy transposes into out's
// (outer, p, block) order (none when outer is 1). ok is false when the
// group refuses the tensors: stage through the host.
func (r *Region) gatherDimDevice(tp *tensor.Tape, x *tensor.Tensor, oshape []int, outer, block int, op string) (*tensor.Tensor, bool) {
	xc := x.Contiguous()
	if _, ok := r.device(xc); !ok {
		return nil, false
	}
	out := tp.EmptyLike(x, oshape...)
	p := r.Size()
	gathered := out
	if outer > 1 {
		gathered = tp.EmptyLike(x, p, outer, block)
	}
	dc, ok := r.device(xc, out, gathered)
	if !ok {
		return nil, false
	}
	if !r.collective(tp, op, func(ctx context.Context) error { return dc.AllGatherTensor(ctx, gathered.Reshape(-1), xc.Reshape(-1)) }) {
		return out, true
	}
	if outer > 1 {
		tensor.Copy(out.Reshape(outer, p, block), (*tensor.Tape)(nil).Transpose(gathered, 0, 1))
	}
	return out, true
}

// reduceScatterDimDevice is reduceScatterDim in place on the device: one
// device copy packs x's (outer, p, block) rank-major as (p, outer, block)
// (none when outer is 1) for the reduce-scatter into out.
func (r *Region) reduceScatterDimDevice(tp *tensor.Tape, x *tensor.Tensor, oshape []int, outer, block int, op string) (*tensor.Tensor, bool) {
	if _, ok := r.device(x.Contiguous()); !ok {
		return nil, false
	}
	p := r.Size()
	out := tp.EmptyLike(x, oshape...)
	var packed *tensor.Tensor
	if outer > 1 {
		packed = tp.EmptyLike(x, p, outer, block)
	} else {
		packed = x.Contiguous()
	}
	dc, ok := r.device(packed, out)
	if !ok {
		return nil, false
	}
	if outer > 1 {
		tensor.Copy(packed, (*tensor.Tape)(nil).Transpose(x.Contiguous().Reshape(outer, p, block), 0, 1))
	}
	r.collective(tp, op, func(ctx context.Context) error {
		return dc.ReduceScatterTensor(ctx, out.Reshape(-1), packed.Reshape(-1), comm.Sum)
	})
	return out, true
}
