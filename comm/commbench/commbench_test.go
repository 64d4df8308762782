package commbench_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commbench"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/comm/tcp"
)

func TestBusFactor(t *testing.T) {
	cases := []struct {
		op   string
		n    int
		want float64
	}{
		{"all_reduce", 4, 1.5}, {"all_reduce", 2, 1}, {"all_reduce", 1, 0},
		{"reduce_scatter", 4, 0.75}, {"all_gather", 8, 0.875}, {"all_to_all", 2, 0.5},
		{"broadcast", 8, 1}, {"reduce", 3, 1}, {"sendrecv", 5, 1},
	}
	for _, c := range cases {
		if got := commbench.BusFactor(c.op, c.n); got != c.want {
			t.Errorf("BusFactor(%s, %d) = %v, want %v", c.op, c.n, got, c.want)
		}
	}
}

// TestRun times every op on 3 inproc ranks with a fake clock that advances
// 1 ms per reading, so the numbers are exact.
func TestRun(t *testing.T) {
	var results [3][]commbench.Result
	err := inproc.Run(t.Context(), 3, func(ctx context.Context, pg comm.ProcessGroup) error {
		now := time.Unix(0, 0)
		cfg := commbench.Config{Ops: commbench.Ops, MinBytes: 8, MaxBytes: 64, MaxIters: 4,
			Now: func() time.Time { now = now.Add(time.Millisecond); return now }}
		r, err := commbench.Run(ctx, pg, cfg)
		results[pg.Rank()] = r
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r := results[0]
	// Sizes 8..64 bytes: 4 rows per op, except the ops splitting over 3
	// ranks, which skip 8 bytes (2 floats < 3 ranks).
	if len(r) != 4*len(commbench.Ops)-3 {
		t.Fatalf("%d rows, want %d: %+v", len(r), 4*len(commbench.Ops)-3, r)
	}
	for _, x := range r {
		// Each timing spans exactly two clock readings: 1 ms for all iters.
		if want := 1e-3 / float64(x.Iters); x.Seconds != want {
			t.Errorf("%s %d B: %v s per op, want %v", x.Op, x.Bytes, x.Seconds, want)
		}
		if x.BusBW != x.AlgBW*commbench.BusFactor(x.Op, 3) || x.AlgBW != float64(x.Bytes)/x.Seconds {
			t.Errorf("%s %d B: bandwidths %v %v inconsistent", x.Op, x.Bytes, x.AlgBW, x.BusBW)
		}
	}
	var out bytes.Buffer
	commbench.Format(&out, r)
	if !strings.Contains(out.String(), "# sendrecv") || !strings.Contains(out.String(), "busbw(GB/s)") {
		t.Errorf("format:\n%s", out.String())
	}
	if err := (commbench.Config{Ops: []string{"allreduce"}}).Validate(); err == nil {
		t.Error("unknown op accepted")
	}
}

// TestTransportTCP: over the tcp backend every result and the printed
// table say how the bytes moved, and the two settings differ.
func TestTransportTCP(t *testing.T) {
	for _, c := range []struct {
		noShm bool
		want  string
	}{{false, "# transport: shm (1 of 1 peers"}, {true, "# transport: socket (0 of 1 peers"}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		var results [2][]commbench.Result
		var errs [2]error
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := tcp.Join(t.Context(), tcp.Config{Rank: r, WorldSize: 2, MasterPort: port, Timeout: 30 * time.Second, NoShm: c.noShm})
				if err != nil {
					errs[r] = err
					return
				}
				defer g.Close()
				results[r], errs[r] = commbench.Run(t.Context(), g, commbench.Config{MinBytes: 1 << 20, MaxBytes: 1 << 20, MaxIters: 2})
				if errs[r] == nil {
					errs[r] = g.Barrier(t.Context())
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		commbench.Format(&out, results[0])
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("NoShm=%v: want %q in\n%s", c.noShm, c.want, out.String())
		}
	}
}

// TestMemcpyThreadsClock: with a clock that advances one second per
// reading, each repetition copies 4 buffers whatever the thread count
// (odd sizes split unevenly), so the rate is exactly 4·size per second.
func TestMemcpyThreadsClock(t *testing.T) {
	for _, threads := range []int{0, 1, 2, 3} {
		var tick int64
		now := func() time.Time { tick++; return time.Unix(tick, 0) }
		if got, want := commbench.MemcpyThreads(1001, threads, 3, now), 4*1001.0; got != want {
			t.Errorf("threads=%d: %v bytes/s, want %v", threads, got, want)
		}
	}
}
