package nccl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/store"
	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/tensor"
)

// The communicator id goes from the group's rank 0 to every member through
// the store, whatever order they arrive in.
func TestExchangeID(t *testing.T) {
	srv, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var want cuda.NCCLUniqueID
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	made := 0
	fake := func() (cuda.NCCLUniqueID, error) { made++; return want, nil }
	const n = 4
	ids := make([]cuda.NCCLUniqueID, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := n - 1; r >= 0; r-- { // the root last: the others wait for it
		st, err := store.Dial(ctx, srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[r], errs[r] = exchangeID(ctx, st, groupKey(4, 0, []int{0, 2, 4, 6}, 0), r == 0, fake)
		}()
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if ids[r] != want {
			t.Errorf("rank %d got id %x..., want %x...", r, ids[r][:8], want[:8])
		}
	}
	if made != 1 {
		t.Errorf("id made %d times, want once (by the root)", made)
	}

	// A failing generator and a malformed value are errors naming the key.
	st, err := store.Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	boom := errors.New("no NCCL here")
	if _, err := exchangeID(ctx, st, "k1", true, func() (cuda.NCCLUniqueID, error) { return cuda.NCCLUniqueID{}, boom }); !errors.Is(err, boom) {
		t.Errorf("root with a failing generator: %v", err)
	}
	if err := st.Set(ctx, "k2", []byte("short")); err != nil {
		t.Fatal(err)
	}
	if _, err := exchangeID(ctx, st, "k2", false, fake); err == nil || !strings.Contains(err.Error(), `"k2" has 5 bytes`) {
		t.Errorf("short id: %v", err)
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := exchangeID(short, st, "never", false, fake); err == nil || !strings.Contains(err.Error(), `"never"`) {
		t.Errorf("missing root: %v", err)
	}
}

// fakeWorld is a world with no device: enough for NewGroup and for every
// argument check, which all run before a group touches the GPU.
func fakeWorld(rank, size int) *Group {
	w := &world{cfg: Config{Rank: rank, WorldSize: size, Timeout: time.Second}, rank: rank, size: size, counts: map[string]int{}, version: 22803}
	members := make([]int, size)
	for i := range members {
		members[i] = i
	}
	g := w.newGroup(members, rank)
	g.world = true
	return g
}

func TestNewGroupKeys(t *testing.T) {
	g := fakeWorld(2, 8)
	if g.key != "gotron/nccl/8-0/0,1,2,3,4,5,6,7,#0" {
		t.Errorf("world key %q", g.key)
	}
	a, err := g.NewGroup([]int{6, 2, 4})
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.NewGroup([]int{6, 2, 4})
	if err != nil {
		t.Fatal(err)
	}
	c, err := g.NewGroup([]int{2, 4, 6})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		g          comm.ProcessGroup
		key        string
		rank, size int
	}{{a, "gotron/nccl/8-0/6,2,4,#0", 1, 3}, {b, "gotron/nccl/8-0/6,2,4,#1", 1, 3}, {c, "gotron/nccl/8-0/2,4,6,#0", 0, 3}} {
		gg := k.g.(*Group)
		if gg.key != k.key || gg.Rank() != k.rank || gg.Size() != k.size {
			t.Errorf("group %v: key %q rank %d size %d, want %q %d %d", gg.Ranks(), gg.key, gg.Rank(), gg.Size(), k.key, k.rank, k.size)
		}
	}
	if _, err := g.NewGroup([]int{0, 1}); !errors.Is(err, comm.ErrNotMember) {
		t.Errorf("non-member: %v", err)
	}
	if _, err := g.NewGroup([]int{2, 8}); err == nil {
		t.Errorf("rank 8 of 8 accepted")
	}
}

// Worlds joined one after another through one store number themselves
// 0, 1, ... so their ids never share keys.
func TestGenerations(t *testing.T) {
	srv, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := t.Context()
	for gen := range 3 {
		var wg sync.WaitGroup
		ws := make([]*world, 3)
		errs := make([]error, 3)
		for r := range ws {
			st, err := store.Dial(ctx, srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ws[r] = &world{cfg: Config{Rank: r, WorldSize: 3, Store: st, Timeout: 10 * time.Second}, rank: r, size: 3, counts: map[string]int{}}
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = ws[r].dial(ctx) }()
		}
		wg.Wait()
		for r, w := range ws {
			if errs[r] != nil {
				t.Fatalf("world %d rank %d: %v", gen, r, errs[r])
			}
			if w.gen != gen {
				t.Errorf("world %d rank %d: generation %d", gen, r, w.gen)
			}
			if k := w.newGroup([]int{2, 0}, 1).key; k != fmt.Sprintf("gotron/nccl/3-%d/2,0,#0", gen) {
				t.Errorf("world %d: key %q", gen, k)
			}
		}
	}
}

func TestMapping(t *testing.T) {
	for dt, want := range map[tensor.DType]cuda.NCCLType{tensor.Float32: cuda.NCCLFloat32, tensor.BFloat16: cuda.NCCLBfloat16, tensor.Int32: cuda.NCCLInt32, tensor.Int64: cuda.NCCLInt64} {
		if got, err := ncclType(dt); err != nil || got != want {
			t.Errorf("ncclType(%v) = %v, %v; want %v", dt, got, err, want)
		}
	}
	if _, err := ncclType(tensor.Float16); err == nil {
		t.Errorf("float16 accepted")
	}
	for _, c := range []struct {
		op      comm.ReduceOp
		divide  bool
		version int
		want    cuda.ReduceOp
		bad     bool
	}{
		{comm.Sum, false, 0, cuda.ReduceSum, false},
		{comm.Max, true, 0, cuda.ReduceMax, false},
		{comm.Min, false, 0, cuda.ReduceMin, false},
		{comm.Avg, true, 0, cuda.ReduceSum, false},
		{comm.Avg, false, 22803, cuda.ReduceAvg, false},
		{comm.Avg, false, 2708, 0, true},
		{comm.ReduceOp(9), true, 22803, 0, true},
	} {
		got, err := ncclOp(c.op, c.divide, c.version)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ncclOp(%v, divide %v, version %d) = %v, %v", c.op, c.divide, c.version, got, err)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "node0", "MASTER_PORT": "29555"}
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rank != 3 || cfg.WorldSize != 8 || cfg.LocalRank != 3 || cfg.MasterAddr != "node0" || cfg.MasterPort != 29555 {
		t.Errorf("config %+v", cfg)
	}
	if cfg, err := ConfigFromEnv(func(string) string { return "" }); err != nil || cfg.WorldSize != 1 || cfg.Rank != 0 || cfg.LocalRank != 0 {
		t.Errorf("empty environment: %+v, %v", cfg, err)
	}
	for _, bad := range []map[string]string{{"RANK": "x"}, {"RANK": "2", "WORLD_SIZE": "2"}, {"LOCAL_RANK": "-1"}, {"MASTER_PORT": "70000"}} {
		if _, err := ConfigFromEnv(func(k string) string { return bad[k] }); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestConfigFromLaunch(t *testing.T) {
	e, err := launch.DetectEnv(func(k string) string {
		return map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
			"SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x4)", "MASTER_ADDR": "n0", "MASTER_PORT": "29700"}[k]
	})
	if err != nil {
		t.Skip("this Slurm environment is not what launch reads: ", err)
	}
	cfg := ConfigFromLaunch(e)
	if cfg.Rank != 5 || cfg.WorldSize != 8 || cfg.LocalRank != 1 {
		t.Errorf("rank %d of %d, local rank %d; want 5 of 8, local 1 (launch found %+v)", cfg.Rank, cfg.WorldSize, cfg.LocalRank, e)
	}
	if cfg.Rank != e.Rank || cfg.WorldSize != e.WorldSize || cfg.LocalRank != e.LocalRank || cfg.MasterAddr != e.MasterAddr || cfg.MasterPort != e.MasterPort {
		t.Errorf("config %+v from %+v", cfg, e)
	}
	if err := cfg.validate(); err != nil {
		t.Error(err)
	}
}

// Bad arguments are errors naming the op, the rank and the size, found
// before the group touches the device.
func TestArgumentErrors(t *testing.T) {
	g := fakeWorld(1, 4)
	ctx := context.Background()
	f8 := comm.MakeBuffer(tensor.Float32, 8)
	i8 := comm.MakeBuffer(tensor.Int32, 8)
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"bad op", g.AllReduce(ctx, f8, comm.ReduceOp(7)), "all_reduce of 8 float32 elements: rank 1 of 4 (world rank 1): invalid reduce op"},
		{"bad dtype", g.AllReduce(ctx, comm.Buffer{DType: tensor.Float16, Data: make([]byte, 4)}, comm.Sum), "all_reduce"},
		{"ragged bytes", g.Broadcast(ctx, comm.Buffer{DType: tensor.Float32, Data: make([]byte, 5)}, 0), "not a whole number"},
		{"bad root", g.Broadcast(ctx, f8, 4), "broadcast: rank 1 of 4 (world rank 1): root 4 out of range"},
		{"reduce root", g.Reduce(ctx, f8, comm.Sum, -1), "root -1 out of range"},
		{"reduce_scatter split", g.ReduceScatter(ctx, comm.MakeBuffer(tensor.Float32, 2), comm.MakeBuffer(tensor.Float32, 9), comm.Sum, nil), "reduce_scatter of 9 float32 elements: rank 1 of 4 (world rank 1): counts: nil (even split)"},
		{"reduce_scatter out", g.ReduceScatter(ctx, comm.MakeBuffer(tensor.Float32, 3), f8, comm.Sum, nil), "out has 3 elements, this rank's block has 2"},
		{"reduce_scatter dtypes", g.ReduceScatter(ctx, comm.MakeBuffer(tensor.Int32, 2), f8, comm.Sum, nil), "out is int32, in is float32"},
		{"all_gather in", g.AllGather(ctx, f8, comm.MakeBuffer(tensor.Float32, 2), []int{1, 3, 2, 2}), "in has 2 elements, this rank's block has 3"},
		{"all_gather counts", g.AllGather(ctx, f8, comm.MakeBuffer(tensor.Float32, 3), []int{1, 3, 2}), "counts: 3 entries"},
		{"all_to_all", g.AllToAll(ctx, f8, f8, []int{1, 1, 1, 1}, nil), "send counts add up to 4 elements, buffer has 8"},
		{"all_to_all dtypes", g.AllToAll(ctx, i8, f8, nil, nil), "out is int32, in is float32"},
		{"send peer", g.Send(ctx, f8, 9), "send: rank 1 of 4 (world rank 1): peer 9 out of range"},
		{"recv peer", g.Recv(ctx, f8, -2), "recv: rank 1 of 4 (world rank 1): peer -2 out of range"},
		{"batch kind", g.BatchSendRecv(ctx, []comm.P2POp{{Kind: 5, Peer: 0, Buf: f8}}), "has kind 5"},
		{"no store", g.Barrier(ctx), "barrier: rank 1 of 4 (world rank 1): make the communicator of world ranks [0 1 2 3]: no rendezvous store"},
		{"tensor on cpu", g.AllReduceTensor(ctx, tensor.New(tensor.Float32, 4), comm.Sum), "all_reduce of 4 float32 elements: rank 1 of 4 (world rank 1): float32[4] on cpu is not a contiguous tensor"},
		{"nil tensor", g.BroadcastTensor(ctx, nil, 0), "broadcast: rank 1 of 4 (world rank 1): nil tensor"},
		{"batch tensor on cpu", g.BatchSendRecvTensors(ctx, []comm.TensorP2P{{Kind: comm.SendOp, Peer: 0, T: tensor.New(tensor.Float32, 4)}}), "send of 4 float32 elements: rank 1 of 4 (world rank 1): float32[4] on cpu is not a contiguous tensor"},
		{"batch nil tensor", g.BatchSendRecvTensors(ctx, []comm.TensorP2P{{Kind: comm.RecvOp, Peer: 0}, {Kind: comm.SendOp, Peer: 2}}), "batch_isend_irecv: rank 1 of 4 (world rank 1): nil tensor"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, c.err, c.want)
		}
	}
	if g.DeviceTensor(tensor.New(tensor.Float32, 4)) {
		t.Errorf("a CPU tensor is a device tensor")
	}
	if _, ok := comm.DeviceOf(g, tensor.New(tensor.Float32, 4)); ok {
		t.Errorf("DeviceOf accepted a CPU tensor")
	}
}

// Once a NCCL call fails the world is broken: every later call returns
// the first error; after Close, ErrClosed.
func TestBrokenAndClosed(t *testing.T) {
	g := fakeWorld(0, 2)
	ctx := context.Background()
	sub, err := g.NewGroup([]int{1, 0})
	if err != nil {
		t.Fatal(err)
	}
	first := g.broke(comm.OpAllReduce, 8, tensor.Float32, errors.New("ncclAllReduce: unhandled cuda error"))
	if !strings.Contains(first.Error(), "nccl: all_reduce of 8 float32 elements: rank 0 of 2 (world rank 0): ncclAllReduce") {
		t.Errorf("first error %v", first)
	}
	err = sub.AllReduce(ctx, comm.MakeBuffer(tensor.Int64, 3), comm.Max)
	var re *comm.RankError
	if !errors.As(err, &re) || re.Op != comm.OpAllReduce || !strings.Contains(err.Error(), "ncclAllReduce: unhandled") {
		t.Errorf("after the failure: %v", err)
	}
	g2 := fakeWorld(0, 1)
	sub2, _ := g2.NewGroup([]int{0})
	if err := g2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sub2.Barrier(ctx); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("barrier after Close: %v", err)
	}
}

// Without a GPU (this machine, CI) Join fails with an error naming the
// rank and the GPU; on a GPU machine it joins a world of one.
func TestJoinOne(t *testing.T) {
	g, err := Join(context.Background(), Config{WorldSize: 1})
	if err != nil {
		if !strings.Contains(err.Error(), "nccl: rank 0 of 1 (GPU 0): join") {
			t.Errorf("Join error %v", err)
		}
		t.Skip("no GPU or no NCCL: ", err)
	}
	defer g.Close()
	if g.Rank() != 0 || g.Size() != 1 {
		t.Errorf("rank %d size %d", g.Rank(), g.Size())
	}
}
