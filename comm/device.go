package comm

import (
	"context"

	"github.com/gotron/gotron/tensor"
)

// DeviceCollectives is implemented by groups that can run collectives in
// place on device tensors (comm/nccl on tensor.CUDA), so callers whose
// tensors live on a GPU need not stage them through host Buffers. It is an
// optional interface, like Async and BatchSendRecv: check for it with a
// type assertion (or DeviceOf), and stage through the host as before when a
// group lacks it or refuses a tensor.
//
// The calling convention is ProcessGroup's: every rank of the group calls
// the same collective, in the same order, with tensors of the same dtype and
// matching sizes. Tensors must be contiguous and accepted by DeviceTensor.
// Splits are even: ReduceScatterTensor's in holds Size()·out.Numel()
// elements, block r for rank r, and AllGatherTensor's out holds
// Size()·in.Numel() elements; out may be in's own block (in place) where
// the backend says so.
//
// The work may be queued on the device's stream rather than finished when a
// method returns: it is ordered before every later operation on the device
// (kernels, copies to the host), so results are visible to the next tensor
// op. Errors of queued work surface on a later call or synchronization.
type DeviceCollectives interface {
	// DeviceTensor reports whether the group can work on t in place: a
	// contiguous tensor on the group's device of a dtype it carries.
	DeviceTensor(t *tensor.Tensor) bool
	// AllReduceTensor replaces t on every rank with the reduction of all
	// ranks' t.
	AllReduceTensor(ctx context.Context, t *tensor.Tensor, op ReduceOp) error
	// ReduceScatterTensor reduces all ranks' in and leaves block Rank() of
	// the result in out.
	ReduceScatterTensor(ctx context.Context, out, in *tensor.Tensor, op ReduceOp) error
	// AllGatherTensor concatenates every rank's in, in rank order, into out.
	AllGatherTensor(ctx context.Context, out, in *tensor.Tensor) error
	// BroadcastTensor copies root's t into t on every rank.
	BroadcastTensor(ctx context.Context, t *tensor.Tensor, root int) error
	// SendTensor sends t to rank peer, which calls RecvTensor with a tensor
	// of the same dtype and size.
	SendTensor(ctx context.Context, t *tensor.Tensor, peer int) error
	// RecvTensor receives the next message from rank peer into t.
	RecvTensor(ctx context.Context, t *tensor.Tensor, peer int) error
	// BatchSendRecvTensors runs a list of sends and receives together, as
	// BatchSendRecv does host buffers (NCCL: between ncclGroupStart and
	// ncclGroupEnd): any batch whose sends match the peers' receives
	// completes whatever the order of the list, and messages to one peer
	// keep their order. Pipeline stages exchange activations and gradients
	// with it, and expert parallelism's all-to-all is one batch.
	BatchSendRecvTensors(ctx context.Context, ops []TensorP2P) error
}

// TensorP2P is one send or receive of BatchSendRecvTensors.
type TensorP2P struct {
	Kind P2PKind        // SendOp or RecvOp
	Peer int            // rank in the group
	T    *tensor.Tensor // data to send, or where to receive (contiguous, accepted by DeviceTensor)
}

// DeviceOf returns pg's DeviceCollectives if pg has them and accepts every
// tensor of ts in place; ok is false otherwise (stage through the host).
func DeviceOf(pg ProcessGroup, ts ...*tensor.Tensor) (dc DeviceCollectives, ok bool) {
	dc, ok = pg.(DeviceCollectives)
	if !ok {
		return nil, false
	}
	for _, t := range ts {
		if t == nil || !dc.DeviceTensor(t) {
			return nil, false
		}
	}
	return dc, true
}
