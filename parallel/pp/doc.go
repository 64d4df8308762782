// Package pp is Megatron-LM's pipeline parallelism for gotron, in two parts.
//
// The schedules (Actions, Schedule, Table, Timeline) are pure integer logic
// with no communication and no tensors: for each pipeline rank, the exact
// ordered list of forward passes, backward passes, sends and receives it
// performs in one training iteration. A test simulator runs all ranks'
// lists against each other.
//
// The Executor runs one rank's list for a training step: it calls the
// rank's model chunks (Stage) on one tape per in-flight micro-batch and
// moves activations and gradients between pipeline ranks with the pipeline
// group's point-to-point Send and Recv (comm.ProcessGroup), each run of
// consecutive sends and receives as one comm.BatchSendRecv or one by one in
// Megatron's even/odd order (ExecConfig.Unbatched). The first message on
// each channel carries the tensor's shape, so mismatched stages fail at the
// first exchange. Each tape carries Step's context: a stage's tape functions
// (tensor-parallel collectives) block under it and record their failures on
// the tape (tensor.Tape.Fail), which the executor checks after each forward
// and backward pass, ending the step with the failure as with a stage's
// returned error.
//
// # Schedules
//
// Config mirrors Megatron's flags. As in Megatron's get_forward_backward_func:
//
//   - PP = 1: forward_backward_no_pipelining. Each micro-batch runs forward
//     then backward (gradient accumulation); there is nothing to send.
//   - PP > 1, one chunk per rank: forward_backward_pipelining_without_interleaving
//     (1F1B). Rank r runs min(PP−r−1, M) warm-up forwards, then steady pairs
//     of one forward and one backward, then as many cool-down backwards as
//     warm-up forwards.
//   - PP > 1, VPP ≥ 2 chunks per rank: forward_backward_pipelining_with_interleaving.
//     The model is cut into PP·VPP virtual stages; chunk c of rank r is
//     virtual stage c·PP + r, so activations go round the ring of ranks VPP
//     times. Each rank runs its M·VPP forwards in the order of Table (groups
//     of G micro-batches per chunk) with min(M·VPP, 2·(PP−r−1) + (VPP−1)·G)
//     warm-up forwards; backward k runs the chunks in reverse.
//
// The order of forward and backward passes is Megatron's exactly, whatever
// its p2p settings. Validate refuses what Megatron refuses, naming the flag.
//
// # The action list contract
//
// Actions(cfg, r) is everything rank r does, in order. Forward and Backward
// name a (chunk, micro-batch); the chunk is the rank's own model chunk,
// 0..VPP−1. SendActivation, RecvActivation, SendGrad and RecvGrad name the
// peer rank as well. Activations flow to the next rank (r+1) mod PP and
// gradients to the previous one (r−1) mod PP; the ring closes between the
// last and the first rank only in the interleaved schedule. A send carries
// the tensor of the sender's (chunk, micro-batch); a receive says which of
// the receiver's (chunk, micro-batch) will use it, which is the same chunk,
// or the next chunk when an activation wraps from the last rank to the
// first (the previous chunk when a gradient wraps from the first rank to the
// last).
//
// Guarantees, checked by the package's simulator for every valid
// configuration up to PP = 6, VPP = 4, M = 12 and every group size:
//
//   - Matching. Between each ordered pair of ranks, the k-th send from a to
//     b pairs with the k-th receive that b posts from a, and the two agree
//     on kind, micro-batch and virtual stage. One in-order channel per pair
//     of ranks (comm.ProcessGroup's Send and Recv) is therefore enough;
//     separate channels for activations and gradients work as well.
//   - No deadlock with blocking sends. Running the list one action at a
//     time, where a send returns only once the peer has posted the matching
//     receive (rendezvous, no buffering), completes on every rank. An
//     executor may instead post each maximal run of consecutive sends and
//     receives together and wait for all of them (batch_isend_irecv,
//     comm.BatchSendRecv); that also completes. Buffered sends only relax
//     either model.
//   - Data dependencies. A Forward comes after the RecvActivation that
//     brings its input (except the model's first stage: chunk 0 of rank 0)
//     and a Backward after its own Forward and the RecvGrad that brings its
//     output gradient (except the model's last stage: chunk VPP−1 of rank
//     PP−1). A send comes after the pass that produced its tensor. Every
//     (chunk, micro-batch) runs forward and backward exactly once.
//   - Memory. A rank holds the activations of at most MaxInFlight
//     (chunk, micro-batch) pairs at once: those with the forward done and
//     the backward not yet.
//
// An executor must keep received tensors by (chunk, micro-batch): in the
// interleaved schedule the first and last ranks receive some tensors
// several steps before they use them, as Megatron's do.
//
// # Where sends and receives go
//
// Each run of consecutive sends and receives is one of Megatron's p2p calls
// (P2PCommunicator._communicate), at the point where its schedule makes it.
// For 1F1B: recv-forward, forward, send-forward in the warm-up; forward,
// send-forward-recv-backward, backward, send-backward-recv-forward in the
// steady phase; recv-backward, backward, send-backward in the cool-down. For
// the interleaved schedule, the points of Megatron's path without p2p
// overlap: one exchange after each warm-up forward (the last one also
// receiving the first backward's gradient), one after each steady
// forward-backward pair in both directions, one after each cool-down
// backward. Within a call, operations are in the order of Megatron's
// unbatched path (_p2p_ops, which it uses when overlapping p2p with
// compute): even ranks send the activation, receive the activation, send
// the gradient, receive the gradient; odd ranks receive first in each
// direction. That alternation is what makes plain blocking sends safe.
// Without overlap Megatron posts each call as one batch_isend_irecv, which
// the batched reading of the list reproduces.
//
// Megatron's default for interleaving overlaps p2p with compute (unless
// --no-overlap-p2p-communication is given): it starts the same messages asynchronously
// and waits for them later. The lists do not model that timing. Megatron's
// requirement of PP > 2 for interleaving applies only with
// --no-overlap-p2p-communication, because its batched call would then hold
// two sends to the same peer; the lists keep every pair of ranks' messages
// in one agreed order and so also run with PP = 2.
//
// Not covered: evaluation (forward-only) schedules, and the extra warm-up
// forward Megatron adds when overlapping MoE all-to-all communication
// (its overlap_moe_expert_parallel_comm setting).
//
// # Timing
//
// Timeline places the passes in time for pictures; BubbleFraction is the
// paper's (PP−1)/(VPP·M). With forward 1 unit and backward 2, every
// configuration the tests run finishes in exactly (M·VPP + PP − 1)·3 units,
// both in Timeline and in the test's rendezvous simulation, so its measured
// bubble, idle time over compute time, is exactly BubbleFraction.
package pp
