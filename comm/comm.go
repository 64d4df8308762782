package comm

import "context"

// ReduceOp is the elementwise reduction of AllReduce, ReduceScatter and Reduce.
type ReduceOp int

const (
	// Sum adds. BFloat16 sums are accumulated in float32 and rounded to
	// nearest even when stored; integer sums wrap on overflow.
	Sum ReduceOp = iota
	// Avg is Sum divided by the group size. Integer averages truncate toward
	// zero (Go's integer division).
	Avg
	// Max keeps the largest element.
	Max
	// Min keeps the smallest element.
	Min
)

// String returns the op's lower-case name ("sum", "avg", "max", "min").
func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	case Min:
		return "min"
	}
	return "ReduceOp(" + itoa(int(op)) + ")"
}

// Valid reports whether op is one of Sum, Avg, Max, Min.
func (op ReduceOp) Valid() bool { return op >= Sum && op <= Min }

// Operation names used in errors (torch.distributed's names).
const (
	OpAllReduce     = "all_reduce"
	OpReduceScatter = "reduce_scatter"
	OpAllGather     = "all_gather"
	OpBroadcast     = "broadcast"
	OpReduce        = "reduce"
	OpAllToAll      = "all_to_all"
	OpBarrier       = "barrier"
	OpSend          = "send"
	OpRecv          = "recv"
	OpNewGroup      = "new_group"
)

// ProcessGroup is a set of ranks that communicate. Every method that
// communicates takes ctx first and blocks until this rank's part is done.
//
// Counts arguments give per-rank element counts; nil means an even split
// (the total must then divide by Size()). All ranks must pass equal counts.
type ProcessGroup interface {
	// Rank is this process's rank in the group, 0..Size()-1.
	Rank() int
	// Size is the number of ranks in the group.
	Size() int

	// AllReduce replaces buf on every rank with the reduction of all ranks' buf.
	AllReduce(ctx context.Context, buf Buffer, op ReduceOp) error
	// ReduceScatter reduces all ranks' in (length sum(counts)) and leaves
	// block r (counts[r] elements at offset sum(counts[:r])) in out on rank r.
	ReduceScatter(ctx context.Context, out, in Buffer, op ReduceOp, counts []int) error
	// AllGather concatenates every rank's in (counts[r] elements from rank r)
	// into out (sum(counts) elements) on every rank.
	AllGather(ctx context.Context, out, in Buffer, counts []int) error
	// Broadcast copies root's buf into buf on every rank.
	Broadcast(ctx context.Context, buf Buffer, root int) error
	// Reduce leaves the reduction of all ranks' buf in root's buf. Other
	// ranks' buf is left unchanged.
	Reduce(ctx context.Context, buf Buffer, op ReduceOp, root int) error
	// AllToAll sends in's block j (sendCounts[j] elements) to rank j and
	// receives rank j's block for this rank into out's block j
	// (recvCounts[j] elements). sendCounts[j] on rank i must equal
	// recvCounts[i] on rank j. nil counts mean an even split.
	AllToAll(ctx context.Context, out, in Buffer, sendCounts, recvCounts []int) error
	// Barrier returns when every rank has called it.
	Barrier(ctx context.Context) error
	// Send sends buf to rank peer, which must call Recv with a buffer of the
	// same dtype and length. Messages between a pair arrive in order.
	Send(ctx context.Context, buf Buffer, peer int) error
	// Recv receives into buf the next message from rank peer.
	Recv(ctx context.Context, buf Buffer, peer int) error

	// NewGroup returns a sub-group of the ranks listed, given as ranks of
	// the world (the group every backend starts with), in group-rank order:
	// ranks[i] becomes rank i of the new group. Every listed rank must call
	// NewGroup with the same list; the k-th call with a given list on each
	// member makes the same group, so several groups with the same or
	// different members may be alive at once, each with its own ordering.
	// A caller not in ranks gets ErrNotMember. NewGroup does not
	// communicate and does not block.
	NewGroup(ranks []int) (ProcessGroup, error)
}

// Handle is the pending result of an asynchronous collective.
type Handle interface {
	// Wait blocks until the collective is done and returns its error, or
	// returns ctx's error if ctx ends first (the collective still runs).
	Wait(ctx context.Context) error
}

// Async is implemented by groups that can run collectives in the background
// (to overlap gradient all-reduce with backward). Operations issued on one
// group run in issue order. Check for it with a type assertion, or use
// NewAsync to get it for any ProcessGroup. The ctx given to an *Async method
// governs the collective itself; buffers must not be touched until Wait
// returns nil.
type Async interface {
	// AllReduceAsync starts ProcessGroup.AllReduce.
	AllReduceAsync(ctx context.Context, buf Buffer, op ReduceOp) Handle
	// ReduceScatterAsync starts ProcessGroup.ReduceScatter.
	ReduceScatterAsync(ctx context.Context, out, in Buffer, op ReduceOp, counts []int) Handle
	// AllGatherAsync starts ProcessGroup.AllGather.
	AllGatherAsync(ctx context.Context, out, in Buffer, counts []int) Handle
	// BroadcastAsync starts ProcessGroup.Broadcast.
	BroadcastAsync(ctx context.Context, buf Buffer, root int) Handle
}

// P2PKind says whether a P2POp sends or receives.
type P2PKind int

const (
	// SendOp sends Buf to Peer.
	SendOp P2PKind = iota
	// RecvOp receives into Buf from Peer.
	RecvOp
)

// P2POp is one point-to-point transfer of a batch (torch's dist.P2POp).
type P2POp struct {
	Kind P2PKind // SendOp or RecvOp
	Peer int     // rank in the group
	Buf  Buffer  // data to send, or where to receive
}

// BatchSendRecv is implemented by groups that can run a list of sends and
// receives together, as pipeline stages do when they exchange activations
// and gradients in one step. The ops run concurrently, so any batch whose
// sends match the peers' receives completes without deadlock, whatever the
// order of the list. Messages to one peer keep their order in the list.
type BatchSendRecv interface {
	BatchSendRecv(ctx context.Context, ops []P2POp) error
}

// Closer is implemented by groups that hold resources (connections,
// goroutines). Closing the world group unblocks every pending call on it
// and its sub-groups, which return ErrClosed.
type Closer interface {
	// Close releases the group's resources; see the backend for its scope.
	Close() error
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	neg := v < 0
	if neg {
		v = -v
	}
	var b [24]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
