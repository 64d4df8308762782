// Package tcp is the multi-process backend of comm: every rank is a process
// (usually started by `gotron launch`, torchrun or srun) and ranks talk over
// TCP.
//
// Join rendezvouses through a comm/store key-value store that rank 0 serves
// at MASTER_ADDR:MASTER_PORT (torchrun's TCPStore contract): every rank
// publishes the address of its own listener, then rank j dials every rank
// i < j, so each pair of ranks shares one persistent connection. Each
// connection has a reader goroutine that delivers frames straight into
// buffers posted by receives, or parks early arrivals in pooled buffers, so
// a send never waits for the receiver to be ready and sub-groups (which reuse
// the connections, each with its own tag) never block one another.
//
// Algorithms: messages up to Config.SmallBytes go direct (each rank sends
// its buffer to every peer and reduces in rank order, so results are
// bit-identical on every rank); larger all-reduce is a ring reduce-scatter
// followed by a ring all-gather, each step split into Config.ChunkBytes
// pieces that are sent, received and reduced in a pipeline. Broadcast of
// large buffers is a pipelined chain from the root. Same-host pairs move
// payloads through shared-memory rings (shm.go), and a group whose members
// all share one host runs large all-reduce, reduce-scatter and all-gather
// through a shared region instead of rings (region.go).
//
// Failures: a connection that breaks (the peer died), a peer that does not
// answer within Config.Timeout, or a closed group ends the operation on
// every rank with a *comm.RankError naming the rank at fault; the rank that
// notices first tells every peer, so all ranks blame the same rank. The
// group is then broken for good, like an aborted NCCL communicator. A
// stopped or frozen process keeps its connections open, so every rank also
// sends heartbeats to rank 0's store (rendezvous.go): a rank silent for
// Config.HeartbeatTimeout is declared dead and every other rank's world
// breaks naming it, long before the collective timeout.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/store"
)

// Defaults for the zero values of Config.
const (
	DefaultMasterAddr = "127.0.0.1"
	DefaultMasterPort = 29500
	DefaultTimeout    = 5 * time.Minute
	DefaultChunkBytes = 1 << 20
	DefaultSmallBytes = 64 << 10
	// DefaultHeartbeatTimeout is how long a rank may be silent before the
	// others declare it dead.
	DefaultHeartbeatTimeout = 20 * time.Second
)

// Config says how to join a job.
type Config struct {
	// Rank is this process's rank, 0..WorldSize-1.
	Rank int
	// WorldSize is the number of processes (1 or more).
	WorldSize int
	// MasterAddr is the host rank 0 serves the rendezvous store on; "" means
	// DefaultMasterAddr.
	MasterAddr string
	// MasterPort is the store's port; 0 means DefaultMasterPort.
	MasterPort int
	// Timeout bounds each wait for a peer inside an operation (the clock
	// restarts whenever data arrives); zero means DefaultTimeout.
	Timeout time.Duration
	// JoinTimeout bounds the rendezvous (ranks of a job may start minutes
	// apart); zero means Timeout. A rank that disagrees with rank 0 (world
	// size, FlagsHash), claims a rank id another rank holds, or has a rank
	// id outside the world ends the rendezvous for every rank at once.
	JoinTimeout time.Duration
	// HeartbeatTimeout is how long a rank may stay silent before the others
	// declare it dead: every rank tells rank 0's store it is alive every
	// HeartbeatInterval from a goroutine of its own, whatever its
	// collectives are doing, so a stopped or frozen rank is found in
	// HeartbeatTimeout while a slow collective (a checkpoint save, a first
	// iteration) may take the whole Timeout. Zero means
	// DefaultHeartbeatTimeout; negative means no heartbeats.
	HeartbeatTimeout time.Duration
	// HeartbeatInterval is the time between heartbeats; zero means
	// HeartbeatTimeout/8 (at most 5 s).
	HeartbeatInterval time.Duration
	// FlagsHash, when not empty, must be the same on every rank (for
	// example a hash of the command's flags); the rendezvous fails at once
	// naming the ranks that differ.
	FlagsHash string
	// ListenHost is the host this rank's data listener binds and advertises;
	// "" means the local address this process uses to reach the store.
	ListenHost string
	// ChunkBytes is the pipelining granularity of large operations; zero
	// means DefaultChunkBytes.
	ChunkBytes int
	// SmallBytes is the largest buffer that uses direct (non-ring)
	// algorithms; zero means DefaultSmallBytes, negative means never.
	SmallBytes int
	// NoShm turns off shared memory between ranks on the same host (by
	// default every same-host pair moves payloads of 1 KiB and more through
	// a shared-memory ring, keeping the socket for headers, small frames and
	// failure notices). A pair uses shared memory only if both ranks allow
	// it. ConfigFromEnv sets it from GOTRON_TCP_SHM=0.
	NoShm bool
	// ShmBytes is the shared-memory ring size per direction and pair; zero
	// means DefaultShmBytes. Ranks of a pair that differ use sockets.
	ShmBytes int
	// ShmSlotBytes is the slot size of the shared region through which a
	// group whose members all share one host runs all-reduce,
	// reduce-scatter and all-gather above SmallBytes (region.go); a region
	// holds 2n slots. Zero means DefaultRegionBytes/(2n); negative
	// means no region (rings over the pair links). All ranks must agree.
	ShmSlotBytes int
}

// ConfigFromEnv reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (as set
// by gotron launch and torchrun) through getenv. Unset RANK and WORLD_SIZE
// mean a single process (rank 0 of 1). GOTRON_TCP_SHM=0 sets NoShm (1 or
// unset: shared memory between same-host ranks); GOTRON_TCP_SHM_SLOT sets
// ShmSlotBytes (-1: no group regions).
//
// It does not use launch.DetectEnv (Slurm, Open MPI...): package launch's
// own tests import this package, so importing launch here would make an
// import cycle; callers that want every launcher's variables use
// launch.DetectEnv and fill Config from its Env.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{WorldSize: 1, MasterAddr: getenv("MASTER_ADDR")}
	switch v := getenv("GOTRON_TCP_SHM"); v {
	case "", "1":
	case "0":
		cfg.NoShm = true
	default:
		return Config{}, fmt.Errorf("tcp: environment variable GOTRON_TCP_SHM=%q: want 0 or 1", v)
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{"RANK", &cfg.Rank}, {"WORLD_SIZE", &cfg.WorldSize}, {"MASTER_PORT", &cfg.MasterPort}, {"GOTRON_TCP_SHM_SLOT", &cfg.ShmSlotBytes}} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Config{}, fmt.Errorf("tcp: environment variable %s=%q: want an integer", v.name, s)
		}
		*v.dst = n
	}
	return cfg, cfg.validate()
}

func (c *Config) validate() error {
	switch {
	case c.WorldSize < 1:
		return fmt.Errorf("tcp: world size %d, want at least 1", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("tcp: rank %d out of range for world size %d", c.Rank, c.WorldSize)
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return fmt.Errorf("tcp: master port %d out of range", c.MasterPort)
	case c.Timeout < 0 || c.JoinTimeout < 0:
		return fmt.Errorf("tcp: negative timeout %v / join timeout %v", c.Timeout, c.JoinTimeout)
	case c.HeartbeatInterval < 0:
		return fmt.Errorf("tcp: negative heartbeat interval %v", c.HeartbeatInterval)
	case c.HeartbeatTimeout > 0 && c.HeartbeatInterval >= c.HeartbeatTimeout:
		return fmt.Errorf("tcp: heartbeat interval %v must be shorter than the heartbeat timeout %v", c.HeartbeatInterval, c.HeartbeatTimeout)
	case c.ChunkBytes < 0:
		return fmt.Errorf("tcp: negative chunk size %d", c.ChunkBytes)
	case c.ShmSlotBytes > 1<<28:
		return fmt.Errorf("tcp: shared-region slot size %d, want at most 256 MiB (or 0: default, negative: no region)", c.ShmSlotBytes)
	case c.ShmBytes < 0 || c.ShmBytes > 1<<30:
		return fmt.Errorf("tcp: shared-memory ring size %d, want 0 (default) to 1 GiB", c.ShmBytes)
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
	if c.JoinTimeout == 0 {
		c.JoinTimeout = c.Timeout
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.SmallBytes == 0 {
		c.SmallBytes = DefaultSmallBytes
	}
	if c.ShmBytes == 0 {
		c.ShmBytes = DefaultShmBytes
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.HeartbeatInterval == 0 && c.HeartbeatTimeout > 0 {
		c.HeartbeatInterval = min(c.HeartbeatTimeout/8, 5*time.Second)
	}
}

// world is the per-process state every group of a job shares.
type world struct {
	cfg   Config
	rank  int
	size  int
	conns []*peerConn // by world rank; nil for self
	ln    net.Listener
	srv   *store.Server // rank 0 only
	st    *store.Client
	pool  bufPool
	// hostKey tells which peers share this host ("" when unknown).
	hostKey string

	mu       sync.Mutex // protects the fields below
	broken   chan struct{}
	failRank int
	failErr  error
	counts   map[string]int // NewGroup calls per rank list
	tags     map[uint32]string
	closed   bool
	regions  []*region // groups' shared regions, unmapped at shutdown

	telling sync.WaitGroup // failure notices being sent

	me    rankRecord   // this rank, as published at the rendezvous
	peers []rankRecord // every rank's record, by world rank (after join)
	// hbStop ends the heartbeat goroutine, which closes hbDone.
	hbStop context.CancelFunc
	hbDone chan struct{}
}

// Join rendezvouses with the other ranks and returns the world group. It
// blocks until every rank has joined, ctx ends or cfg.Timeout passes.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	if err := cfg.validate(); err != nil {
		if cfg.WorldSize > 1 && (cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize) {
			// Tell the ranks that wait for a complete world, so that they
			// stop now rather than at their join timeout.
			cfg.fill()
			err = reportBadRank(ctx, cfg, err)
		}
		return nil, err
	}
	cfg.fill()
	w := &world{cfg: cfg, rank: cfg.Rank, size: cfg.WorldSize, conns: make([]*peerConn, cfg.WorldSize),
		broken: make(chan struct{}), counts: map[string]int{}, tags: map[uint32]string{0: "world"},
		me: thisRank(cfg)}
	if err := w.join(ctx); err != nil {
		w.shutdown()
		return nil, fmt.Errorf("tcp: rank %d of %d: join via %s:%d: %w", cfg.Rank, cfg.WorldSize, cfg.MasterAddr, cfg.MasterPort, err)
	}
	w.startHeartbeat()
	members := make([]int, w.size)
	for i := range members {
		members[i] = i
	}
	return newGroup(w, 0, members, w.rank), nil
}

func (w *world) join(ctx context.Context) (err error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.JoinTimeout)
	defer cancel()
	if w.size == 1 {
		return nil
	}
	master := net.JoinHostPort(w.cfg.MasterAddr, strconv.Itoa(w.cfg.MasterPort))
	var listenErr error
	if w.rank == 0 {
		if w.srv, listenErr = store.Listen(master); listenErr != nil {
			// Perhaps another rank 0 serves it: say so to its job. A store
			// answers at once; anything else holding the port does not.
			dctx, dcancel := context.WithTimeout(ctx, foreignWait)
			defer dcancel()
			ctx = dctx
		}
	}
	st, err := store.Dial(ctx, master)
	if err != nil {
		if listenErr != nil {
			return listenErr
		}
		return err
	}
	w.st = st
	// A problem any rank finds ends every rank's rendezvous: a watcher on
	// a second connection cancels ours with the problem as the cause.
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	watch, err := store.Dial(ctx, master)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if v, err := watch.Get(watchCtx, joinErrorKey); err == nil {
			abort(errors.New(string(v)))
		}
	}()
	defer func() {
		stopWatch()
		<-watched
		watch.Close()
		explained := false
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
			err, explained = cause, true // the problem another rank found explains ours
		}
		if err != nil {
			// The watcher may not yet have seen a problem another rank
			// posted when ours surfaced (a peer that stopped because of it
			// refuses our connection): the posted problem explains ours.
			var own postedError
			if posted := w.acknowledgeJoinError(master); posted != "" && !explained && !errors.As(err, &own) {
				err = errors.New(posted)
			}
		}
	}()
	if err := w.checkIn(ctx, st, master, listenErr); err != nil {
		return err
	}
	if !w.cfg.NoShm {
		w.hostKey = hostKey()
	}
	host := w.cfg.ListenHost
	if host == "" {
		host, _, _ = net.SplitHostPort(st.LocalAddr().String())
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("listen for peers on %s: %w", host, err)
	}
	w.ln = ln
	if err := st.Set(ctx, "gotron/addr/"+strconv.Itoa(w.rank), []byte(ln.Addr().String())); err != nil {
		return err
	}
	// Accept from higher ranks while dialling lower ones.
	acceptErr := make(chan error, 1)
	go func() { acceptErr <- w.acceptPeers(ctx) }()
	for peer := range w.rank {
		addr, err := st.Get(ctx, "gotron/addr/"+strconv.Itoa(peer))
		if err != nil {
			return err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", string(addr))
		if err != nil {
			return fmt.Errorf("connect to rank %d at %s: %w", peer, addr, err)
		}
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		err = writeHello(c, w.size, w.rank)
		var link *shmLink
		if err == nil {
			link, err = w.offerShm(c)
		}
		c.SetDeadline(time.Time{})
		if err != nil {
			c.Close()
			return fmt.Errorf("handshake with rank %d: %w", peer, err)
		}
		w.conns[peer] = newPeerConn(w, peer, c.(*net.TCPConn), link)
	}
	if err := <-acceptErr; err != nil {
		return err
	}
	w.peers = make([]rankRecord, w.size) // before the readers, which name ranks with it
	for r := range w.size {
		if w.peers[r], err = getRecord(ctx, st, r); err != nil {
			return err
		}
	}
	for _, pc := range w.conns {
		if pc != nil {
			pc.started = true
			go pc.readLoop()
		}
	}
	return st.Barrier(ctx, "gotron/joined", w.size)
}

func (w *world) acceptPeers(ctx context.Context) error {
	want := w.size - 1 - w.rank
	stop := context.AfterFunc(ctx, func() { w.ln.Close() })
	defer stop()
	for want > 0 {
		c, err := w.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for %d higher ranks to connect: %w", want, context.Cause(ctx))
			}
			return fmt.Errorf("accept peers: %w", err)
		}
		c.SetDeadline(time.Now().Add(w.cfg.JoinTimeout))
		size, peer, err := readHello(c)
		var link *shmLink
		if err == nil {
			link, err = w.answerShm(c)
		}
		c.SetDeadline(time.Time{})
		if err != nil || size != w.size || peer <= w.rank || peer >= w.size || w.conns[peer] != nil {
			if link != nil {
				link.unmap()
			}
		}
		switch {
		case err != nil:
			c.Close()
			return fmt.Errorf("handshake from %s: %w", c.RemoteAddr(), err)
		case size != w.size:
			c.Close()
			return fmt.Errorf("rank %d at %s has world size %d, this rank %d", peer, c.RemoteAddr(), size, w.size)
		case peer <= w.rank || peer >= w.size || w.conns[peer] != nil:
			c.Close()
			return fmt.Errorf("unexpected connection claiming rank %d from %s", peer, c.RemoteAddr())
		}
		w.conns[peer] = newPeerConn(w, peer, c.(*net.TCPConn), link)
		want--
	}
	return nil
}

// fail breaks the world, blaming world rank blame (-1 for a local close).
// With tell, every peer is told (in the background; shutdown waits for it)
// so they all blame the same rank, even those that hear of the failure only
// through a peer that then exits.
func (w *world) fail(blame int, err error, tell bool) {
	w.mu.Lock()
	if w.failErr != nil {
		w.mu.Unlock()
		return
	}
	w.failRank, w.failErr = blame, err
	tell = tell && !w.closed
	if tell {
		w.telling.Add(1) // before anyone can see broken and shut down
	}
	close(w.broken)
	w.mu.Unlock()
	if !tell {
		return
	}
	kind := byte(0)
	switch {
	case errors.Is(err, comm.ErrTimeout):
		kind = 1
	case errors.Is(err, errNoHeartbeat):
		kind = heartbeatNotice
	}
	go func() {
		defer w.telling.Done()
		// A writer blocked on a stalled peer may hold that connection, so
		// wait for the notices only so long.
		var wg sync.WaitGroup
		for _, pc := range w.conns {
			if pc != nil && pc.peer != blame {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pc.sendAbort(blame, kind)
				}()
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		t := time.NewTimer(abortWait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}()
}

// abortWait bounds how long fail waits to tell peers about a failure.
const abortWait = time.Second

// failure returns the world's failure as a RankError for op, or nil.
func (w *world) failure(op string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failErr == nil {
		return nil
	}
	return &comm.RankError{Rank: w.failRank, Op: op, Err: w.failErr}
}

// shutdown closes every connection, the listener and the store.
func (w *world) shutdown() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.stopHeartbeat()
	w.fail(w.rank, comm.ErrClosed, false)
	w.telling.Wait()
	for _, pc := range w.conns {
		if pc != nil {
			pc.closeConn()
		}
	}
	// Unmap shared memory once nothing can touch it: the reader has
	// stopped, and a sender holds wmu while it uses the ring.
	for _, pc := range w.conns {
		if pc != nil && pc.shm != nil {
			if pc.started {
				<-pc.readerDone
			}
			pc.wmu.Lock()
			pc.shm.unmap()
			pc.shmGone = true
			pc.wmu.Unlock()
		}
	}
	w.closeRegions()
	if w.ln != nil {
		w.ln.Close()
	}
	if w.st != nil {
		w.st.Close()
	}
	if w.srv != nil {
		w.srv.Close()
	}
}

// groupTag returns the tag of the k-th group made from ranks: a hash both
// sides compute alike, checked for collisions with live tags.
func (w *world) groupTag(ranks []int) (uint32, error) {
	var sb strings.Builder
	for _, r := range ranks {
		sb.WriteString(strconv.Itoa(r))
		sb.WriteByte(',')
	}
	key := sb.String()
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.counts[key]
	w.counts[key]++
	name := key + "#" + strconv.Itoa(k)
	h := fnv.New32a()
	h.Write([]byte(name))
	tag := h.Sum32() & maxGroupTag
	if tag == 0 {
		tag = 1
	}
	if other, ok := w.tags[tag]; ok {
		return 0, fmt.Errorf("tcp: new_group %v: tag collision with group %s; create groups in another order", ranks, other)
	}
	w.tags[tag] = name
	return tag, nil
}
