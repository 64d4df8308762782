package inproc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

func TestConformance(t *testing.T) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			t.Parallel()
			if err := inproc.Run(t.Context(), n, commtest.Conformance); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConcurrentGroups(t *testing.T) {
	for _, n := range []int{2, 5} {
		err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
			return commtest.ConcurrentGroups(ctx, pg, 10)
		})
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
	}
}

// TestManyRanks runs all-reduce on 64 ranks, the backend's stated maximum
// in tests.
func TestManyRanks(t *testing.T) {
	const n = 64
	err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
		buf := commtest.Fill(tensor.Float32, 333, 5, pg.Rank(), 0)
		if err := pg.AllReduce(ctx, buf, comm.Sum); err != nil {
			return err
		}
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		for i, v := range buf.Float32() {
			if want := commtest.ReduceRef(tensor.Float32, comm.Sum, 5, all, i); float64(v) != want {
				return fmt.Errorf("element %d = %v, want %v", i, v, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeterministicRankOrder checks that float32 all-reduce of random data
// is bit-identical to summing in rank order, run after run.
func TestDeterministicRankOrder(t *testing.T) {
	const n, size = 5, 4099
	in := make([][]float32, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for r := range in {
		in[r] = make([]float32, size)
		for i := range in[r] {
			in[r][i] = float32(rng.NormFloat64()) * 1e3
		}
	}
	want := make([]float32, size)
	for i := range want {
		s := in[0][i]
		for r := 1; r < n; r++ {
			s += in[r][i]
		}
		want[i] = s
	}
	for trial := range 3 {
		err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
			buf := append([]float32(nil), in[pg.Rank()]...)
			if err := pg.AllReduce(ctx, comm.Float32s(buf), comm.Sum); err != nil {
				return err
			}
			for i := range buf {
				if buf[i] != want[i] {
					return fmt.Errorf("trial %d: element %d = %v, want %v (rank-order sum)", trial, i, buf[i], want[i])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// runWorld runs fn on every rank of w and returns each rank's error.
func runWorld(w *inproc.World, fn func(pg *inproc.Group) error) []error {
	errs := make([]error, w.Size())
	var wg sync.WaitGroup
	for r := range w.Size() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(w.Group(r))
		}()
	}
	wg.Wait()
	return errs
}

// TestKilledRank kills rank 3 as it starts its second all-reduce: every
// rank, including 3, must return a RankError naming rank 3 (not hang).
func TestKilledRank(t *testing.T) {
	for _, op := range []string{comm.OpAllReduce, comm.OpBroadcast, comm.OpRecv} {
		t.Run(op, func(t *testing.T) {
			var w *inproc.World
			var mu sync.Mutex
			calls := 0
			w, err := inproc.New(inproc.Config{Size: 6, Hook: func(rank int, o string) {
				mu.Lock()
				defer mu.Unlock()
				if rank == 3 && o == comm.OpAllReduce {
					calls++
					if calls == 2 {
						w.Kill(3)
					}
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			errs := runWorld(w, func(pg *inproc.Group) error {
				ctx := t.Context()
				buf := comm.Float32s(make([]float32, 100))
				if err := pg.AllReduce(ctx, buf, comm.Sum); err != nil {
					return fmt.Errorf("first all_reduce: %w", err)
				}
				switch {
				case op == comm.OpRecv && pg.Rank() != 3:
					return pg.Recv(ctx, buf, 3) // waits on a rank that dies
				case op == comm.OpBroadcast && pg.Rank() != 3:
					return pg.Broadcast(ctx, buf, 0)
				}
				return pg.AllReduce(ctx, buf, comm.Sum)
			})
			for r, err := range errs {
				var re *comm.RankError
				if !errors.As(err, &re) || re.Rank != 3 || !errors.Is(err, comm.ErrPeerLost) {
					t.Errorf("rank %d: got %v, want RankError naming rank 3 wrapping ErrPeerLost", r, err)
				}
			}
		})
	}
}

// TestTimeout: rank 2 never arrives; the others must give up within the
// timeout with a RankError naming rank 2 and wrapping ErrTimeout.
func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	w, err := inproc.New(inproc.Config{Size: 4, Timeout: 50 * time.Millisecond, Hook: func(rank int, op string) {
		if rank == 2 {
			<-release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		if r == 2 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = w.Group(r).AllReduce(t.Context(), comm.Float32s(make([]float32, 8)), comm.Sum)
		}()
	}
	wg.Wait()
	close(release)
	for r, err := range errs {
		if r == 2 {
			continue
		}
		var re *comm.RankError
		if !errors.As(err, &re) || re.Rank != 2 || re.Op != comm.OpAllReduce || !errors.Is(err, comm.ErrTimeout) {
			t.Errorf("rank %d: got %v, want all_reduce RankError naming rank 2 wrapping ErrTimeout", r, err)
		}
	}
	// The group is broken now: rank 2's late call fails at once too.
	if err := w.Group(2).AllReduce(t.Context(), comm.Float32s(make([]float32, 8)), comm.Sum); !errors.Is(err, comm.ErrTimeout) {
		t.Errorf("rank 2 after the timeout: got %v, want ErrTimeout", err)
	}
}

// TestMismatch: ranks disagreeing on length, op or root get a RankError
// naming the odd rank, wrapping ErrMismatch, and the group stays usable.
func TestMismatch(t *testing.T) {
	cases := []struct {
		name string
		call func(ctx context.Context, pg comm.ProcessGroup) error
	}{
		{"length", func(ctx context.Context, pg comm.ProcessGroup) error {
			n := 10
			if pg.Rank() == 2 {
				n = 11
			}
			return pg.AllReduce(ctx, comm.MakeBuffer(tensor.Float32, n), comm.Sum)
		}},
		{"dtype", func(ctx context.Context, pg comm.ProcessGroup) error {
			dt := tensor.Float32
			if pg.Rank() == 2 {
				dt = tensor.Int32
			}
			return pg.AllReduce(ctx, comm.MakeBuffer(dt, 4), comm.Sum)
		}},
		{"op", func(ctx context.Context, pg comm.ProcessGroup) error {
			if pg.Rank() == 2 {
				return pg.Broadcast(ctx, comm.MakeBuffer(tensor.Float32, 4), 0)
			}
			return pg.AllReduce(ctx, comm.MakeBuffer(tensor.Float32, 4), comm.Sum)
		}},
		{"root", func(ctx context.Context, pg comm.ProcessGroup) error {
			return pg.Broadcast(ctx, comm.MakeBuffer(tensor.Float32, 4), min(pg.Rank(), 2)/2*1)
		}},
		{"bad root", func(ctx context.Context, pg comm.ProcessGroup) error {
			root := 0
			if pg.Rank() == 2 {
				root = 9
			}
			return pg.Reduce(ctx, comm.MakeBuffer(tensor.Float32, 4), comm.Sum, root)
		}},
		{"uneven split", func(ctx context.Context, pg comm.ProcessGroup) error {
			n := 8
			if pg.Rank() == 2 {
				n = 9
			}
			return pg.ReduceScatter(ctx, comm.MakeBuffer(tensor.Float32, 2), comm.MakeBuffer(tensor.Float32, n), comm.Sum, nil)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := inproc.Run(t.Context(), 4, func(ctx context.Context, pg comm.ProcessGroup) error {
				err := tc.call(ctx, pg)
				var re *comm.RankError
				if !errors.As(err, &re) || re.Rank != 2 || !errors.Is(err, comm.ErrMismatch) {
					return fmt.Errorf("got %v, want RankError naming rank 2 wrapping ErrMismatch", err)
				}
				// Still usable.
				return pg.AllReduce(ctx, comm.MakeBuffer(tensor.Int64, 3), comm.Sum)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCloseUnblocks: closing the world while ranks wait returns ErrClosed.
func TestCloseUnblocks(t *testing.T) {
	w, err := inproc.New(inproc.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Group(0).Barrier(t.Context()) }()
	go func() { done <- w.Group(1).Recv(t.Context(), comm.MakeBuffer(tensor.Float32, 1), 2) }()
	w.Close()
	for range 2 {
		if err := <-done; !errors.Is(err, comm.ErrClosed) {
			t.Errorf("got %v, want ErrClosed", err)
		}
	}
}

// TestContextCancel: one rank's context ends mid-wait; it gets the context
// error and the others a RankError naming it.
func TestContextCancel(t *testing.T) {
	w, err := inproc.New(inproc.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 2 { // rank 2 never calls
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := t.Context()
			if r == 1 {
				c = ctx
			}
			errs[r] = w.Group(r).Barrier(c)
		}()
	}
	cancel()
	wg.Wait()
	if !errors.Is(errs[1], context.Canceled) {
		t.Errorf("rank 1: got %v, want context.Canceled", errs[1])
	}
	var re *comm.RankError
	if !errors.As(errs[0], &re) || re.Rank != 1 || !errors.Is(errs[0], comm.ErrPeerLost) {
		t.Errorf("rank 0: got %v, want RankError naming rank 1 wrapping ErrPeerLost", errs[0])
	}
}

// TestCancelRacingCompletion: a rank's context ends just as the last peer
// arrives. Whatever the rank is told, its buffer is its own again when the
// call returns: on an error no peer writes it any more (the race detector
// sees the write below), and on success it holds the sum. A rank that
// arrives with its context already over never completes the round.
func TestCancelRacingCompletion(t *testing.T) {
	for i := range 200 {
		w, err := inproc.New(inproc.Config{Size: 2, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		bufs := [2][]float32{{1, 2, 3, 4}, {10, 20, 30, 40}}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := t.Context()
				if r == 0 {
					c = ctx
				} else if i%2 == 1 {
					cancel() // cancel and arrive as close together as can be
				}
				errs[r] = w.Group(r).AllReduce(c, comm.Float32s(bufs[r]), comm.Sum)
				if errs[r] != nil {
					bufs[r][0] = -1 // the caller's again
				}
			}()
		}
		if i%2 == 0 {
			cancel()
		}
		wg.Wait()
		for r, err := range errs {
			if err == nil && bufs[r][3] != 44 {
				t.Fatalf("round %d: rank %d succeeded with %v, want the sum", i, r, bufs[r])
			}
		}
		if (errs[0] == nil) != (errs[1] == nil) {
			t.Fatalf("round %d: one rank succeeded and the other did not: %v, %v", i, errs[0], errs[1])
		}
		_ = w.Close()
	}
	// Already canceled at the call: the round is broken, not completed.
	w, err := inproc.New(inproc.Config{Size: 2, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := t.Context()
			if r == 1 {
				c = ctx // in either order, rank 1's canceled call breaks the round
			}
			errs[r] = w.Group(r).Barrier(c)
		}()
	}
	wg.Wait()
	if !errors.Is(errs[1], context.Canceled) || !errors.Is(errs[0], comm.ErrPeerLost) {
		t.Errorf("canceled at the call: got %v and %v, want ErrPeerLost and context.Canceled", errs[0], errs[1])
	}
}

func TestAsync(t *testing.T) {
	err := inproc.Run(t.Context(), 3, func(ctx context.Context, pg comm.ProcessGroup) error {
		a := comm.NewAsync(pg)
		bufs := make([]comm.Buffer, 4)
		hs := make([]comm.Handle, 4)
		for k := range bufs {
			bufs[k] = comm.Int32s([]int32{int32(pg.Rank() + k)})
			hs[k] = a.AllReduceAsync(ctx, bufs[k], comm.Sum)
		}
		for k := range hs {
			if err := hs[k].Wait(ctx); err != nil {
				return err
			}
			if got, want := bufs[k].Int32()[0], int32(3+3*k); got != want {
				return fmt.Errorf("op %d: got %d, want %d", k, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBadWorld(t *testing.T) {
	if _, err := inproc.New(inproc.Config{Size: 0}); err == nil {
		t.Error("size 0: no error")
	}
	if _, err := inproc.New(inproc.Config{Size: 2, Timeout: -1}); err == nil {
		t.Error("negative timeout: no error")
	}
}

// TestAllReduceChunked: buffers of several all-reduce chunks (1 MiB each
// per rank) in every dtype, back to back so the ticket base advances, with
// one rank arriving late (a hook delays it): whoever reduces a chunk, every
// element must be the rank-order reduction.
func TestAllReduceChunked(t *testing.T) {
	const n = 3
	w, err := inproc.New(inproc.Config{Size: n, Hook: func(rank int, op string) {
		if rank == 2 && op == comm.OpAllReduce {
			time.Sleep(5 * time.Millisecond) // a latecomer, not synchronisation
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ranks := []int{0, 1, 2}
	errs := runWorld(w, func(pg *inproc.Group) error {
		for round, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64, tensor.Float32} {
			count := (3<<20)/dt.Size() + 7 // 3 MiB + 7 elements: 4 chunks of ≥ 1 MiB per rank, the last short
			for _, op := range []comm.ReduceOp{comm.Sum, comm.Max} {
				seed := 10*round + int(op)
				buf := commtest.Fill(dt, count, seed, pg.Rank(), 0)
				if err := pg.AllReduce(t.Context(), buf, op); err != nil {
					return err
				}
				for i := range count {
					if got, want := commtest.Get(buf, i), commtest.ReduceRef(dt, op, seed, ranks, i); got != want {
						return fmt.Errorf("%s %s element %d of %d: %v, want %v", dt, op, i, count, got, want)
					}
				}
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
