package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/store"
	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/tensor"
)

// Defaults for the zero values of Config.
const (
	DefaultMasterAddr = "127.0.0.1"
	DefaultMasterPort = 29500
	DefaultTimeout    = 5 * time.Minute
)

// Config says how to join a job.
type Config struct {
	// Rank is this process's rank, 0..WorldSize-1.
	Rank int
	// WorldSize is the number of processes (1 or more), one per GPU.
	WorldSize int
	// LocalRank is the ordinal of the GPU Join opens when this process has
	// none open yet (tensor.OpenCUDA).
	LocalRank int
	// MasterAddr and MasterPort are where rank 0 serves the rendezvous
	// store; "" and 0 mean DefaultMasterAddr and DefaultMasterPort.
	MasterAddr string
	MasterPort int
	// Timeout bounds each rendezvous wait in the store (Join, and a
	// sub-group's first collective); zero means DefaultTimeout.
	Timeout time.Duration
	// Store, if set, is used for the rendezvous instead of serving and
	// dialling one at MasterAddr:MasterPort (a job that already has a
	// store: the tcp backend's, say). Join does not close it.
	Store *store.Client
}

// ConfigFromEnv reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT (as set by gotron launch and torchrun) through getenv. Unset
// RANK and WORLD_SIZE mean a single process; unset LOCAL_RANK means GPU 0.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{WorldSize: 1, MasterAddr: getenv("MASTER_ADDR")}
	for _, v := range []struct {
		name string
		dst  *int
	}{{"RANK", &cfg.Rank}, {"WORLD_SIZE", &cfg.WorldSize}, {"LOCAL_RANK", &cfg.LocalRank}, {"MASTER_PORT", &cfg.MasterPort}} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Config{}, fmt.Errorf("nccl: environment variable %s=%q: want an integer", v.name, s)
		}
		*v.dst = n
	}
	return cfg, cfg.validate()
}

// ConfigFromLaunch is the Config of the rank launch.DetectEnv found (any
// launcher: torchrun, gotron launch, Slurm, Open MPI, MPICH, Kubeflow).
func ConfigFromLaunch(e launch.Env) Config {
	return Config{Rank: e.Rank, WorldSize: e.WorldSize, LocalRank: e.LocalRank, MasterAddr: e.MasterAddr, MasterPort: e.MasterPort}
}

func (c *Config) validate() error {
	switch {
	case c.WorldSize < 1:
		return fmt.Errorf("nccl: world size %d, want at least 1", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("nccl: rank %d out of range for world size %d", c.Rank, c.WorldSize)
	case c.LocalRank < 0:
		return fmt.Errorf("nccl: rank %d: local rank %d is negative", c.Rank, c.LocalRank)
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return fmt.Errorf("nccl: master port %d out of range", c.MasterPort)
	case c.Timeout < 0:
		return fmt.Errorf("nccl: negative timeout %v", c.Timeout)
	}
	return nil
}

func (c *Config) fill() {
	if c.MasterAddr == "" {
		c.MasterAddr = DefaultMasterAddr
	}
	if c.MasterPort == 0 {
		c.MasterPort = DefaultMasterPort
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
}

// kv is the part of a store client the id exchange uses.
type kv interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Check(ctx context.Context, key string) (bool, error)
}

// idFunc makes a new communicator id (cuda.NewNCCLUniqueID; tests fake it).
type idFunc func() (cuda.NCCLUniqueID, error)

// exchangeID returns the id of the communicator published under key: the
// root makes it with newID and sets it; the others wait for it. They poll
// (Check) rather than block in Get, which would hold the rank's one store
// connection: goroutines making different groups' communicators at once
// would then wait on each other across ranks.
func exchangeID(ctx context.Context, st kv, key string, root bool, newID idFunc) (cuda.NCCLUniqueID, error) {
	var id cuda.NCCLUniqueID
	if root {
		id, err := newID()
		if err != nil {
			return id, fmt.Errorf("make the communicator id: %w", err)
		}
		if err := st.Set(ctx, key, id[:]); err != nil {
			return id, fmt.Errorf("publish the communicator id under %q: %w", key, err)
		}
		return id, nil
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		ok, err := st.Check(ctx, key)
		if err != nil {
			return id, fmt.Errorf("wait for the communicator id under %q: %w", key, err)
		}
		if ok {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return id, fmt.Errorf("wait for the communicator id under %q: %w", key, ctx.Err())
		case <-t.C:
		}
	}
	v, err := st.Get(ctx, key)
	if err != nil {
		return id, fmt.Errorf("wait for the communicator id under %q: %w", key, err)
	}
	if len(v) != len(id) {
		return id, fmt.Errorf("communicator id under %q has %d bytes, want %d", key, len(v), len(id))
	}
	copy(id[:], v)
	return id, nil
}

// groupKey is the store key of the k-th group made from the world ranks
// listed, in the gen-th world of size ranks joined through the store.
func groupKey(size, gen int, ranks []int, k int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "gotron/nccl/%d-%d/", size, gen)
	for _, r := range ranks {
		sb.WriteString(strconv.Itoa(r))
		sb.WriteByte(',')
	}
	sb.WriteString("#")
	sb.WriteString(strconv.Itoa(k))
	return sb.String()
}

// world is the per-process state every group of a job shares.
type world struct {
	cfg  Config
	rank int
	size int
	dev  device
	// cudaDev is the GPU whose tensors the group works on in place (nil
	// for a fake device).
	cudaDev *cuda.Device
	st      kv
	stc     *store.Client // dialled by Join (closed by shutdown)
	gen     int           // worlds joined through the store before this one
	srv     *store.Server // rank 0 only
	newID   idFunc
	// version is NCCL's version code (22803 for 2.28.3).
	version int

	mu      sync.Mutex
	counts  map[string]int // NewGroup calls per rank list
	groups  []*Group       // every group made, for shutdown
	failErr error          // the first NCCL error: the world is broken
	closed  bool
}

// Join rendezvouses with the other ranks and returns the world group. Its
// communicators work on this process's CUDA device: the one already open
// (gotron's --device cuda opens the local rank's GPU, modulo the GPUs
// visible), else GPU cfg.LocalRank, which Join opens. It blocks until every
// rank has joined the world communicator.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	fail := func(err error) error {
		return fmt.Errorf("nccl: rank %d of %d (GPU %d): join via %s:%d: %w", cfg.Rank, cfg.WorldSize, cfg.LocalRank, cfg.MasterAddr, cfg.MasterPort, err)
	}
	dev := tensor.CUDADevice()
	if dev == nil {
		if err := tensor.OpenCUDA(cfg.LocalRank, tensor.CUDAOptions{}); err != nil {
			return nil, fail(err)
		}
		dev = tensor.CUDADevice()
	}
	if dev == nil {
		return nil, fail(errors.New("no CUDA device open"))
	}
	version, _, err := cuda.NCCLVersion()
	if err != nil {
		return nil, fail(err)
	}
	w := &world{cfg: cfg, rank: cfg.Rank, size: cfg.WorldSize, dev: cudaDevice{dev}, cudaDev: dev, newID: cuda.NewNCCLUniqueID, version: version, counts: map[string]int{}}
	g, err := w.join(ctx)
	if err != nil {
		return nil, fail(err)
	}
	return g, nil
}

// join connects to the store and makes the world communicator.
func (w *world) join(ctx context.Context) (*Group, error) {
	if err := w.dial(ctx); err != nil {
		w.shutdown()
		return nil, err
	}
	members := make([]int, w.size)
	for i := range members {
		members[i] = i
	}
	g := w.newGroup(members, w.rank)
	g.world = true
	jctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	if _, err := g.communicator(jctx, "join"); err != nil {
		w.shutdown()
		return nil, err
	}
	return g, nil
}

// dial connects to the rendezvous store (serving it on rank 0) unless the
// world is one process or the caller handed a store.
func (w *world) dial(ctx context.Context) error {
	if w.size == 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	if w.cfg.Store != nil {
		w.st = w.cfg.Store
		return w.generation(ctx, w.cfg.Store)
	}
	master := net.JoinHostPort(w.cfg.MasterAddr, strconv.Itoa(w.cfg.MasterPort))
	if w.rank == 0 {
		srv, err := store.Listen(master)
		if err != nil {
			return err
		}
		w.srv = srv
	}
	st, err := store.Dial(ctx, master)
	if err != nil {
		return err
	}
	w.st, w.stc = st, st
	return w.generation(ctx, st)
}

// generation numbers this world among those of its size joined through
// one store (a store a job keeps across several worlds, Config.Store), so
// that their communicator ids do not share keys: every rank adds one to
// the size's counter, and the k-th world's ranks see values k·size+1 to
// (k+1)·size.
func (w *world) generation(ctx context.Context, st *store.Client) error {
	v, err := st.Add(ctx, "gotron/nccl/joins/"+strconv.Itoa(w.size), 1)
	if err != nil {
		return err
	}
	w.gen = int(v-1) / w.size
	return nil
}

// newGroup registers a group of the world ranks listed, this rank at
// position rank; its communicator is made on first use.
func (w *world) newGroup(ranks []int, rank int) *Group {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := groupKey(0, 0, ranks, 0)
	name := groupKey(w.size, w.gen, ranks, w.counts[list])
	w.counts[list]++
	g := &Group{w: w, ranks: append([]int(nil), ranks...), rank: rank, key: name}
	w.groups = append(w.groups, g)
	return g
}

// fail breaks the world with err (the first error wins) and returns the
// world's error.
func (w *world) fail(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failErr == nil {
		w.failErr = err
	}
	return w.failErr
}

// failure returns the error that broke the world, or nil.
func (w *world) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed && w.failErr == nil {
		return comm.ErrClosed
	}
	return w.failErr
}

// shutdown destroys every communicator and closes the store.
func (w *world) shutdown() error {
	w.mu.Lock()
	w.closed = true
	groups := w.groups
	w.groups = nil
	w.mu.Unlock()
	var errs []error
	for _, g := range groups {
		errs = append(errs, g.destroy())
	}
	if w.stc != nil {
		w.stc.Close()
	}
	if w.srv != nil {
		w.srv.Close()
	}
	return errors.Join(errs...)
}
