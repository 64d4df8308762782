// Package launch starts the ranks of a distributed job and tells each rank
// where it stands.
//
// Two halves, one contract (torchrun's environment variables):
//
//   - The launcher side, Run, starts NProcPerNode worker processes on one
//     node with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
//     MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RESTART_COUNT set, prefixes
//     their output lines with "[rankN]: ", stops the group when one worker
//     fails (SIGTERM, then SIGKILL after a grace period), restarts it up to
//     MaxRestarts times and forwards SIGINT/SIGTERM. RunInProcess runs the
//     same ranks as goroutines instead.
//   - The worker side, DetectEnv, reads the rank and rendezvous address from
//     whichever launcher started the process: torchrun or "gotron launch",
//     a Kubeflow PyTorchJob, Slurm's srun, Open MPI or MPICH, or none.
//
// Multi-node jobs run one launcher per node with the same master address;
// there is no elastic rendezvous: a failed group is restarted by each node's
// launcher independently, and the workers' own rendezvous (comm/tcp) brings
// the new rounds together.
package launch
