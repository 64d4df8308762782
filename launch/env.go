package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// Defaults for a single process started without a launcher.
const (
	DefaultMasterAddr = "127.0.0.1"
	DefaultMasterPort = 29500
)

// Env is what a worker needs to join its job: its place in the world and the
// rendezvous address. DetectEnv fills it from whichever launcher started the
// process; "gotron launch" sets torchrun's variables.
type Env struct {
	Rank           int    // global rank, in [0, WorldSize)
	LocalRank      int    // rank on this node, in [0, LocalWorldSize)
	WorldSize      int    // number of ranks in the job
	LocalWorldSize int    // number of ranks on this node
	NodeRank       int    // index of this node, in [0, NNodes)
	NNodes         int    // number of nodes
	MasterAddr     string // host of rank 0's rendezvous store
	MasterPort     int    // its TCP port
	RestartCount   int    // how many times the launcher restarted the group (TORCHELASTIC_RESTART_COUNT)
	// Source names the environment the values came from: "torchrun",
	// "kubeflow", "env" (RANK/WORLD_SIZE only), "slurm", "openmpi", "mpich"
	// or "default" (no launcher: rank 0 of 1).
	Source string
}

// DetectEnv reads a worker's rank and rendezvous address from the environment
// through getenv (os.Getenv in production). Launchers are tried in this
// order: torchrun (RANK with LOCAL_RANK, as set by torchrun and "gotron
// launch") > Kubeflow PyTorchJob (PET_*, with RANK/WORLD_SIZE) >
// plain RANK/WORLD_SIZE > Slurm (SLURM_PROCID...) > Open MPI
// (OMPI_COMM_WORLD_*) > MPICH/Intel MPI (PMI_RANK, PMI_SIZE) > a single
// process. MASTER_ADDR and MASTER_PORT override the address every source
// implies. Missing, malformed or inconsistent values are an error naming the
// variables.
func DetectEnv(getenv func(string) string) (Env, error) {
	r := reader{getenv: getenv}
	var e Env
	var err error
	switch {
	case r.has("LOCAL_RANK") || r.has("GROUP_RANK") || r.has("TORCHELASTIC_RUN_ID"):
		e, err = r.torchrun()
	case r.has("PET_NPROC_PER_NODE") || r.has("PET_NNODES") || r.has("PET_NODE_RANK"):
		e, err = r.kubeflow()
	case r.has("RANK") || r.has("WORLD_SIZE"):
		e, err = r.plain()
	case r.has("SLURM_PROCID"):
		e, err = r.slurm()
	case r.has("OMPI_COMM_WORLD_RANK") || r.has("OMPI_COMM_WORLD_SIZE"):
		e, err = r.mpi("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
			"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK")
	case r.has("PMI_RANK") || r.has("PMI_SIZE"):
		e, err = r.mpi("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "")
	default:
		e = Env{WorldSize: 1, LocalWorldSize: 1, NNodes: 1, Source: "default"}
		err = r.master(&e, "", DefaultMasterPort)
	}
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Env{}, err
	}
	return e, e.Validate()
}

// Validate checks that the ranks lie inside their sizes and the address is
// usable.
func (e Env) Validate() error {
	src := e.Source
	switch {
	case e.WorldSize < 1:
		return fmt.Errorf("launch: %s environment: world size %d: must be positive", src, e.WorldSize)
	case e.Rank < 0 || e.Rank >= e.WorldSize:
		return fmt.Errorf("launch: %s environment: rank %d outside world size %d", src, e.Rank, e.WorldSize)
	case e.LocalWorldSize < 1 || e.LocalWorldSize > e.WorldSize:
		return fmt.Errorf("launch: %s environment: local world size %d: want 1..world size %d", src, e.LocalWorldSize, e.WorldSize)
	case e.LocalRank < 0 || e.LocalRank >= e.LocalWorldSize:
		return fmt.Errorf("launch: %s environment: local rank %d outside local world size %d", src, e.LocalRank, e.LocalWorldSize)
	case e.NNodes < 1 || e.NodeRank < 0 || e.NodeRank >= e.NNodes:
		return fmt.Errorf("launch: %s environment: node rank %d outside %d nodes", src, e.NodeRank, e.NNodes)
	case e.MasterAddr == "":
		return fmt.Errorf("launch: %s environment: empty master address", src)
	case e.MasterPort < 1 || e.MasterPort > 65535:
		return fmt.Errorf("launch: %s environment: master port %d: want 1..65535", src, e.MasterPort)
	}
	return nil
}

// reader reads integer variables, keeping the first error.
type reader struct {
	getenv func(string) string
	err    error
}

func (r *reader) has(name string) bool { return r.getenv(name) != "" }

// int returns the variable's value, def when unset, recording an error when
// it is not a non-negative integer.
func (r *reader) int(name string, def int) int {
	s := strings.TrimSpace(r.getenv(name))
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if (err != nil || v < 0) && r.err == nil {
		r.err = fmt.Errorf("launch: %s=%q: want a non-negative integer", name, s)
	}
	return v
}

// need returns a variable that must be set, recording an error naming it and
// the variable that implied it.
func (r *reader) need(name, because string) int {
	if !r.has(name) && r.err == nil {
		r.err = fmt.Errorf("launch: %s is set but %s is not", because, name)
	}
	return r.int(name, 0)
}

// check records an inconsistency error.
func (r *reader) check(ok bool, format string, args ...any) {
	if !ok && r.err == nil {
		r.err = fmt.Errorf("launch: "+format, args...)
	}
}

// master fills the rendezvous address: MASTER_ADDR/MASTER_PORT when set,
// otherwise addr (127.0.0.1 when empty) and port.
func (r *reader) master(e *Env, addr string, port int) error {
	e.MasterAddr = r.getenv("MASTER_ADDR")
	if e.MasterAddr == "" {
		e.MasterAddr = addr
	}
	if e.MasterAddr == "" {
		e.MasterAddr = DefaultMasterAddr
	}
	e.MasterPort = r.int("MASTER_PORT", port)
	e.RestartCount = r.int("TORCHELASTIC_RESTART_COUNT", 0)
	return r.err
}

// torchrun reads the variables torchrun (and gotron launch) give each worker.
func (r *reader) torchrun() (Env, error) {
	e := Env{Source: "torchrun"}
	e.Rank = r.need("RANK", "LOCAL_RANK")
	e.WorldSize = r.need("WORLD_SIZE", "RANK")
	e.LocalRank = r.int("LOCAL_RANK", 0)
	e.LocalWorldSize = r.need("LOCAL_WORLD_SIZE", "LOCAL_RANK")
	if r.err != nil {
		return e, r.err
	}
	r.check(e.Rank < e.WorldSize, "RANK=%d is not below WORLD_SIZE=%d", e.Rank, e.WorldSize)
	r.check(e.LocalRank < e.LocalWorldSize, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d", e.LocalRank, e.LocalWorldSize)
	r.check(e.LocalWorldSize <= e.WorldSize, "LOCAL_WORLD_SIZE=%d exceeds WORLD_SIZE=%d", e.LocalWorldSize, e.WorldSize)
	if r.err != nil {
		return e, r.err
	}
	e.NodeRank = r.int("GROUP_RANK", e.Rank/e.LocalWorldSize)
	e.NNodes = r.int("GROUP_WORLD_SIZE", ceilDiv(e.WorldSize, e.LocalWorldSize))
	r.check(e.NodeRank < e.NNodes, "GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d", e.NodeRank, e.NNodes)
	r.check(e.NNodes <= e.WorldSize, "GROUP_WORLD_SIZE=%d exceeds WORLD_SIZE=%d", e.NNodes, e.WorldSize)
	return e, r.master(&e, "", DefaultMasterPort)
}

// kubeflow reads a PyTorchJob pod's variables. RANK is the pod index, so it
// is a worker rank only with one process per pod; with PET_NPROC_PER_NODE > 1
// the pod must run "gotron launch", which reads PET_* as its flag defaults.
func (r *reader) kubeflow() (Env, error) {
	nproc := r.int("PET_NPROC_PER_NODE", 1)
	if r.err == nil && nproc > 1 {
		return Env{}, fmt.Errorf("launch: PET_NPROC_PER_NODE=%d: this Kubeflow pod runs %d workers; start them with "+
			"'gotron launch -- <command>' (it reads PET_*) instead of running the command directly", nproc, nproc)
	}
	e := Env{Source: "kubeflow", LocalWorldSize: 1}
	e.NodeRank = r.int("PET_NODE_RANK", r.int("RANK", 0))
	e.Rank = r.int("RANK", e.NodeRank)
	nnodes := r.getenv("PET_NNODES")
	if strings.Contains(nnodes, ":") {
		// Elastic "min:max": the size is only known from WORLD_SIZE.
		e.WorldSize = r.need("WORLD_SIZE", "PET_NNODES="+nnodes)
	} else {
		e.WorldSize = r.int("WORLD_SIZE", r.int("PET_NNODES", 0))
		r.check(!r.has("PET_NNODES") || r.int("PET_NNODES", 0) == e.WorldSize,
			"PET_NNODES=%s with PET_NPROC_PER_NODE=%d disagrees with WORLD_SIZE=%d", nnodes, nproc, e.WorldSize)
	}
	r.check(e.WorldSize > 0, "Kubeflow environment has neither WORLD_SIZE nor PET_NNODES")
	r.check(!r.has("RANK") || !r.has("PET_NODE_RANK") || e.Rank == e.NodeRank,
		"RANK=%d disagrees with PET_NODE_RANK=%d (one process per pod)", e.Rank, e.NodeRank)
	r.check(e.Rank < e.WorldSize, "RANK=%d is not below WORLD_SIZE=%d", e.Rank, e.WorldSize)
	e.NNodes = e.WorldSize
	e.MasterAddr = r.getenv("PET_MASTER_ADDR")
	return e, r.master(&e, e.MasterAddr, r.int("PET_MASTER_PORT", DefaultMasterPort))
}

// plain reads RANK and WORLD_SIZE without a launcher's local ranks: every
// process is taken to be alone on its node.
func (r *reader) plain() (Env, error) {
	e := Env{Source: "env", LocalWorldSize: 1}
	e.Rank = r.need("RANK", "WORLD_SIZE")
	e.WorldSize = r.need("WORLD_SIZE", "RANK")
	r.check(r.err != nil || e.Rank < e.WorldSize, "RANK=%d is not below WORLD_SIZE=%d", e.Rank, e.WorldSize)
	e.NodeRank, e.NNodes = e.Rank, e.WorldSize
	return e, r.master(&e, "", DefaultMasterPort)
}

// slurm reads srun's task variables; the master is the first host of the
// step's node list unless MASTER_ADDR is set, and the port defaults to 15000
// plus the last four digits of SLURM_JOB_ID (Lightning's rule).
func (r *reader) slurm() (Env, error) {
	e := Env{Source: "slurm"}
	e.Rank = r.int("SLURM_PROCID", 0)
	ntasks := "SLURM_NTASKS"
	if !r.has(ntasks) && r.has("SLURM_NPROCS") {
		ntasks = "SLURM_NPROCS"
	}
	e.WorldSize = r.need(ntasks, "SLURM_PROCID")
	e.LocalRank = r.int("SLURM_LOCALID", 0)
	e.NodeRank = r.int("SLURM_NODEID", 0)
	nnodesVar := "SLURM_NNODES"
	if !r.has(nnodesVar) {
		nnodesVar = "SLURM_JOB_NUM_NODES"
	}
	e.NNodes = r.int(nnodesVar, 1)
	if r.err != nil {
		return e, r.err
	}
	r.check(e.Rank < e.WorldSize, "SLURM_PROCID=%d is not below %s=%d", e.Rank, ntasks, e.WorldSize)
	r.check(e.NodeRank < e.NNodes, "SLURM_NODEID=%d is not below %s=%d", e.NodeRank, nnodesVar, e.NNodes)
	switch {
	case r.has("SLURM_TASKS_PER_NODE"):
		counts, err := parseTasksPerNode(r.getenv("SLURM_TASKS_PER_NODE"))
		if err != nil {
			return e, fmt.Errorf("launch: SLURM_TASKS_PER_NODE=%q: %w", r.getenv("SLURM_TASKS_PER_NODE"), err)
		}
		sum := 0
		for _, c := range counts {
			sum += c
		}
		r.check(sum == e.WorldSize, "SLURM_TASKS_PER_NODE=%q sums to %d, but %s=%d",
			r.getenv("SLURM_TASKS_PER_NODE"), sum, ntasks, e.WorldSize)
		r.check(len(counts) == e.NNodes, "SLURM_TASKS_PER_NODE=%q lists %d nodes, but %s=%d",
			r.getenv("SLURM_TASKS_PER_NODE"), len(counts), nnodesVar, e.NNodes)
		if r.err == nil {
			e.LocalWorldSize = counts[e.NodeRank]
		}
	case r.has("SLURM_NTASKS_PER_NODE"):
		e.LocalWorldSize = r.int("SLURM_NTASKS_PER_NODE", 1)
	default:
		e.LocalWorldSize = ceilDiv(e.WorldSize, e.NNodes)
	}
	r.check(r.err != nil || e.LocalRank < e.LocalWorldSize, "SLURM_LOCALID=%d is not below the node's %d tasks",
		e.LocalRank, e.LocalWorldSize)
	if r.err != nil {
		return e, r.err
	}
	addr := ""
	for _, v := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if !r.has(v) {
			continue
		}
		hosts, err := ParseHostlist(r.getenv(v))
		if err != nil {
			return e, fmt.Errorf("launch: %s: %w", v, err)
		}
		if len(hosts) > 0 {
			addr = hosts[0]
		}
		break
	}
	if addr == "" && !r.has("MASTER_ADDR") && e.NNodes > 1 {
		return e, fmt.Errorf("launch: Slurm job on %d nodes (%s) but neither SLURM_JOB_NODELIST nor MASTER_ADDR is set", e.NNodes, nnodesVar)
	}
	port := DefaultMasterPort
	if id := r.getenv("SLURM_JOB_ID"); id != "" {
		if _, err := strconv.Atoi(id); err != nil {
			return e, fmt.Errorf("launch: SLURM_JOB_ID=%q: want an integer", id)
		}
		if len(id) > 4 {
			id = id[len(id)-4:]
		}
		n, _ := strconv.Atoi(id)
		port = 15000 + n
	}
	return e, r.master(&e, addr, port)
}

// mpi reads Open MPI's or MPICH's variables. Without a node-rank variable,
// ranks are taken to be placed by node in blocks of the local size. The
// master address must come from MASTER_ADDR when the job spans nodes.
func (r *reader) mpi(source, rankVar, sizeVar, localRankVar, localSizeVar, nodeRankVar string) (Env, error) {
	e := Env{Source: source}
	e.Rank = r.need(rankVar, sizeVar)
	e.WorldSize = r.need(sizeVar, rankVar)
	if r.err != nil {
		return e, r.err
	}
	e.LocalWorldSize = r.int(localSizeVar, e.WorldSize)
	e.LocalRank = r.int(localRankVar, e.Rank%max(e.LocalWorldSize, 1))
	if r.err != nil {
		return e, r.err
	}
	r.check(e.Rank < e.WorldSize, "%s=%d is not below %s=%d", rankVar, e.Rank, sizeVar, e.WorldSize)
	r.check(e.LocalWorldSize >= 1 && e.LocalWorldSize <= e.WorldSize, "%s=%d: want 1..%s=%d",
		localSizeVar, e.LocalWorldSize, sizeVar, e.WorldSize)
	r.check(r.err != nil || e.LocalRank < e.LocalWorldSize, "%s=%d is not below %s=%d",
		localRankVar, e.LocalRank, localSizeVar, e.LocalWorldSize)
	if r.err != nil {
		return e, r.err
	}
	e.NNodes = ceilDiv(e.WorldSize, e.LocalWorldSize)
	e.NodeRank = e.Rank / e.LocalWorldSize
	if nodeRankVar != "" {
		e.NodeRank = r.int(nodeRankVar, e.NodeRank)
		r.check(e.NodeRank < e.NNodes, "%s=%d is not below the %d nodes implied by %s/%s",
			nodeRankVar, e.NodeRank, e.NNodes, sizeVar, localSizeVar)
	}
	if e.NNodes > 1 && !r.has("MASTER_ADDR") && r.err == nil {
		return e, fmt.Errorf("launch: %s=%d spans %d nodes (%s=%d) but MASTER_ADDR is not set",
			sizeVar, e.WorldSize, e.NNodes, localSizeVar, e.LocalWorldSize)
	}
	return e, r.master(&e, "", DefaultMasterPort)
}

func ceilDiv(a, b int) int {
	if b <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// Variables returns the torchrun variables that describe e, as "KEY=value"
// strings; DetectEnv on them gives e back with Source "torchrun". maxRestarts
// and runID fill TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_RUN_ID.
func (e Env) Variables(maxRestarts int, runID string) []string {
	kv := []struct {
		k string
		v any
	}{
		{"RANK", e.Rank}, {"LOCAL_RANK", e.LocalRank}, {"WORLD_SIZE", e.WorldSize},
		{"LOCAL_WORLD_SIZE", e.LocalWorldSize}, {"GROUP_RANK", e.NodeRank}, {"GROUP_WORLD_SIZE", e.NNodes},
		{"ROLE_RANK", e.Rank}, {"ROLE_WORLD_SIZE", e.WorldSize}, {"ROLE_NAME", "default"},
		{"MASTER_ADDR", e.MasterAddr}, {"MASTER_PORT", e.MasterPort},
		{"TORCHELASTIC_RESTART_COUNT", e.RestartCount}, {"TORCHELASTIC_MAX_RESTARTS", maxRestarts},
		{"TORCHELASTIC_RUN_ID", runID},
	}
	out := make([]string, len(kv))
	for i, p := range kv {
		out[i] = fmt.Sprintf("%s=%v", p.k, p.v)
	}
	return out
}
