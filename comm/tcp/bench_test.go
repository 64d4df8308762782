package tcp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/tensor"
)

// BenchmarkAllReduce runs 2 ranks as goroutines of this process (each with
// its own Join, so they still talk over loopback TCP) and reports busbw as
// bytes/s and allocations per all-reduce of one rank.
func BenchmarkAllReduce(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("n=2/bytes=%d", size), func(b *testing.B) {
			const n = 2
			port := freePortAny(b)
			groups := make([]*tcp.Group, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g, err := tcp.Join(context.Background(), tcp.Config{Rank: r, WorldSize: n, MasterPort: port, Timeout: time.Minute})
					if err != nil {
						b.Error(err)
					}
					groups[r] = g
				}()
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			defer func() {
				for _, g := range groups {
					g.Close()
				}
			}()
			bufs := []comm.Buffer{comm.MakeBuffer(tensor.Float32, size/4), comm.MakeBuffer(tensor.Float32, size/4)}
			b.SetBytes(int64(size)) // busbw = algbw for n = 2
			b.ReportAllocs()
			b.ResetTimer()
			done := make(chan error, 1)
			go func() {
				for range b.N {
					if err := groups[1].AllReduce(context.Background(), bufs[1], comm.Sum); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := groups[0].AllReduce(context.Background(), bufs[0], comm.Sum); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestAllReduceAllocs: once set up, a large all-reduce through the group
// region allocates nothing, and one through the pair rings allocates per
// ring step (its sender goroutine), not per chunk: four times the bytes in
// 64 KiB chunks is 192 more chunk sends and receives for the two ranks,
// and must cost at most a handful more allocations (pools may miss).
func TestAllReduceAllocs(t *testing.T) {
	for _, slot := range []int{0, -1} {
		t.Run(fmt.Sprintf("ShmSlotBytes=%d", slot), func(t *testing.T) {
			groups := joinLocal(t, 2, tcp.Config{Timeout: time.Minute, ShmSlotBytes: slot, ChunkBytes: 64 << 10})
			measure := func(elems int) float64 {
				bufs := []comm.Buffer{comm.MakeBuffer(tensor.Float32, elems), comm.MakeBuffer(tensor.Float32, elems)}
				start, done := make(chan struct{}), make(chan error)
				go func() {
					for range start {
						done <- groups[1].AllReduce(t.Context(), bufs[1], comm.Sum)
					}
				}()
				defer close(start)
				var err error
				step := func() {
					start <- struct{}{}
					err = errors.Join(err, groups[0].AllReduce(t.Context(), bufs[0], comm.Sum), <-done)
				}
				for range 3 { // set-up: the region, timers, pools
					step()
				}
				allocs := testing.AllocsPerRun(20, step)
				if err != nil {
					t.Fatal(err)
				}
				return allocs
			}
			small, large := measure(1<<18), measure(1<<20)
			if st := groups[0].Stats(); (slot == 0) != (st.RegionBytes > 0) {
				t.Fatalf("ShmSlotBytes %d: %+v: region used %v", slot, st, st.RegionBytes > 0)
			}
			switch {
			case slot == 0 && (small >= 1 || large >= 1):
				t.Errorf("region: %.1f and %.1f allocations per 1 and 4 MiB all-reduce of two ranks, want none", small, large)
			case slot < 0 && large > small+16 && !raceEnabled:
				t.Errorf("rings: %.1f allocations per 1 MiB all-reduce of two ranks, %.1f per 4 MiB: allocating per chunk", small, large)
			}
			t.Logf("allocations per all-reduce of two ranks: %.1f (1 MiB), %.1f (4 MiB)", small, large)
		})
	}
}
