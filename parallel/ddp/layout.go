// Package ddp is Megatron's DistributedDataParallel and distributed
// optimizer layout for gotron: every parameter's gradient lives in one flat
// float32 buffer, laid out in reverse order of registration (the order
// backward produces them), cut into buckets whose reductions start as soon
// as their last gradient is final (--overlap-grad-reduce), all-reduced over
// the data-parallel group or, with the distributed optimizer
// (--use-distributed-optimizer, ZeRO-1), reduce-scattered so that each rank
// steps only its contiguous shard of every bucket and all-gathers the
// updated parameters.
//
// Layout is the pure part (the layout walk of Megatron's
// megatron/core/distributed/param_and_grad_buffer.py, _ParamAndGradBuffer,
// and megatron/core/optimizer/distrib_optimizer.py,
// _compute_per_buffer_param_layout), tested by tables; DDP is the runtime
// that wires a model's parameters to the buffers and a process group.
package ddp

import "fmt"

// Megatron's layout constants.
const (
	// ParamAlign is the element multiple each parameter starts at under the
	// distributed optimizer.
	ParamAlign = 64
	// BucketAlign is the element multiple (times DP, by lcm) each bucket ends
	// at under the distributed optimizer.
	BucketAlign = 128
)

// DefaultBucketSize is Megatron's --ddp-bucket-size default with
// --overlap-grad-reduce: max(40,000,000, 1,000,000 × DP × CP) elements.
func DefaultBucketSize(dpcp int) int { return max(40_000_000, 1_000_000*dpcp) }

// ParamInfo describes one parameter for the layout, in registration order.
type ParamInfo struct {
	Name  string
	Numel int
	// SharedEmbedding marks the word embedding shared with the output layer
	// across pipeline stages: Megatron gives it a bucket of its own.
	SharedEmbedding bool
}

// LayoutConfig says how to cut the buffer.
type LayoutConfig struct {
	// BucketSize closes a bucket once it holds at least this many elements;
	// 0 means one bucket for the whole buffer (Megatron without
	// --overlap-grad-reduce).
	BucketSize int
	// DPSize is the number of ranks the distributed optimizer shards over
	// (only used with DistributedOptimizer); 0 means 1.
	DPSize int
	// DistributedOptimizer pads parameter starts to ParamAlign and bucket
	// ends to lcm(DPSize, BucketAlign) so every shard is equal.
	DistributedOptimizer bool
}

// Bucket is a contiguous range [Start, End) of the buffer and the params in it.
type Bucket struct {
	Start, End int
	// Params are indices into the ParamInfo list, in buffer order.
	Params []int
	// Unpadded is Megatron's numel_unpadded: the elements from Start to the
	// end of the last parameter, or, when the bucket was closed for the
	// shared embedding, to that parameter's (aligned) start; the rest up to
	// End is the bucket-end padding. The distributed optimizer's
	// distrib_optim.pt concatenates the buckets without that padding.
	Unpadded int
}

// Layout places every parameter in the flat buffer.
type Layout struct {
	// Range[i] is parameter i's [start, end) in the buffer.
	Range [][2]int
	// Buckets in buffer order (the order their reductions are issued).
	Buckets []Bucket
	// Total is the buffer length, padding included.
	Total int
}

// NewLayout walks params in reverse registration order as Megatron does:
// (distributed optimizer) round the cursor up to ParamAlign; the shared
// embedding first closes the open bucket; place the param; close the bucket
// when it reaches BucketSize elements, or after the shared embedding; close
// the last one. Closing pads the bucket end to lcm(DP, BucketAlign) under the
// distributed optimizer.
func NewLayout(params []ParamInfo, cfg LayoutConfig) (Layout, error) {
	dp := max(cfg.DPSize, 1)
	if cfg.BucketSize < 0 {
		return Layout{}, fmt.Errorf("ddp: --ddp-bucket-size=%d: want ≥ 0", cfg.BucketSize)
	}
	l := Layout{Range: make([][2]int, len(params))}
	pad := 1
	if cfg.DistributedOptimizer {
		pad = lcm(dp, BucketAlign)
	}
	cursor, start := 0, 0
	var open []int
	closeBucket := func() {
		if len(open) == 0 {
			return
		}
		end := roundUp(cursor, pad)
		l.Buckets = append(l.Buckets, Bucket{Start: start, End: end, Params: open, Unpadded: cursor - start})
		cursor, start, open = end, end, nil
	}
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		if p.Numel <= 0 {
			return Layout{}, fmt.Errorf("ddp: parameter %s has %d elements", p.Name, p.Numel)
		}
		if cfg.DistributedOptimizer {
			cursor = roundUp(cursor, ParamAlign)
		}
		if p.SharedEmbedding {
			closeBucket()
			if cfg.DistributedOptimizer {
				cursor = roundUp(cursor, ParamAlign)
			}
		}
		if len(open) == 0 {
			start = cursor
		}
		l.Range[i] = [2]int{cursor, cursor + p.Numel}
		cursor += p.Numel
		open = append(open, i)
		if p.SharedEmbedding || (cfg.BucketSize > 0 && cursor-start >= cfg.BucketSize) {
			closeBucket()
		}
	}
	closeBucket()
	l.Total = cursor
	return l, nil
}

// Shard returns DP rank d's owned range [lo, hi) of bucket b: the d-th of
// dp equal slices (bucket lengths divide by dp under the distributed
// optimizer's padding).
func (b Bucket) Shard(d, dp int) (lo, hi int) {
	n := (b.End - b.Start) / dp
	return b.Start + d*n, b.Start + (d+1)*n
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }
