package main

import (
	"context"
	"fmt"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/nccl"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/parallel"
)

// defaultCommTimeout bounds every wait for another rank of gotron launch
// --inproc's world (GOTRON_COMM_TIMEOUT overrides it).
const defaultCommTimeout = 60 * time.Second

// defaultDistributedTimeout bounds every wait for another rank in a
// collective of gotron train across processes (--distributed-timeout-minutes
// overrides it): 10 minutes as Megatron's, since checkpoint saves and first
// iterations are long. A rank that hangs is found sooner by its missing
// heartbeats (--heartbeat-timeout, trainheartbeat.go).
const defaultDistributedTimeout = 10 * time.Minute

// joinWorld returns this rank's world group for a distributed run, or nil
// for a single process: the inproc world "gotron launch --inproc" hands the
// command, or a tcp world joined from the launcher's environment (gotron
// launch, torchrun, Kubeflow, Slurm, Open MPI, MPICH). close releases it.
func joinWorld(ctx context.Context, env *cli, timeout time.Duration, backend string, jo joinOptions) (world comm.ProcessGroup, close func(), err error) {
	if env.world != nil {
		return env.world, func() {}, nil
	}
	e, err := launch.DetectEnv(env.getenv)
	if err != nil {
		return nil, nil, err
	}
	if e.WorldSize == 1 {
		return nil, func() {}, nil
	}
	if backend == "nccl" {
		ncfg := nccl.ConfigFromLaunch(e)
		ncfg.Timeout = max(timeout, 5*time.Minute)
		g, err := nccl.Join(ctx, ncfg)
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d of %d (%s environment): %w", e.Rank, e.WorldSize, e.Source, err)
		}
		return g, func() { g.Close() }, nil
	}
	cfg, err := tcp.ConfigFromEnv(func(k string) string {
		switch k { // the launcher's values, whatever variables carried them
		case "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT":
			return ""
		}
		return env.getenv(k)
	})
	if err != nil {
		return nil, nil, err
	}
	cfg.Rank, cfg.WorldSize, cfg.MasterAddr, cfg.MasterPort = e.Rank, e.WorldSize, e.MasterAddr, e.MasterPort
	cfg.Timeout, cfg.JoinTimeout = timeout, max(timeout, 5*time.Minute)
	cfg.HeartbeatTimeout, cfg.HeartbeatInterval, cfg.FlagsHash = jo.heartbeatTimeout, jo.heartbeatInterval, jo.flagsHash
	g, err := tcp.Join(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("rank %d of %d (%s environment): join the job at %s:%d: %w", e.Rank, e.WorldSize, e.Source, e.MasterAddr, e.MasterPort, err)
	}
	return g, func() { g.Close() }, nil
}

// simDeviceWorld gives a --device sim run's world comm.DeviceCollectives
// (comm.SimDevice), as comm/nccl's groups have them on --device cuda, so
// that every parallel plan moves its tensors in place on the simulated
// device, the path it takes on GPUs, and the run's host-copy count is a
// GPU run's. GOTRON_SIM_DEVICE_COLLECTIVES=0 leaves the host group bare:
// the plans then stage their collectives through host copies (to measure
// what the in-place path saves).
func simDeviceWorld(env *cli, device string, world comm.ProcessGroup) comm.ProcessGroup {
	if world == nil || device != "sim" || env.getenv("GOTRON_SIM_DEVICE_COLLECTIVES") == "0" {
		return world
	}
	return comm.NewSimDevice(world)
}

// parallelConfig is the rank layout the parallel flags ask for (the world
// size is the launched world's).
func (f *trainFlags) parallelConfig() parallel.Config {
	// (a dense model has no expert layers, but Megatron still builds and
	// checks its expert rank generator with --expert-tensor-parallel-size:
	// an order not ending in pp needs the same data-parallel size for both)
	c := parallel.Config{TP: f.tpSize, PP: f.ppSize, CP: f.cpSize, EP: max(f.moe.ep, 1), ETP: f.moe.etp}
	if f.distOptInstances > 1 {
		c.DistOptInstances = f.distOptInstances
	}
	if f.tpPPDPMapping {
		c.Order = parallel.TPPPDPOrder
	}
	return c
}
