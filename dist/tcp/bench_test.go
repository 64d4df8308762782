package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/dist"
	"github.com/gotron/gotron/dist/tcp"
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
			bufs := []dist.Buffer{dist.MakeBuffer(dist.Float32, size/4), dist.MakeBuffer(dist.Float32, size/4)}
			b.SetBytes(int64(size)) // busbw = algbw for n = 2
			b.ReportAllocs()
			b.ResetTimer()
			done := make(chan error, 1)
			go func() {
				for range b.N {
					if err := groups[1].AllReduce(context.Background(), bufs[1], dist.Sum); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := groups[0].AllReduce(context.Background(), bufs[0], dist.Sum); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
