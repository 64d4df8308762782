package nccl

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/tensor"
)

// The GPU tests: the conformance suite of comm (host Buffers) and the
// device-tensor collectives, on a world of one GPU in this process, and on
// a world of every GPU of the machine, one worker process each (this test
// binary re-executed with workerEnv set). Without a GPU they skip.

const workerEnv = "GOTRON_NCCL_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(worker())
	}
	os.Exit(m.Run())
}

func worker() int {
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	cfg.Timeout = 2 * time.Minute
	ctx := context.Background()
	g, err := Join(ctx, cfg)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer g.Close()
	if err := gpuSuite(ctx, g); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("OK")
	return 0
}

func gpuSuite(ctx context.Context, g *Group) error {
	if err := commtest.Conformance(ctx, g); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	if g.Size() == 1 { // several ranks: one stream, see the package doc
		if err := commtest.ConcurrentGroups(ctx, g, 3); err != nil {
			return fmt.Errorf("concurrent groups: %w", err)
		}
	}
	if err := tensorSuite(ctx, g); err != nil {
		return fmt.Errorf("device tensors: %w", err)
	}
	// The tensor collectives on a sub-group (the world reversed), made lazily.
	rev := make([]int, g.Size())
	for i := range rev {
		rev[i] = g.Size() - 1 - i
	}
	sub, err := g.NewGroup(rev)
	if err != nil {
		return err
	}
	if err := tensorSuite(ctx, sub.(*Group)); err != nil {
		return fmt.Errorf("device tensors on the reversed world: %w", err)
	}
	return g.Barrier(ctx)
}

// onGPU returns buf's elements as a CUDA tensor.
func onGPU(b comm.Buffer) *tensor.Tensor {
	n := b.Len()
	var t *tensor.Tensor
	switch b.DType {
	case tensor.Int32:
		t = tensor.New(tensor.Int32, n)
		copy(t.Int32s(), b.Int32())
	case tensor.Int64:
		t = tensor.New(tensor.Int64, n)
		copy(t.Int64s(), b.Int64())
	default:
		t = tensor.New(tensor.Float32, n)
		for i := range n {
			t.Float32s()[i] = float32(commtest.Get(b, i))
		}
		if b.DType == tensor.BFloat16 {
			t = t.To(tensor.BFloat16)
		}
	}
	return t.ToDevice(tensor.CUDA)
}

// fromGPU returns t's elements.
func fromGPU(t *tensor.Tensor) []float64 {
	c := t.ToDevice(tensor.CPU)
	out := make([]float64, c.Numel())
	switch c.DType() {
	case tensor.Int32:
		for i, v := range c.Int32s() {
			out[i] = float64(v)
		}
	case tensor.Int64:
		for i, v := range c.Int64s() {
			out[i] = float64(v)
		}
	default:
		for i, v := range c.To(tensor.Float32).Float32s() {
			out[i] = float64(v)
		}
	}
	return out
}

func compare(rank int, what string, got []float64, want func(i int) float64) error {
	for i, g := range got {
		if w := want(i); g != w {
			return fmt.Errorf("rank %d: %s: element %d of %d = %v, want %v", rank, what, i, len(got), g, w)
		}
	}
	return nil
}

// tensorSuite runs the DeviceCollectives on every dtype against commtest's
// serial reference.
func tensorSuite(ctx context.Context, g *Group) error {
	n, me := g.Size(), g.Rank()
	members := g.Ranks()
	// Inputs are Value(seed, world rank, i) so that the reference, which
	// takes world ranks, matches whatever the group's order.
	wr := members[me]
	seed := 5000
	for _, dt := range commtest.DTypes {
		for _, size := range []int{1, 7*n + 3, 5000 + n} {
			for _, op := range commtest.Ops {
				// ncclAvg multiplies floats by 1/n first: exact only when
				// 1/n is; integer avg rounding is NCCL's own.
				if op == comm.Avg && n > 1 && (n&(n-1) != 0 || dt == tensor.Int32 || dt == tensor.Int64) {
					continue
				}
				seed++
				t := onGPU(commtest.Fill(dt, size, seed, wr, 0))
				if _, ok := comm.DeviceOf(g, t); !ok {
					return fmt.Errorf("DeviceOf refused %v on CUDA", t)
				}
				what := fmt.Sprintf("all_reduce %v %v n=%d", dt, op, size)
				if err := g.AllReduceTensor(ctx, t, op); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := compare(me, what, fromGPU(t), func(i int) float64 { return commtest.ReduceRef(dt, op, seed, members, i) }); err != nil {
					return err
				}
				if op == comm.Avg {
					continue
				}
				seed++
				in := onGPU(commtest.Fill(dt, size*n, seed, wr, 0))
				out := onGPU(comm.MakeBuffer(dt, size))
				what = fmt.Sprintf("reduce_scatter %v %v n=%d", dt, op, size)
				if err := g.ReduceScatterTensor(ctx, out, in, op); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := compare(me, what, fromGPU(out), func(i int) float64 { return commtest.ReduceRef(dt, op, seed, members, me*size+i) }); err != nil {
					return err
				}
			}
			seed++
			in := onGPU(commtest.Fill(dt, size, seed, wr, 0))
			out := onGPU(comm.MakeBuffer(dt, size*n))
			what := fmt.Sprintf("all_gather %v n=%d", dt, size)
			if err := g.AllGatherTensor(ctx, out, in); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if err := compare(me, what, fromGPU(out), func(i int) float64 { return float64(commtest.Value(seed, members[i/size], i%size)) }); err != nil {
				return err
			}
			for root := range n {
				seed++
				t := onGPU(commtest.Fill(dt, size, seed, wr, 0))
				what := fmt.Sprintf("broadcast %v n=%d root=%d", dt, size, root)
				if err := g.BroadcastTensor(ctx, t, root); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := compare(me, what, fromGPU(t), func(i int) float64 { return float64(commtest.Value(seed, members[root], i)) }); err != nil {
					return err
				}
			}
			if n == 1 {
				continue
			}
			// a ring: even ranks send first
			seed++
			next, prev := (me+1)%n, (me+n-1)%n
			send := onGPU(commtest.Fill(dt, size, seed, wr, 0))
			recv := onGPU(comm.MakeBuffer(dt, size))
			steps := []func() error{
				func() error { return g.SendTensor(ctx, send, next) },
				func() error { return g.RecvTensor(ctx, recv, prev) },
			}
			if me%2 == 1 {
				steps[0], steps[1] = steps[1], steps[0]
			}
			for _, s := range steps {
				if err := s(); err != nil {
					return fmt.Errorf("send/recv %v n=%d: %w", dt, size, err)
				}
			}
			if err := compare(me, fmt.Sprintf("send/recv %v n=%d", dt, size), fromGPU(recv), func(i int) float64 { return float64(commtest.Value(seed, members[prev], i)) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// gpuWorld joins a world of one GPU, or skips the test without one.
func gpuWorld(t *testing.T) *Group {
	t.Helper()
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skip("no GPU: ", err)
	}
	g, err := Join(context.Background(), Config{WorldSize: 1, Timeout: time.Minute})
	if err != nil {
		t.Skip("no NCCL: ", err)
	}
	return g
}

func TestGPUNCCLWorldOfOne(t *testing.T) {
	g := gpuWorld(t)
	defer g.Close()
	if err := gpuSuite(context.Background(), g); err != nil {
		t.Fatal(err)
	}
}

// gpuCount is the number of GPUs for the multi-process test:
// GOTRON_NCCL_TEST_GPUS, else nvidia-smi's list, else 0.
func gpuCount() int {
	if v := os.Getenv("GOTRON_NCCL_TEST_GPUS"); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	out, err := exec.Command("nvidia-smi", "-L").Output()
	if err != nil {
		return 0
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "GPU ") {
			n++
		}
	}
	return n
}

// One process per GPU, every GPU of the machine: the suite at world size
// 2 and up, sub-groups included.
func TestGPUNCCLWorld(t *testing.T) {
	n := gpuCount()
	if n < 2 {
		t.Skipf("%d GPUs: the multi-process world needs 2 or more", n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	for r := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), workerEnv+"=1", "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r),
			"WORLD_SIZE="+strconv.Itoa(n), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		outs[r] = new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	for r, cmd := range cmds {
		err := cmd.Wait()
		if err != nil || !slices.Contains(strings.Split(outs[r].String(), "\n"), "OK") {
			t.Errorf("rank %d of %d: %v\n%s", r, n, err, outs[r])
		}
	}
}

// batchSuite runs BatchSendRecvTensors on every dtype: a ring both ways,
// every rank listing its sends first (it deadlocks unless NCCL groups
// them); with one rank, to itself.
func batchSuite(ctx context.Context, g *Group) error {
	n, me := g.Size(), g.Rank()
	members := g.Ranks()
	wr := members[me]
	seed := 9000
	for _, dt := range commtest.DTypes {
		for _, size := range []int{1, 7*n + 3, 5000 + n} {
			// a batched ring both ways, every rank listing its sends
			// first (deadlocks unless NCCL groups them); with one rank,
			// to itself
			seed += 2
			next, prev := (me+1)%n, (me+n-1)%n
			toNext := onGPU(commtest.Fill(dt, size, seed, wr, 0))
			toPrev := onGPU(commtest.Fill(dt, size+1, seed+1, wr, 0))
			fromPrev, fromNext := onGPU(comm.MakeBuffer(dt, size)), onGPU(comm.MakeBuffer(dt, size+1))
			err := g.BatchSendRecvTensors(ctx, []comm.TensorP2P{
				{Kind: comm.SendOp, Peer: next, T: toNext}, {Kind: comm.SendOp, Peer: prev, T: toPrev},
				{Kind: comm.RecvOp, Peer: prev, T: fromPrev}, {Kind: comm.RecvOp, Peer: next, T: fromNext},
			})
			if err != nil {
				return fmt.Errorf("batch_isend_irecv %v n=%d: %w", dt, size, err)
			}
			if err := compare(me, fmt.Sprintf("batched recv from prev %v n=%d", dt, size), fromGPU(fromPrev), func(i int) float64 { return float64(commtest.Value(seed, members[prev], i)) }); err != nil {
				return err
			}
			if err := compare(me, fmt.Sprintf("batched recv from next %v n=%d", dt, size+1), fromGPU(fromNext), func(i int) float64 { return float64(commtest.Value(seed+1, members[next], i)) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestCUDABatchSendRecvTensors: BatchSendRecvTensors on a world of one GPU
// (built, not yet run on a GPU: tools/gpu/check.sh unverified).
func TestCUDABatchSendRecvTensors(t *testing.T) {
	g := gpuWorld(t)
	defer g.Close()
	if err := batchSuite(context.Background(), g); err != nil {
		t.Fatal(err)
	}
}
