// Package comm defines gotron's collective-communication API: a ProcessGroup
// of ranks that all-reduce, reduce-scatter, all-gather, broadcast, reduce,
// all-to-all, barrier and exchange point-to-point messages, the way
// torch.distributed process groups do for Megatron-LM.
//
// The package holds only the contract (interfaces, buffer views, errors) and
// the reduction kernels every backend shares. Backends live in
// sub-packages:
//
//   - comm/inproc: every rank is a goroutine of one process; collectives are
//     shared-memory copies. Deterministic, with test hooks to kill a rank.
//   - comm/tcp: every rank is a process; rendezvous through a TCP key-value
//     store (comm/store) served by rank 0 at MASTER_ADDR:MASTER_PORT, then one
//     persistent connection per pair of ranks.
//
// # Buffers
//
// Collectives take a Buffer: a byte view of a typed slice plus its DType.
// Float32s, BFloat16s, Int32s and Int64s make zero-copy views, so callers
// keep working with []float32 and friends. Counts and offsets are always in
// elements, never bytes.
//
// # Calling convention
//
// A collective is called by every rank of the group, in the same order, with
// matching arguments (same dtype, compatible lengths, same root). Ranks
// passed as root or peer are ranks of the group (0..Size()-1). Calls on one
// ProcessGroup value must not overlap: one goroutine per group at a time
// (use Async for overlap). Different groups may be used concurrently.
//
// # Failures
//
// A collective never hangs: if a peer dies, is killed, or the collective
// does not complete within the backend's timeout, every surviving rank
// returns a *RankError naming the missing rank and the operation; errors.Is
// reports ErrPeerLost or ErrTimeout. After a failed collective the group is
// broken: later calls return the same error at once (like an aborted NCCL
// communicator); build a new world to go on.
package comm
