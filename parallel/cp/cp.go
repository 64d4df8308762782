// Package cp is Megatron's context parallelism for gotron: the sequence of
// every micro-batch is cut into 2·C chunks and context-parallel rank r of C
// holds chunks r and 2C−1−r (Megatron's load balance for causal attention:
// every rank gets one early and one late chunk, so the same share of the
// causal triangle). Everything outside attention is per token and runs on
// the local chunks unchanged; attention runs here, over the CP group, as
// one of Megatron's (Transformer Engine's) --cp-comm-type schemes:
//
//   - P2P: ring attention. Key/value chunks travel the ring (send to r+1,
//     receive from r−1) while the block at hand is computed; blocks the
//     causal mask hides are skipped; partial outputs merge exactly through
//     their log-sum-exp; the backward pass runs the ring again with the
//     key/value gradients travelling beside the keys and values.
//   - AllGather: keys and values are all-gathered, each local query chunk
//     attends to the chunks before it; key/value gradients are
//     reduce-scattered back to their owners.
//   - A2A: Ulysses. An all-to-all trades the sequence split for a head
//     split (heads and query groups divisible by C), ordinary attention
//     runs over the whole sequence on H/C heads, and the inverse
//     all-to-all restores the sequence split.
//   - A2AP2P: hierarchical, C = A·P (--hierarchical-context-parallel-sizes
//     A P). An all-to-all within groups of A consecutive CP ranks splits
//     the heads A ways; the A ranks of group p then jointly hold the
//     coarse chunks p and 2P−1−p of a 2·P zigzag, and ring attention runs
//     over the P ranks that hold the same heads.
//
// The blocks are computed by the fused attention kernel with position
// offsets (tensor.AttentionConfig QPos, KPos, Accumulate), whose causal
// mask and dropout masks are keyed by sequence position: every scheme
// computes the same softmax as one rank over the whole sequence, up to
// float32 rounding of the association, and drops exactly the same
// attention probabilities (dropout on CP matches CP=1 bit for bit in its
// masks; Transformer Engine's CP draws its masks per rank and does not).
package cp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// CommType is --cp-comm-type: how attention communicates over the CP group.
type CommType int

const (
	// P2P is ring attention (Megatron's default, "p2p").
	P2P CommType = iota
	// AllGather gathers keys and values ("all_gather").
	AllGather
	// A2A is the Ulysses all-to-all over heads ("a2a").
	A2A
	// A2AP2P is hierarchical: a2a within groups of A ranks, then the ring
	// over P ("a2a+p2p", with --hierarchical-context-parallel-sizes A P).
	A2AP2P
)

// String returns the flag value of t.
func (t CommType) String() string {
	switch t {
	case P2P:
		return "p2p"
	case AllGather:
		return "all_gather"
	case A2A:
		return "a2a"
	case A2AP2P:
		return "a2a+p2p"
	}
	return fmt.Sprintf("CommType(%d)", int(t))
}

// ParseCommType parses a --cp-comm-type value.
func ParseCommType(s string) (CommType, error) {
	switch s {
	case "p2p", "":
		return P2P, nil
	case "all_gather":
		return AllGather, nil
	case "a2a":
		return A2A, nil
	case "a2a+p2p":
		return A2AP2P, nil
	}
	return 0, fmt.Errorf("cp: --cp-comm-type=%q: want p2p, all_gather, a2a or a2a+p2p", s)
}

// Check reports a configuration context parallelism of size C cannot run,
// naming the flags: the sequence must cut into 2·C equal chunks, and a2a
// splits the attention heads and query groups (of one tensor-parallel
// rank: heads/TP) over the C ranks.
func Check(size int, t CommType, seqLength, heads, queryGroups, tpSize int) error {
	switch {
	case size < 1:
		return fmt.Errorf("cp: --context-parallel-size=%d: want ≥ 1", size)
	case size == 1:
		return nil
	case seqLength%(2*size) != 0:
		return fmt.Errorf("cp: --seq-length=%d is not divisible by 2×--context-parallel-size = %d (each of the %d ranks holds 2 of %d equal chunks)",
			seqLength, 2*size, size, 2*size)
	case t == A2A && (heads/max(tpSize, 1))%size != 0:
		return fmt.Errorf("cp: --cp-comm-type=a2a: --num-attention-heads=%d / --tensor-model-parallel-size=%d = %d heads per rank are not divisible by --context-parallel-size=%d",
			heads, tpSize, heads/max(tpSize, 1), size)
	case t == A2A && (queryGroups/max(tpSize, 1))%size != 0:
		return fmt.Errorf("cp: --cp-comm-type=a2a: --num-query-groups=%d / --tensor-model-parallel-size=%d = %d query groups per rank are not divisible by --context-parallel-size=%d",
			queryGroups, tpSize, queryGroups/max(tpSize, 1), size)
	}
	return nil
}

// CheckHierarchical checks --hierarchical-context-parallel-sizes A P
// against --context-parallel-size and --cp-comm-type: a2a+p2p needs them,
// A·P must be C (Megatron's rule), and the a2a level splits the heads and
// query groups of a tensor-parallel rank A ways. nil sizes are unset.
func CheckHierarchical(sizes []int, size int, t CommType, heads, queryGroups, tpSize int) error {
	if len(sizes) == 0 {
		if t == A2AP2P && size > 1 {
			return fmt.Errorf("cp: --cp-comm-type=a2a+p2p needs --hierarchical-context-parallel-sizes A P (A·P = --context-parallel-size=%d)", size)
		}
		return nil
	}
	if len(sizes) != 2 {
		return fmt.Errorf("cp: --hierarchical-context-parallel-sizes=%s: want two sizes, A (a2a) and P (p2p)", joinInts(sizes))
	}
	prod := 1
	for _, s := range sizes {
		if s < 1 || s > 1<<20 {
			return fmt.Errorf("cp: --hierarchical-context-parallel-sizes=%s: want sizes from 1 to 2^20", joinInts(sizes))
		}
		prod *= s
	}
	a, tpHeads, tpGroups := sizes[0], heads/max(tpSize, 1), queryGroups/max(tpSize, 1)
	switch {
	case prod != size:
		return fmt.Errorf("cp: --hierarchical-context-parallel-sizes=%s multiply to %d, not --context-parallel-size=%d", joinInts(sizes), prod, size)
	case t != A2AP2P:
		return fmt.Errorf("cp: --hierarchical-context-parallel-sizes=%s needs --cp-comm-type a2a+p2p (got %v)", joinInts(sizes), t)
	case tpHeads%a != 0:
		return fmt.Errorf("cp: --cp-comm-type=a2a+p2p: %d heads per tensor-parallel rank (--num-attention-heads=%d) are not divisible by the a2a size %d (--hierarchical-context-parallel-sizes=%s)",
			tpHeads, heads, a, joinInts(sizes))
	case tpGroups%a != 0:
		return fmt.Errorf("cp: --cp-comm-type=a2a+p2p: %d query groups per tensor-parallel rank (--num-query-groups=%d) are not divisible by the a2a size %d (--hierarchical-context-parallel-sizes=%s)",
			tpGroups, queryGroups, a, joinInts(sizes))
	}
	return nil
}

// HierarchicalRanks returns, for CP rank rank of a group whose members
// have world ranks cpRanks (in CP-rank order), the world ranks of its a2a
// group (A consecutive CP ranks) and of its p2p ring (the P ranks at the
// same place in their a2a groups), for sizes A P.
func HierarchicalRanks(cpRanks []int, rank, a, p int) (a2a, ring []int, err error) {
	if a < 1 || p < 1 || a*p != len(cpRanks) || rank < 0 || rank >= len(cpRanks) {
		return nil, nil, fmt.Errorf("cp: hierarchical sizes %d×%d for CP rank %d of %d", a, p, rank, len(cpRanks))
	}
	grp, at := rank/a, rank%a
	a2a = append(a2a, cpRanks[grp*a:(grp+1)*a]...)
	for q := range p {
		ring = append(ring, cpRanks[q*a+at])
	}
	return a2a, ring, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, " ")
}

// Positions returns the sequence positions of the tokens CP rank rank of
// size holds, in their local order: chunk rank, then chunk 2·size−1−rank,
// each seqLen/(2·size) long (Megatron's get_batch_on_this_cp_rank; CP=4,
// seqLen 16: rank 1 holds [2 3 12 13]).
func Positions(seqLen, size, rank int) ([]int, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("cp: rank %d of %d", rank, size)
	}
	if seqLen <= 0 || seqLen%(2*size) != 0 {
		return nil, fmt.Errorf("cp: sequence length %d is not a positive multiple of 2×%d", seqLen, size)
	}
	c := seqLen / (2 * size)
	out := make([]int, 0, 2*c)
	for _, id := range []int{rank, 2*size - 1 - rank} {
		for i := range c {
			out = append(out, id*c+i)
		}
	}
	return out, nil
}

// Attention is attention over a context-parallel group: q, k, v hold this
// rank's two chunks of the sequence (in Positions' order), and the result
// is this rank's rows of the whole sequence's attention.
type Attention struct {
	Group comm.ProcessGroup
	Comm  CommType
	// A2AGroup and RingGroup are the two levels of A2AP2P
	// (HierarchicalRanks): a2a within A2AGroup, the ring over RingGroup.
	A2AGroup, RingGroup comm.ProcessGroup

	comm      time.Duration // time spent waiting for communication
	exchanged time.Duration // duration of the overlapped ring exchanges
	// exchangeWait is the part of comm spent waiting for them
	exchangeWait time.Duration
}

// CommWait is the time this rank has waited for context-parallel
// communication (the part not hidden behind compute).
func (a *Attention) CommWait() time.Duration { return a.comm }

// Overlap reports the ring's overlapped key/value exchanges (p2p and
// a2a+p2p) on this rank: their total duration, start to finish, and the
// time this rank waited for them after its compute; the share of the
// exchange hidden behind compute is 1 − waited/exchanged.
func (a *Attention) Overlap() (exchanged, waited time.Duration) { return a.exchanged, a.exchangeWait }

// Attention returns the attention of the local queries q (b, 2c, hq, d)
// over the whole sequence's keys and values, of which k, v (b, 2c, hkv, d)
// are the local chunks, as tensor.Tape.Attention would over the whole
// sequence. o.Causal, Scale, Dropout, RNG and FirstHead are honoured;
// o.DocIDs are not supported (context parallelism cuts the sequence, not
// documents). Communication failures are recorded on tp.
func (a *Attention) Attention(tp *tensor.Tape, q, k, v *tensor.Tensor, o tensor.AttentionOptions) *tensor.Tensor {
	if a.Group.Size() == 1 {
		return tp.Attention(q, k, v, o)
	}
	cfg := tensor.AttentionConfig{Scale: o.Scale, Causal: o.Causal, FirstHead: o.FirstHead, Precision: tp.MatmulPrecision()}
	if o.DocIDs != nil {
		tp.Fail(fmt.Errorf("cp: attention with document masks (--reset-attention-mask) under context parallelism is not supported"))
	}
	if o.Dropout != 0 {
		if o.RNG == nil {
			panic("cp: Attention with Dropout needs an RNG")
		}
		// one draw per call, as Tape.Attention: the masks' key
		cfg.Dropout, cfg.DropoutSeed = o.Dropout, o.RNG.Uint64()
	}
	if q.Dim(1)%2 != 0 {
		panic(fmt.Sprintf("cp: local sequence of %d tokens is not two chunks", q.Dim(1)))
	}
	var f tensor.Function
	switch a.Comm {
	case AllGather:
		f = &gatherCall{a: a, cfg: cfg}
	case A2A:
		f = &a2aCall{a: a, cfg: cfg}
	case A2AP2P:
		if a.A2AGroup == nil || a.RingGroup == nil || a.A2AGroup.Size()*a.RingGroup.Size() != a.Group.Size() {
			panic("cp: a2a+p2p attention needs A2AGroup and RingGroup whose sizes multiply to the CP size")
		}
		f = &hierCall{a: a, cfg: cfg}
	default:
		f = &ringCall{a: a, cfg: cfg}
	}
	return tp.Apply(f, tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(v))[0]
}

// wait runs f, a communication named op, under tp's context, adds its
// duration to the wait time, and records its failure on tp. It runs
// nothing once tp holds a failure, and reports whether f succeeded.
func (a *Attention) wait(tp *tensor.Tape, op string, f func(ctx context.Context) error) bool {
	if tp.Err() != nil {
		return false
	}
	start := time.Now()
	err := f(tp.Context())
	a.comm += time.Since(start)
	if err != nil {
		tp.Fail(fmt.Errorf("cp: rank %d: %s over the context-parallel group: %w", a.Group.Rank(), op, err))
		return false
	}
	return true
}

// device returns the group's DeviceCollectives when it works on every
// tensor of ts in place (comm/nccl on CUDA, comm.SimDevice on sim; never on
// the CPU, where the host collectives use the tensors' own storage).
func (a *Attention) device(ts ...*tensor.Tensor) (comm.DeviceCollectives, bool) {
	if ts[0].Device() == tensor.CPU {
		return nil, false
	}
	return comm.DeviceOf(a.Group, ts...)
}

// Host staging, as parallel/tp's: collectives work on host memory, when
// the group has no DeviceCollectives for the tensors.

func stageOut(x *tensor.Tensor) []float32 {
	if x.Device() == tensor.CPU {
		return x.Float32s()
	}
	return tensor.ToHost(x).Float32s()
}

func hostBuffer(x *tensor.Tensor) []float32 {
	if x.Device() == tensor.CPU {
		return x.Float32s()
	}
	return make([]float32, x.Numel())
}

func stageIn(x *tensor.Tensor, buf []float32) {
	if x.Device() != tensor.CPU {
		tensor.Copy(x, tensor.FromFloat32(buf, len(buf)))
	}
}

// geometry is one call's shapes: b rows, chunks of c tokens, hq query and
// hkv key/value heads of d.
type geometry struct{ b, c, hq, hkv, d int }

func geometryOf(q, k *tensor.Tensor) geometry {
	return geometry{b: q.Dim(0), c: q.Dim(1) / 2, hq: q.Dim(2), hkv: k.Dim(2), d: q.Dim(3)}
}

// chunk returns a contiguous copy of chunk i (c tokens) of x (b, 2c, h, d).
func chunk(x *tensor.Tensor, i, c int) *tensor.Tensor {
	var nt *tensor.Tape
	out := tensor.NewOn(x.Device(), tensor.Float32, x.Dim(0), c, x.Dim(2), x.Dim(3))
	tensor.Copy(out, nt.Narrow(x, 1, i*c, c))
	return out
}

// packed is a flat buffer holding several (b, c, h, d) tensors back to back
// (a rank's key and value chunks, or their gradients): one message.
type packed struct {
	flat  *tensor.Tensor
	parts []*tensor.Tensor
}

// newPacked allocates n zeroed parts of shape on dev.
func newPacked(dev tensor.Device, n int, shape ...int) *packed {
	size := 1
	for _, s := range shape {
		size *= s
	}
	p := &packed{flat: tensor.ZerosOn(dev, n*size)}
	var nt *tensor.Tape
	for i := range n {
		p.parts = append(p.parts, nt.Narrow(p.flat, 0, i*size, size).Reshape(shape...))
	}
	return p
}

// Dropout is tensor.Tape.Dropout of x (b, 2c, h), this rank's tokens, with
// this rank's rows of the mask the whole sequence (b, 2C·c, h) draws from
// rng, which advances as for the whole sequence: dropout under context
// parallelism drops what one rank drops (Megatron's CP ranks each draw
// their local shape from the same stream instead).
func (a *Attention) Dropout(tp *tensor.Tape, x *tensor.Tensor, p float32, rng *tensor.RNG) *tensor.Tensor {
	size, rank := a.Group.Size(), a.Group.Rank()
	if p == 0 || size == 1 {
		return tp.Dropout(x, p, rng)
	}
	b, c, h := x.Dim(0), x.Dim(1)/2, x.Dim(2)
	ones := make([]float32, b*2*size*c*h)
	for i := range ones {
		ones[i] = 1
	}
	mask := tp.Dropout(tensor.FromFloat32(ones, b, 2*size*c, h).ToDevice(x.Device()), p, rng) // 0 or 1/(1-p)
	local := tp.Concat(1, tp.Narrow(mask, 1, rank*c, c), tp.Narrow(mask, 1, (2*size-1-rank)*c, c))
	return tp.Mul(x, local)
}
