// Package nccl is the GPU backend of comm: a process group whose
// collectives run through NCCL (internal/cuda's bindings, loaded at run
// time, so CGO_ENABLED=0 binaries still build and run without a GPU), one
// process per GPU, as torch.distributed's "nccl" backend runs Megatron-LM.
//
// # Two ways in
//
// A *Group is a comm.ProcessGroup: its methods take host Buffers, which it
// copies into a device scratch block, runs NCCL on, and copies back, so it
// can replace comm/tcp wholesale under --device cuda (every layer that
// speaks Buffers works unchanged, and the conformance suite comm/commtest
// runs against it). A *Group is also a comm.DeviceCollectives: its *Tensor
// methods run NCCL in place on contiguous tensor.CUDA tensors, with no host
// copy. The parallel layers use those when their tensors are on the GPU
// (comm.DeviceOf) and stage through the host otherwise.
//
// # Rendezvous
//
// Join takes the job's shape (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT: ConfigFromEnv, or a launch.Env copied into a Config), works
// on the process's open GPU or opens GPU LOCAL_RANK (tensor.OpenCUDA), and
// meets the other ranks through a comm/store key-value store that rank 0
// serves at MASTER_ADDR:MASTER_PORT (or one the caller already has,
// Config.Store). Each communicator's 128-byte ncclUniqueId is made by the
// communicator's rank 0 and published under a store key naming the
// world's size and generation (worlds joined through one store count
// themselves), the world ranks of the group and how many groups with that
// list came before ("gotron/nccl/8-0/0,2,4,6,#0"); the other members read
// it and all call ncclCommInitRank. The world communicator is made in Join. NewGroup (what
// parallel.NewGroups calls for the TP, PP, DP... groups) neither
// communicates nor blocks, as comm requires: a sub-group makes its
// communicator on its first collective, which every member calls.
//
// # Semantics
//
// Dtypes float32, bfloat16, int32 and int64; ops sum, max and min map to
// NCCL's. Avg on host Buffers is a NCCL sum, then comm.DivideBy on the
// host, as the other backends divide. Avg on device tensors is ncclAvg
// (NCCL ≥ 2.10, as torch uses it), which for floating types multiplies by
// 1/n before summing and may differ from sum/n in the last bit (integer avg
// rounds as NCCL does). Sums are NCCL's: float32 and bfloat16 are rounded
// at each step of its algorithm (bfloat16 is not accumulated in float32
// and rounded once, as comm's host backends do), so results can differ
// from tcp's in the last bits (not on the conformance suite's small
// integers, which every order sums exactly). Uneven counts pad every block
// to the largest count. Reduce is an all-reduce of which only root keeps
// the result; all-to-all is grouped sends and receives.
//
// Host-Buffer methods return when their result is in host memory; device
// tensor methods queue the collective on the device's one stream and
// return, so it runs before any later kernel or copy.
//
// # Limits
//
// NCCL cannot be interrupted through these bindings (no ncclCommAbort): a
// rank that dies makes its peers wait inside NCCL, and ctx is checked only
// before a call. All work shares the device's single stream, so two
// goroutines issuing collectives on different groups at once can order
// them differently on two ranks and deadlock; issue collectives from one
// goroutine at a time per process (comm.NewAsync's goroutine counts as one).
// An NCCL error breaks the world: every later call returns it.
package nccl
