package inproc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// BenchmarkAllReduce reports busbw-style throughput (bytes of one rank's
// buffer per second, times 2(n-1)/n) of float32 all-reduce.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("n=%d/bytes=%d", n, size), func(b *testing.B) {
				w, err := inproc.New(inproc.Config{Size: n})
				if err != nil {
					b.Fatal(err)
				}
				bufs := make([]comm.Buffer, n)
				for r := range bufs {
					bufs[r] = comm.MakeBuffer(tensor.Float32, size/4)
				}
				b.SetBytes(int64(float64(size) * 2 * float64(n-1) / float64(n)))
				b.ResetTimer()
				var wg sync.WaitGroup
				for r := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range b.N {
							if err := w.Group(r).AllReduce(context.Background(), bufs[r], comm.Sum); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// BenchmarkReduceN is the float32 reduction kernel alone: 4 sources into 1.
func BenchmarkReduceN(b *testing.B) {
	const n = 1 << 20
	srcs := make([]comm.Buffer, 4)
	for i := range srcs {
		srcs[i] = comm.MakeBuffer(tensor.Float32, n)
	}
	b.SetBytes(int64(len(srcs) * n * 4))
	for range b.N {
		comm.ReduceN(srcs[0], srcs, comm.Sum)
	}
}
