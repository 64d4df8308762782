package cp

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestContextParallelBenchmark measures, for a tiny Llama-style model
// (2 layers, hidden 128, 4 heads, RoPE, SwiGLU, RMSNorm) at each sequence
// length of GOTRON_CP_BENCH_SEQS (default 4096,8192) and CP = 1, 2, 4
// (inproc ranks, p2p): the activation memory one rank's tape holds after
// the forward pass (its peak), the training step time (forward + backward,
// best of 3), and the share of the ring's key/value exchange hidden
// behind compute. A benchmark, not a check: it runs only with
// GOTRON_CP_BENCH=1 (docs/distributed.md has the numbers).
func TestContextParallelBenchmark(t *testing.T) {
	if os.Getenv("GOTRON_CP_BENCH") != "1" {
		t.Skip("set GOTRON_CP_BENCH=1 to run the context-parallel benchmark")
	}
	seqs := []int{4096, 8192}
	if s := os.Getenv("GOTRON_CP_BENCH_SEQS"); s != "" {
		seqs = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 || n%8 != 0 {
				t.Fatalf("GOTRON_CP_BENCH_SEQS: %q: want positive multiples of 8", f)
			}
			seqs = append(seqs, n)
		}
	}
	for _, seq := range seqs {
		for _, size := range []int{1, 2, 4} {
			cfg := gpt.Config{NumLayers: 2, HiddenSize: 128, NumAttentionHeads: 4, VocabSize: 256, MaxPositionEmbeddings: seq,
				PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, DisableBiasLinear: true}
			var mu sync.Mutex
			var live int
			var step time.Duration
			var exch, waited time.Duration
			err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
				m, err := gpt.New(cfg, tensor.NewRNG(1).Fork("init"))
				if err != nil {
					return err
				}
				a := &Attention{Group: pg}
				if size > 1 {
					m.ContextParallel = a
				}
				pos, err := Positions(seq, size, pg.Rank())
				if err != nil {
					return err
				}
				n := len(pos)
				tok, lab, p32 := make([]int32, n), make([]int32, n), make([]int32, n)
				for i, p := range pos {
					tok[i], lab[i], p32[i] = int32(p*31%256), int32((p+1)*31%256), int32(p)
				}
				bt := gpt.Batch{Tokens: tensor.FromInt32(tok, 1, n), Labels: tensor.FromInt32(lab, 1, n), Positions: tensor.FromInt32(p32, 1, n)}
				tp := tensor.NewTape()
				tp.SetContext(ctx)
				tp.SetReleaseInBackward(true)
				best, peak := time.Duration(1<<62), 0
				for range 3 {
					start := time.Now()
					loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
					peak = max(peak, tp.LiveFloats())
					if err := tp.Backward(loss); err != nil {
						return err
					}
					best = min(best, time.Since(start))
					tp.Reset()
				}
				if pg.Rank() == 0 {
					mu.Lock()
					live, step = peak, best
					exch, waited = a.Overlap()
					mu.Unlock()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			hidden := "-"
			if exch > 0 {
				hidden = fmt.Sprintf("%.0f%%", 100*(1-float64(waited)/float64(exch)))
			}
			t.Logf("seq %6d CP=%d: rank 0 activations %8.1f MB, step %8.1f ms, ring exchange %7.1f ms (3 steps), waited %7.1f ms, hidden %s",
				seq, size, float64(live)*4/1e6, float64(step.Microseconds())/1e3, float64(exch.Microseconds())/1e3, float64(waited.Microseconds())/1e3, hidden)
		}
	}
}
