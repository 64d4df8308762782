package ddp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// Config is the gradient reduction of one data-parallel run. The zero value
// is Megatron's default: one bucket, reduced after backward, pre-scaled by
// 1/DP and summed.
type Config struct {
	// OverlapGradReduce (--overlap-grad-reduce) starts each bucket's
	// reduction while backward of the last micro-batch is still running.
	OverlapGradReduce bool
	// BucketSize (--ddp-bucket-size) in elements; 0 means
	// DefaultBucketSize(DP) with OverlapGradReduce and one bucket without.
	BucketSize int
	// DistributedOptimizer (--use-distributed-optimizer) reduce-scatters
	// gradients and keeps optimizer state for this rank's shard only.
	DistributedOptimizer bool
	// OverlapParamGather (--overlap-param-gather, distributed optimizer
	// only) starts the parameter all-gathers right after the optimizer step
	// and waits for them when the next forward begins.
	OverlapParamGather bool
	// AverageInCollective (--ddp-average-in-collective) reduces with Avg
	// instead of pre-scaling by 1/DP and summing.
	AverageInCollective bool
	// GradientScale, when not 0, replaces the pre-scale 1/DP (Megatron's
	// gradient_scaling_factor): an MoE model's expert buffers are reduced
	// over the expert-data-parallel group but scaled by 1/(DP·CP) of the
	// dense groups. It excludes AverageInCollective.
	GradientScale float32
	// Instances (--num-distributed-optimizer-instances > 1, distributed
	// optimizer only) is the group of the ranks holding this rank's shard
	// in the other distributed-optimizer instances (parallel.Groups'
	// InterDistOpt); the group New is given is then this rank's instance.
	// Each bucket is reduce-scattered over the instance and its shard
	// all-reduced over Instances, as Megatron's start_grad_sync: the sum
	// over every data-parallel rank, pre-scaled by 1/(both sizes). nil
	// means one instance.
	Instances comm.ProcessGroup
	// ReduceInBF16 (--grad-reduce-in-bf16) keeps the gradient buffer's
	// values in bfloat16, as Megatron's bfloat16 main_grad buffer when
	// accumulate_allreduce_grads_in_fp32 is off: the buffer is rounded to
	// bfloat16 after every micro-batch (EndMicrobatch), pre-scaled in
	// bfloat16, and reduced as bfloat16 (half the bytes on the wire); the
	// reduced values are widened to float32 for the optimizer. The
	// reduction's own rounding is the group's (comm: float32 accumulation
	// of the bfloat16 inputs, rounded once, within a machine; one rounding
	// per ring step across machines, as NCCL's ring). CPU buffers only.
	ReduceInBF16 bool
}

// DDP owns the flat gradient buffer of a model's parameters (and, with the
// distributed optimizer, the flat parameter buffer) and reduces it over the
// data-parallel group. The buffers live on the parameters' device. On the
// CPU the collectives work on the buffers themselves. On a device, a group
// that reduces device tensors in place (comm.DeviceCollectives: comm/nccl
// on CUDA) gets the buckets themselves; with any other group each bucket is
// staged through host buffers with the tensor package's explicit copies
// (copy out, communicate, copy back). Not safe for concurrent use: one
// training loop drives it.
type DDP struct {
	cfg   Config
	group comm.ProcessGroup
	async comm.Async
	// dc, when set, reduces and gathers the device buffers in place (no
	// host staging): the group's DeviceCollectives, off the CPU only.
	dc comm.DeviceCollectives
	// interDC is dc for cfg.Instances (set when dc is).
	interDC comm.DeviceCollectives
	params  []*tensor.Tensor
	Layout  Layout

	grad  *tensor.Tensor // flat gradients on the params' device (model Grad tensors are views)
	param *tensor.Tensor // flat parameters (distributed optimizer only)

	bucketGrad  []*tensor.Tensor     // per bucket: its view of grad
	bucketScale []*tensor.TensorList // per bucket: bucketGrad as a list, for tensor.ScaleList
	hostGrad    []*tensor.Tensor     // per bucket: what the collective reduces (bucketGrad itself on the CPU)

	bucketOf map[*tensor.Tensor]int
	waiting  []int         // per bucket: params whose gradient is not final yet
	handles  []comm.Handle // per bucket: its reduction in flight
	next     int           // first bucket not yet issued
	armed    bool          // this backward is the last micro-batch's
	ctx      context.Context
	early    int           // buckets the hook issued during the last backward
	waited   time.Duration // time Finish spent issuing and waiting, summed over steps

	// Distributed optimizer.
	gradShard   []*tensor.Tensor // per bucket: this rank's reduced gradient shard, on the device
	hostShard   []*tensor.Tensor // per bucket: the reduce-scatter's output (gradShard itself on the CPU)
	paramShard  []*tensor.Tensor // per bucket: this rank's shard of param
	paramBucket []*tensor.Tensor // per bucket: its view of param
	hostParam   []*tensor.Tensor // per bucket: the all-gather's output (paramBucket itself on the CPU)
	sendShard   []*tensor.Tensor // per bucket: host scratch for the parameter all-gather
	pieces      []piece          // this rank's shard, per parameter piece
	gathers     []comm.Handle
	gatherPend  bool

	// ReduceInBF16: per bucket, the bfloat16 values the collective
	// reduces (the whole bucket, or under the distributed optimizer the
	// input and this rank's output shard): in host memory for CPU
	// gradients; for device gradients wire16 and wireShard16 on the
	// device (the host slices then stage them when the group has no
	// device collectives), scale32 a float32 scratch of the largest
	// bucket for the pre-scale, round16 the whole buffer's bfloat16
	// rounding at the end of a micro-batch.
	wire, wireShard     [][]uint16
	wire16, wireShard16 []*tensor.Tensor
	scale32, round16    *tensor.Tensor
}

// piece is the part [Lo, Hi) (local indices) of parameter Param that lies in
// this rank's shard of bucket Bucket.
type piece struct {
	Param, Bucket, Lo, Hi int
}

// New lays out params (in registration order) and points every parameter's
// Grad at its slice of one flat buffer (and, with the distributed optimizer,
// moves its values into a flat parameter buffer). group is the
// data-parallel (× context-parallel) group; tied marks the word embedding
// shared with the output layer (or nil).
func New(params []*tensor.Tensor, group comm.ProcessGroup, cfg Config, tied *tensor.Tensor) (*DDP, error) {
	if cfg.OverlapParamGather && !cfg.DistributedOptimizer {
		return nil, errors.New("ddp: --overlap-param-gather needs --use-distributed-optimizer")
	}
	if cfg.GradientScale != 0 && cfg.AverageInCollective {
		return nil, errors.New("ddp: a gradient scale excludes --ddp-average-in-collective")
	}
	if cfg.Instances != nil && !cfg.DistributedOptimizer {
		return nil, errors.New("ddp: several distributed-optimizer instances need --use-distributed-optimizer")
	}
	instances := 1
	if cfg.Instances != nil {
		instances = cfg.Instances.Size()
	}
	bucket := cfg.BucketSize
	if bucket == 0 && cfg.OverlapGradReduce {
		bucket = DefaultBucketSize(group.Size() * instances)
	}
	infos := make([]ParamInfo, len(params))
	for i, p := range params {
		infos[i] = ParamInfo{Name: p.Name, Numel: p.Numel(), SharedEmbedding: p == tied && tied != nil}
	}
	l, err := NewLayout(infos, LayoutConfig{BucketSize: bucket, DPSize: group.Size(), DistributedOptimizer: cfg.DistributedOptimizer})
	if err != nil {
		return nil, err
	}
	dev := tensor.CPU
	for i, p := range params {
		if i == 0 {
			dev = p.Device()
		} else if p.Device() != dev {
			return nil, fmt.Errorf("ddp: parameter %s is on the %v device, %s on %v", p.Name, p.Device(), params[0].Name, dev)
		}
	}
	d := &DDP{cfg: cfg, group: group, async: asyncOf(group), params: params, Layout: l,
		grad: tensor.ZerosOn(dev, l.Total), bucketOf: map[*tensor.Tensor]int{},
		waiting: make([]int, len(l.Buckets)), handles: make([]comm.Handle, len(l.Buckets))}
	if cfg.DistributedOptimizer {
		d.param = tensor.ZerosOn(dev, l.Total)
	}
	if dev != tensor.CPU && group.Size() > 1 {
		if dc, ok := comm.DeviceOf(group, d.grad); ok && (d.param == nil || dc.DeviceTensor(d.param)) {
			d.dc = dc
		}
		if d.dc != nil && cfg.Instances != nil {
			// both levels on the device, or both staged through the host
			if d.interDC, _ = comm.DeviceOf(cfg.Instances, d.grad); d.interDC == nil {
				d.dc = nil
			}
		}
	}
	for b, bk := range l.Buckets {
		g := flatView(d.grad, bk.Start, bk.End-bk.Start)
		sl, err := tensor.NewTensorList(g)
		if err != nil {
			return nil, fmt.Errorf("ddp: bucket %d: %w", b, err)
		}
		d.bucketGrad, d.bucketScale, d.hostGrad = append(d.bucketGrad, g), append(d.bucketScale, sl), append(d.hostGrad, d.staging(g))
		if cfg.ReduceInBF16 {
			d.wire = append(d.wire, make([]uint16, bk.End-bk.Start))
			if d.onDevice() {
				d.wire16 = append(d.wire16, tensor.NewOn(d.grad.Device(), tensor.BFloat16, bk.End-bk.Start))
			}
		}
		for _, i := range bk.Params {
			p := params[i]
			r := l.Range[i]
			d.bucketOf[p] = b
			p.Grad = flatView(d.grad, r[0], r[1]-r[0]).Reshape(p.Shape()...)
			p.Grad.Name = p.Name + ".grad"
			if d.param != nil {
				if err := p.MoveInto(flatView(d.param, r[0], r[1]-r[0])); err != nil {
					return nil, fmt.Errorf("ddp: %w", err)
				}
			}
		}
	}
	if cfg.DistributedOptimizer {
		d.shard()
	}
	return d, nil
}

// flatView returns elements [off, off+n) of the 1-D tensor flat as a view
// (no autograd), on flat's device.
func flatView(flat *tensor.Tensor, off, n int) *tensor.Tensor {
	var noGrad *tensor.Tape
	return noGrad.Narrow(flat, 0, off, n)
}

// staging returns the host tensor a collective works on for x: x itself on
// the CPU or when the group works on device tensors in place, else a host
// buffer of x's size, to and from which toHost and fromHost copy (counted
// by the tensor package).
func (d *DDP) staging(x *tensor.Tensor) *tensor.Tensor {
	if x.Device() == tensor.CPU || d.dc != nil {
		return x
	}
	return tensor.Zeros(x.Shape()...)
}

// toHost copies x into its staging buffer h (nothing when h is x).
func toHost(h, x *tensor.Tensor) {
	if h != x {
		tensor.Copy(h, x)
	}
}

// fromHost copies the staging buffer h back into x (nothing when h is x).
func fromHost(x, h *tensor.Tensor) {
	if h != x {
		tensor.Copy(x, h)
	}
}

func asyncOf(g comm.ProcessGroup) comm.Async {
	if a, ok := g.(comm.Async); ok {
		return a
	}
	return comm.NewAsync(g)
}

// shard finds this rank's pieces of every bucket.
func (d *DDP) shard() {
	dp, me := d.group.Size(), d.group.Rank()
	for b, bk := range d.Layout.Buckets {
		lo, hi := bk.Shard(me, dp)
		gs := tensor.ZerosOn(d.grad.Device(), hi-lo)
		pb := flatView(d.param, bk.Start, bk.End-bk.Start)
		d.gradShard, d.hostShard = append(d.gradShard, gs), append(d.hostShard, d.staging(gs))
		if d.cfg.ReduceInBF16 {
			d.wireShard = append(d.wireShard, make([]uint16, hi-lo))
			if d.onDevice() {
				d.wireShard16 = append(d.wireShard16, tensor.NewOn(d.grad.Device(), tensor.BFloat16, hi-lo))
			}
		}
		d.paramShard, d.paramBucket = append(d.paramShard, flatView(d.param, lo, hi-lo)), append(d.paramBucket, pb)
		send := tensor.Zeros(hi - lo)
		if d.dc != nil {
			send = tensor.ZerosOn(d.param.Device(), hi-lo)
		}
		d.hostParam, d.sendShard = append(d.hostParam, d.staging(pb)), append(d.sendShard, send)
		for _, i := range bk.Params {
			r := d.Layout.Range[i]
			a, z := max(lo, r[0]), min(hi, r[1])
			if a < z {
				d.pieces = append(d.pieces, piece{Param: i, Bucket: b, Lo: a - r[0], Hi: z - r[0]})
			}
		}
	}
}

// Hook is the tape's gradient-ready hook (tensor.Tape.SetGradReadyHook):
// during the last micro-batch's backward (see StartLastMicrobatch) it issues
// each bucket's reduction, in bucket order, once all its gradients are final.
func (d *DDP) Hook(ready []*tensor.Tensor) {
	if !d.armed || !d.cfg.OverlapGradReduce {
		return
	}
	for _, p := range ready {
		if b, ok := d.bucketOf[p]; ok {
			d.waiting[b]--
		}
	}
	for d.next < len(d.waiting) && d.waiting[d.next] <= 0 {
		d.issue(d.next)
		d.next++
		d.early++
	}
}

// StartLastMicrobatch arms the hook for the backward that completes the
// gradients of this step. ctx governs the reductions it starts.
func (d *DDP) StartLastMicrobatch(ctx context.Context) {
	d.armed, d.ctx, d.next, d.early = true, ctx, 0, 0
	for b, bk := range d.Layout.Buckets {
		d.waiting[b] = len(bk.Params)
		d.handles[b] = nil
	}
}

// issue scales bucket b (on its device: Megatron's
// gradient_scaling_factor) and starts its reduction: in place on the device
// with DeviceCollectives (queued on the device, so its handle is done),
// else staged through the host off the CPU.
func (d *DDP) issue(b int) {
	if d.cfg.ReduceInBF16 {
		d.issueBF16(b)
		return
	}
	s, op := d.scale()
	if s != 1 {
		tensor.ScaleList(d.bucketScale[b], s)
	}
	if d.group.Size() == 1 {
		if d.cfg.DistributedOptimizer {
			tensor.Copy(d.gradShard[b], d.bucketGrad[b])
		}
		return
	}
	if d.dc != nil {
		var err error
		if d.cfg.DistributedOptimizer {
			err = d.dc.ReduceScatterTensor(d.ctx, d.gradShard[b], d.bucketGrad[b], op)
		} else {
			err = d.dc.AllReduceTensor(d.ctx, d.bucketGrad[b], op)
		}
		d.handles[b] = done{err}
		return
	}
	toHost(d.hostGrad[b], d.bucketGrad[b])
	g := comm.Float32s(d.hostGrad[b].Float32s())
	if d.cfg.DistributedOptimizer {
		d.handles[b] = d.async.ReduceScatterAsync(d.ctx, comm.Float32s(d.hostShard[b].Float32s()), g, op, nil)
	} else {
		d.handles[b] = d.async.AllReduceAsync(d.ctx, g, op)
	}
}

// scale is the pre-scale of a bucket before its reduction (1: none) and
// the reduction's op: Megatron's gradient_scaling_factor, or Avg in the
// collective.
func (d *DDP) scale() (float32, comm.ReduceOp) {
	switch n := d.group.Size() * d.instances(); {
	case d.cfg.GradientScale != 0:
		return d.cfg.GradientScale, comm.Sum
	case d.cfg.AverageInCollective:
		return 1, comm.Avg
	case n > 1:
		return 1 / float32(n), comm.Sum
	}
	return 1, comm.Sum
}

// onDevice reports whether the gradient buffer is off the CPU (the
// simulated device, a GPU).
func (d *DDP) onDevice() bool { return d.grad.Device() != tensor.CPU }

// issueBF16 is issue under ReduceInBF16 (CPU buffers): the bucket's
// accumulated gradient rounded to bfloat16, pre-scaled in bfloat16
// (Megatron scales its bfloat16 buffer in place), and reduced as bfloat16.
// Finish widens the result back into the float32 buffer.
func (d *DDP) issueBF16(b int) {
	if d.onDevice() {
		d.issueBF16Device(b)
		return
	}
	s, op := d.scale()
	g, w := d.bucketGrad[b].Float32s(), d.wire[b]
	for i, v := range g {
		h := tensor.Float32ToBFloat16(v)
		if s != 1 {
			h = tensor.Float32ToBFloat16(tensor.BFloat16ToFloat32(h) * s)
		}
		w[i] = h
	}
	switch {
	case d.group.Size() == 1 && d.cfg.DistributedOptimizer:
		copy(d.wireShard[b], w)
		d.handles[b] = done{}
	case d.group.Size() == 1:
		d.handles[b] = done{}
	case d.cfg.DistributedOptimizer:
		d.handles[b] = d.async.ReduceScatterAsync(d.ctx, comm.BFloat16s(d.wireShard[b]), comm.BFloat16s(w), op, nil)
	default:
		d.handles[b] = d.async.AllReduceAsync(d.ctx, comm.BFloat16s(w), op)
	}
}

// issueBF16Device is issueBF16 on device buffers, with the device's
// conversions (the same roundings: bfloat16(bfloat16(v)·s) in float32):
// in place with device collectives, else staged through the host's
// bfloat16 slices.
func (d *DDP) issueBF16Device(b int) {
	s, op := d.scale()
	g, w := d.bucketGrad[b], d.wire16[b]
	tensor.Convert(w, g)
	if s != 1 {
		n := g.Numel()
		if d.scale32 == nil {
			largest := 0
			for _, bk := range d.Layout.Buckets {
				largest = max(largest, bk.End-bk.Start)
			}
			d.scale32 = tensor.ZerosOn(g.Device(), largest)
		}
		tmp := flatView(d.scale32, 0, n)
		tensor.Convert(tmp, w)
		sl, err := tensor.NewTensorList(tmp)
		if err != nil {
			panic(fmt.Sprintf("ddp: %v", err))
		}
		tensor.ScaleList(sl, s)
		tensor.Convert(w, tmp)
	}
	switch {
	case d.group.Size() == 1 && d.cfg.DistributedOptimizer:
		tensor.Copy(d.wireShard16[b], w)
		d.handles[b] = done{}
	case d.group.Size() == 1:
		d.handles[b] = done{}
	case d.dc != nil && d.cfg.DistributedOptimizer:
		d.handles[b] = done{d.dc.ReduceScatterTensor(d.ctx, d.wireShard16[b], w, op)}
	case d.dc != nil:
		d.handles[b] = done{d.dc.AllReduceTensor(d.ctx, w, op)}
	default:
		h := tensor.New(tensor.BFloat16, w.Numel())
		tensor.Copy(h, w)
		copy(d.wire[b], h.Uint16s())
		if d.cfg.DistributedOptimizer {
			d.handles[b] = d.async.ReduceScatterAsync(d.ctx, comm.BFloat16s(d.wireShard[b]), comm.BFloat16s(d.wire[b]), op, nil)
		} else {
			d.handles[b] = d.async.AllReduceAsync(d.ctx, comm.BFloat16s(d.wire[b]), op)
		}
	}
}

// widenDevice widens bucket b's reduced bfloat16 values (staged in the
// host slice when the group has no device collectives) into the float32
// destination dst on the device.
func (d *DDP) widenDevice(dst, wire16 *tensor.Tensor, host []uint16) {
	if d.dc == nil && d.group.Size() > 1 {
		h := tensor.New(tensor.BFloat16, len(host))
		copy(h.Uint16s(), host)
		tensor.Copy(wire16, h)
	}
	tensor.Convert(dst, wire16)
}

// widen copies bfloat16 values into the float32 slice dst.
func widen(dst []float32, src []uint16) {
	for i, h := range src {
		dst[i] = tensor.BFloat16ToFloat32(h)
	}
}

// EndMicrobatch ends a micro-batch's backward: under ReduceInBF16 the
// gradient buffer is rounded to bfloat16, as Megatron's bfloat16 main_grad
// holds the running sum (Megatron rounds the micro-batch's own gradient
// to bfloat16 before adding it too; here it is added in float32, one
// rounding fewer). Nothing happens otherwise, or once the last
// micro-batch's reduction is armed: its buckets round as they are issued.
func (d *DDP) EndMicrobatch() {
	if !d.cfg.ReduceInBF16 || d.armed {
		return
	}
	if d.onDevice() {
		if d.round16 == nil {
			d.round16 = tensor.NewOn(d.grad.Device(), tensor.BFloat16, d.grad.Numel())
		}
		tensor.Convert(d.round16, d.grad)
		tensor.Convert(d.grad, d.round16)
		return
	}
	RoundBF16(d.grad.Float32s())
}

// RoundBF16Tensor rounds every value of the contiguous float32 tensor t
// to bfloat16 in place, on its device (through a bfloat16 copy there off
// the CPU).
func RoundBF16Tensor(t *tensor.Tensor) {
	if t.Device() == tensor.CPU {
		RoundBF16(t.Float32s())
		return
	}
	r := tensor.NewOn(t.Device(), tensor.BFloat16, t.Numel())
	tensor.Convert(r, t)
	tensor.Convert(t, r)
}

// RoundBF16 rounds every value of x to bfloat16 (round to nearest even),
// in place.
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = tensor.BFloat16ToFloat32(tensor.Float32ToBFloat16(v))
	}
}

// instances is the number of distributed-optimizer instances.
func (d *DDP) instances() int {
	if d.cfg.Instances == nil {
		return 1
	}
	return d.cfg.Instances.Size()
}

// reduceInstances all-reduces bucket b's reduced shard over the other
// distributed-optimizer instances (Megatron's inter-instance all-reduce).
func (d *DDP) reduceInstances(ctx context.Context, b int) error {
	op := comm.Sum
	if d.cfg.AverageInCollective {
		op = comm.Avg
	}
	if d.cfg.ReduceInBF16 && d.onDevice() {
		w := d.wireShard16[b]
		tensor.Convert(w, d.gradShard[b])
		if d.interDC != nil {
			if err := d.interDC.AllReduceTensor(ctx, w, op); err != nil {
				return err
			}
		} else {
			h := tensor.New(tensor.BFloat16, w.Numel())
			tensor.Copy(h, w)
			if err := d.cfg.Instances.AllReduce(ctx, comm.BFloat16s(h.Uint16s()), op); err != nil {
				return err
			}
			tensor.Copy(w, h)
		}
		tensor.Convert(d.gradShard[b], w)
		return nil
	}
	if d.interDC != nil {
		return d.interDC.AllReduceTensor(ctx, d.gradShard[b], op)
	}
	if d.cfg.ReduceInBF16 {
		w, g := d.wireShard[b], d.gradShard[b].Float32s()
		for i, v := range g {
			w[i] = tensor.Float32ToBFloat16(v)
		}
		if err := d.cfg.Instances.AllReduce(ctx, comm.BFloat16s(w), op); err != nil {
			return err
		}
		widen(g, w)
		return nil
	}
	toHost(d.hostShard[b], d.gradShard[b])
	if err := d.cfg.Instances.AllReduce(ctx, comm.Float32s(d.hostShard[b].Float32s()), op); err != nil {
		return err
	}
	fromHost(d.gradShard[b], d.hostShard[b])
	return nil
}

// Finish issues the buckets the hook did not and waits for every reduction:
// after it, each rank holds the data-parallel mean gradient (all of it, or
// its shard under the distributed optimizer). Errors name the bucket.
func (d *DDP) Finish(ctx context.Context) error {
	start := time.Now()
	defer func() { d.waited += time.Since(start) }()
	if !d.armed {
		d.StartLastMicrobatch(ctx)
	}
	for ; d.next < len(d.Layout.Buckets); d.next++ {
		d.issue(d.next)
	}
	d.armed = false
	var first error
	for b, h := range d.handles {
		d.handles[b] = nil
		if h != nil {
			if err := h.Wait(ctx); err != nil {
				if first == nil {
					first = fmt.Errorf("ddp: gradient reduction of bucket %d (%d elements): %w", b, d.Layout.Buckets[b].End-d.Layout.Buckets[b].Start, err)
				}
				continue
			}
			switch {
			case d.cfg.ReduceInBF16 && d.onDevice() && d.cfg.DistributedOptimizer:
				d.widenDevice(d.gradShard[b], d.wireShard16[b], d.wireShard[b])
			case d.cfg.ReduceInBF16 && d.onDevice():
				d.widenDevice(d.bucketGrad[b], d.wire16[b], d.wire[b])
			case d.cfg.ReduceInBF16 && d.cfg.DistributedOptimizer:
				widen(d.gradShard[b].Float32s(), d.wireShard[b])
			case d.cfg.ReduceInBF16:
				widen(d.bucketGrad[b].Float32s(), d.wire[b])
			case d.cfg.DistributedOptimizer:
				fromHost(d.gradShard[b], d.hostShard[b])
			default:
				fromHost(d.bucketGrad[b], d.hostGrad[b])
			}
		}
		if d.instances() > 1 && first == nil {
			if err := d.reduceInstances(ctx, b); err != nil {
				first = fmt.Errorf("ddp: gradient all-reduce of bucket %d across %d distributed-optimizer instances: %w", b, d.instances(), err)
			}
		}
	}
	return first
}

// EarlyBuckets is the number of buckets whose reduction the last step
// issued during backward, before Finish: the reductions that overlapped
// with computation.
func (d *DDP) EarlyBuckets() int { return d.early }

// SyncWait returns the total time Finish has spent since the DDP was made:
// the gradient reduction that backward did not hide (Megatron's
// all-grads-sync timer).
func (d *DDP) SyncWait() time.Duration { return d.waited }

// ZeroGrad clears the flat gradient buffer (padding included).
func (d *DDP) ZeroGrad() { tensor.Zero(d.grad) }

// ShardParams returns this rank's shard of every parameter as optimizer
// parameters (distributed optimizer only): Data is a view of the flat
// parameter buffer, Grad of the reduced gradient shard, on the parameters'
// device. Names are "<param>[lo:hi]"; weight decay follows Megatron's rule
// on the whole parameter.
func (d *DDP) ShardParams() []*optim.Param {
	var out []*optim.Param
	for _, pc := range d.pieces {
		p := d.params[pc.Param]
		r := d.Layout.Range[pc.Param]
		lo, _ := d.Layout.Buckets[pc.Bucket].Shard(d.group.Rank(), d.group.Size())
		out = append(out, &optim.Param{Name: fmt.Sprintf("%s[%d:%d]", p.Name, pc.Lo, pc.Hi),
			Data: flatView(d.param, r[0]+pc.Lo, pc.Hi-pc.Lo), Grad: flatView(d.gradShard[pc.Bucket], r[0]+pc.Lo-lo, pc.Hi-pc.Lo),
			NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape()), Dims: len(p.Shape())})
	}
	return out
}

// GatherParams all-gathers every bucket's updated shard into the flat
// parameter buffer (distributed optimizer only). With OverlapParamGather it
// only starts the gathers; WaitParams completes them.
func (d *DDP) GatherParams(ctx context.Context) error {
	if !d.cfg.DistributedOptimizer || d.group.Size() == 1 {
		return nil
	}
	d.gathers = d.gathers[:0]
	for b := range d.Layout.Buckets {
		// The shard is sent from a copy: the all-gather writes the bucket it is in.
		tensor.Copy(d.sendShard[b], d.paramShard[b])
		if d.dc != nil {
			d.gathers = append(d.gathers, done{d.dc.AllGatherTensor(ctx, d.paramBucket[b], d.sendShard[b])})
			continue
		}
		d.gathers = append(d.gathers, d.async.AllGatherAsync(ctx, comm.Float32s(d.hostParam[b].Float32s()), comm.Float32s(d.sendShard[b].Float32s()), nil))
	}
	d.gatherPend = true
	if d.cfg.OverlapParamGather {
		return nil
	}
	return d.WaitParams(ctx)
}

// WaitParams waits for the parameter all-gathers GatherParams started.
func (d *DDP) WaitParams(ctx context.Context) error {
	if !d.gatherPend {
		return nil
	}
	d.gatherPend = false
	var first error
	for b, h := range d.gathers {
		if err := h.Wait(ctx); err != nil {
			if first == nil {
				first = fmt.Errorf("ddp: parameter all-gather of bucket %d: %w", b, err)
			}
		} else {
			fromHost(d.paramBucket[b], d.hostParam[b])
		}
	}
	return first
}

// GradViews returns, for every parameter want selects, the gradient this
// rank holds after Finish: the whole gradient, or, with the distributed
// optimizer, its pieces in this rank's reduced shard. The views share the
// buffers' storage, on the parameters' device (for reductions over other
// groups, e.g. sequence-parallel norm gradients over the tensor-parallel
// group, which stage them through the host off the CPU).
func (d *DDP) GradViews(want func(*tensor.Tensor) bool) []*tensor.Tensor {
	var out []*tensor.Tensor
	if !d.cfg.DistributedOptimizer {
		for i, p := range d.params {
			if want(p) {
				r := d.Layout.Range[i]
				out = append(out, flatView(d.grad, r[0], r[1]-r[0]))
			}
		}
		return out
	}
	for _, pc := range d.pieces {
		if !want(d.params[pc.Param]) {
			continue
		}
		r := d.Layout.Range[pc.Param]
		lo, _ := d.Layout.Buckets[pc.Bucket].Shard(d.group.Rank(), d.group.Size())
		out = append(out, flatView(d.gradShard[pc.Bucket], r[0]+pc.Lo-lo, pc.Hi-pc.Lo))
	}
	return out
}

// done is the handle of a collective already queued on the device (or
// refused): Wait returns its error.
type done struct{ err error }

func (h done) Wait(context.Context) error { return h.err }
