// Package commbench times comm collectives the way nccl-tests does and
// measures the two ceilings they are compared with: memcpy bandwidth (for
// the inproc backend) and single-stream loopback TCP throughput (for tcp).
//
// Definitions (nccl-tests, doc/PERFORMANCE.md). For a buffer of S bytes and
// a time t per operation on n ranks, algbw = S/t and busbw = algbw·f with
//
//	all_reduce      f = 2(n-1)/n   (S = the buffer reduced)
//	reduce_scatter  f = (n-1)/n    (S = each rank's full input)
//	all_gather      f = (n-1)/n    (S = each rank's full output)
//	all_to_all      f = (n-1)/n    (S = each rank's input)
//	broadcast       f = 1
//	reduce          f = 1
//	sendrecv        f = 1          (each rank sends S to the next, receives S from the previous)
//
// busbw is the per-link rate a ring algorithm needs, so it can be compared
// with the hardware's peak whatever n is. t is the mean over the timed
// iterations, taken on the slowest rank.
package commbench

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Ops lists the operations Run knows, in report order.
var Ops = []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "sendrecv"}

// BusFactor returns busbw/algbw for op on n ranks (see the package doc).
func BusFactor(op string, n int) float64 {
	fn := float64(n)
	switch op {
	case "all_reduce":
		return 2 * (fn - 1) / fn
	case "reduce_scatter", "all_gather", "all_to_all":
		return (fn - 1) / fn
	}
	return 1
}

// Config says what to time. The zero value times all_reduce on 8 B … 64 MiB.
type Config struct {
	Ops      []string      // operations (nil: all_reduce)
	MinBytes int           // smallest size (0: 8)
	MaxBytes int           // largest size, doubling from MinBytes (0: 64 MiB)
	Budget   time.Duration // target time per size, sets the iteration count (0: 200ms)
	MaxIters int           // cap on timed iterations per size (0: 1000)
	Now      func() time.Time
}

func (c *Config) fill() {
	if c.Ops == nil {
		c.Ops = []string{"all_reduce"}
	}
	if c.MinBytes == 0 {
		c.MinBytes = 8
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 64 << 20
	}
	if c.Budget == 0 {
		c.Budget = 200 * time.Millisecond
	}
	if c.MaxIters == 0 {
		c.MaxIters = 1000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks the op names and sizes.
func (c Config) Validate() error {
	for _, op := range c.Ops {
		if !slices.Contains(Ops, op) {
			return fmt.Errorf("unknown op %q (want %s)", op, strings.Join(Ops, ", "))
		}
	}
	if c.MinBytes < 0 || c.MaxBytes < 0 || (c.MaxBytes != 0 && c.MinBytes > c.MaxBytes) {
		return fmt.Errorf("sizes %d..%d bytes: want 0 < min ≤ max", c.MinBytes, c.MaxBytes)
	}
	return nil
}

// Result is one row of the report.
type Result struct {
	Op      string
	Bytes   int     // S
	Count   int     // float32 elements per rank
	Iters   int     // timed iterations
	Seconds float64 // mean time per operation, slowest rank
	AlgBW   float64 // bytes/s
	BusBW   float64 // bytes/s
	// Transport is how the ranks' bytes moved, from the group's
	// TransportName method (tcp: "shm (3 of 3 peers through shared
	// memory)", "socket (...)"); "" when the group has none (inproc).
	Transport string
}

// Transporter is implemented by groups that can say how their bytes move
// (the tcp backend: shared memory or sockets).
type Transporter interface {
	TransportName() string
}

// Run times cfg's operations on pg with float32 buffers. Every rank of pg
// must call it; all get the same results (times are the slowest rank's).
func Run(ctx context.Context, pg comm.ProcessGroup, cfg Config) ([]Result, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := pg.Size()
	var out []Result
	for _, op := range cfg.Ops {
		for size := cfg.MinBytes; size <= cfg.MaxBytes; size *= 2 {
			count := size / 4
			if op == "reduce_scatter" || op == "all_gather" || op == "all_to_all" {
				count = count / n * n
			}
			if count == 0 {
				continue
			}
			f, err := prepare(pg, op, count)
			if err != nil {
				return nil, err
			}
			// One warm-up, timed to pick the iteration count (agreed by all).
			d, err := timeIters(ctx, pg, cfg.Now, f, 1)
			if err != nil {
				return nil, fmt.Errorf("%s %d bytes: %w", op, size, err)
			}
			iters := int(min(float64(cfg.MaxIters), max(3, float64(cfg.Budget)/max(d, 1e-9)/1e9)))
			d, err = timeIters(ctx, pg, cfg.Now, f, iters)
			if err != nil {
				return nil, fmt.Errorf("%s %d bytes: %w", op, size, err)
			}
			bytes := count * 4
			alg := float64(bytes) / d
			out = append(out, Result{Op: op, Bytes: bytes, Count: count, Iters: iters, Seconds: d, AlgBW: alg, BusBW: alg * BusFactor(op, n)})
		}
	}
	if t, ok := pg.(Transporter); ok { // after the runs: a route may be set up on first use
		for i := range out {
			out[i].Transport = t.TransportName()
		}
	}
	return out, nil
}

// timeIters runs f iters times between barriers and returns the slowest
// rank's mean seconds per call.
func timeIters(ctx context.Context, pg comm.ProcessGroup, now func() time.Time, f func(context.Context) error, iters int) (float64, error) {
	if err := pg.Barrier(ctx); err != nil {
		return 0, err
	}
	t0 := now()
	for range iters {
		if err := f(ctx); err != nil {
			return 0, err
		}
	}
	ns := []int64{now().Sub(t0).Nanoseconds()}
	if err := pg.AllReduce(ctx, comm.Int64s(ns), comm.Max); err != nil {
		return 0, err
	}
	return float64(ns[0]) / 1e9 / float64(iters), nil
}

// prepare allocates op's buffers for count float32 elements and returns
// one call of it.
func prepare(pg comm.ProcessGroup, op string, count int) (func(context.Context) error, error) {
	n, me := pg.Size(), pg.Rank()
	a := comm.MakeBuffer(tensor.Float32, count)
	for i, p := 0, a.Float32(); i < len(p); i++ {
		p[i] = float32(i%7) - 3
	}
	switch op {
	case "all_reduce":
		return func(ctx context.Context) error { return pg.AllReduce(ctx, a, comm.Sum) }, nil
	case "reduce_scatter":
		out := comm.MakeBuffer(tensor.Float32, count/n)
		return func(ctx context.Context) error { return pg.ReduceScatter(ctx, out, a, comm.Sum, nil) }, nil
	case "all_gather":
		in := comm.MakeBuffer(tensor.Float32, count/n)
		return func(ctx context.Context) error { return pg.AllGather(ctx, a, in, nil) }, nil
	case "broadcast":
		return func(ctx context.Context) error { return pg.Broadcast(ctx, a, 0) }, nil
	case "reduce":
		return func(ctx context.Context) error { return pg.Reduce(ctx, a, comm.Sum, 0) }, nil
	case "all_to_all":
		out := comm.MakeBuffer(tensor.Float32, count)
		return func(ctx context.Context) error { return pg.AllToAll(ctx, out, a, nil, nil) }, nil
	case "sendrecv":
		in := comm.MakeBuffer(tensor.Float32, count)
		next, prev := (me+1)%n, (me+n-1)%n
		if n == 1 {
			return func(context.Context) error { copy(in.Data, a.Data); return nil }, nil
		}
		if b, ok := pg.(comm.BatchSendRecv); ok {
			ops := []comm.P2POp{{Kind: comm.RecvOp, Peer: prev, Buf: in}, {Kind: comm.SendOp, Peer: next, Buf: a}}
			return func(ctx context.Context) error { return b.BatchSendRecv(ctx, ops) }, nil
		}
		return func(ctx context.Context) error {
			if me%2 == 0 {
				if err := pg.Send(ctx, a, next); err != nil {
					return err
				}
				return pg.Recv(ctx, in, prev)
			}
			if err := pg.Recv(ctx, in, prev); err != nil {
				return err
			}
			return pg.Send(ctx, a, next)
		}, nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

// Memcpy returns the median over reps of copy() bandwidth between two
// buffers of size bytes on one goroutine, in bytes copied per second (the
// read is not counted, as busbw does not count it). Go's copy streams
// copies of 1 MiB and more with non-temporal stores.
func Memcpy(size, reps int, now func() time.Time) float64 {
	return MemcpyThreads(size, 1, reps, now)
}

// MemcpyThreads is Memcpy with the buffers split into threads equal parts
// copied by as many goroutines at once: the aggregate bandwidth of several
// cores, which one goroutine's copy may not reach.
func MemcpyThreads(size, threads, reps int, now func() time.Time) float64 {
	threads = max(threads, 1)
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i) // written, so the reads are not of the shared zero page
	}
	copy(dst, src) // fault the pages in
	rates := make([]float64, reps)
	var wg sync.WaitGroup
	for r := range rates {
		t0 := now()
		for k := range threads {
			lo, hi := k*size/threads, (k+1)*size/threads
			wg.Go(func() {
				for range 4 {
					copy(dst[lo:hi], src[lo:hi])
				}
			})
		}
		wg.Wait()
		rates[r] = 4 * float64(size) / now().Sub(t0).Seconds()
	}
	return median(rates)
}

// Loopback returns the throughput of one TCP stream over 127.0.0.1 moving
// total bytes in writes of chunk bytes, in bytes per second, measured when
// the reader has received everything.
func Loopback(ctx context.Context, total, chunk int, now func() time.Time) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("loopback: %w", err)
	}
	defer ln.Close()
	type result struct {
		n   int64
		end time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		n, err := io.CopyBuffer(io.Discard, c, make([]byte, chunk))
		got <- result{n, now(), err}
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("loopback: %w", err)
	}
	buf := make([]byte, chunk)
	t0 := now()
	for sent := 0; sent < total; sent += chunk {
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return 0, fmt.Errorf("loopback: %w", err)
		}
	}
	c.Close()
	r := <-got
	if r.err != nil {
		return 0, fmt.Errorf("loopback: %w", r.err)
	}
	return float64(r.n) / r.end.Sub(t0).Seconds(), nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// Format writes results as nccl-tests-style tables, one per op.
func Format(w io.Writer, results []Result) {
	op := ""
	for _, r := range results {
		if r.Op != op {
			op = r.Op
			if r.Transport != "" {
				fmt.Fprintf(w, "\n# transport: %s", r.Transport)
			}
			fmt.Fprintf(w, "\n# %s\n# %12s %12s %7s %12s %12s %12s\n", op, "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
		}
		fmt.Fprintf(w, "  %12d %12d %7d %12.3f %12.3f %12.3f\n", r.Bytes, r.Count, r.Iters, r.Seconds*1e6, r.AlgBW/1e9, r.BusBW/1e9)
	}
}
