package pp

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Measurements for docs/design/parallel.md ("Pipeline parallelism"); not
// tests. Run:
//
//	go test ./parallel/pp -run '^$' -bench 'Pipeline' -benchtime 5x

// sleepFn is a pass of fixed duration: forward waits fwd, backward bwd.
// A sleeping stage measures the schedule and the executor (communication,
// bookkeeping) without the ranks competing for this machine's 2 cores, as
// real compute on 4 goroutine ranks would.
type sleepFn struct{ fwd, bwd time.Duration }

func (f sleepFn) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	time.Sleep(f.fwd)
	return []*tensor.Tensor{in[0].Clone()}
}

func (f sleepFn) Backward(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
	time.Sleep(f.bwd)
	return []*tensor.Tensor{g[0].Clone()}
}

// sleepStage scales its (b, h) input by a parameter, then sleeps; the
// model's last stage returns the mean.
type sleepStage struct {
	w         *tensor.Tensor
	x         *tensor.Tensor
	fn        sleepFn
	first     bool
	last      bool
	inputDims []int
}

func (s *sleepStage) Forward(tp *tensor.Tape, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if s.first {
		in = s.x
	}
	y := tp.Apply(s.fn, tp.Mul(in, s.w))[0]
	if s.last {
		return tp.Mean(y), nil
	}
	return y, nil
}

func (s *sleepStage) InputShape(int) []int { return s.inputDims }

// bubbleRun is one step's timing on every rank.
type bubbleRun struct {
	makespan time.Duration   // first rank's start to last rank's end
	compute  []time.Duration // per rank: forward + backward
}

// measureBubble runs steps steps of cfg on sleeping stages over inproc
// ranks (after one warm-up step) and returns each step's timing.
func measureBubble(b *testing.B, cfg Config, fn sleepFn, steps int) []bubbleRun {
	c := cfg.withDefaults()
	w, err := inproc.New(inproc.Config{Size: c.PP})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	runs := make([]bubbleRun, steps)
	starts := make([][]time.Time, steps)
	ends := make([][]time.Time, steps)
	for i := range runs {
		runs[i].compute = make([]time.Duration, c.PP)
		starts[i], ends[i] = make([]time.Time, c.PP), make([]time.Time, c.PP)
	}
	var wg sync.WaitGroup
	for r := range c.PP {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			pg := w.Group(r)
			var stages []Stage
			for ch := range c.VPP {
				s := ch*c.PP + r
				w := tensor.Param(fmt.Sprint("w", s), 4, 16)
				w.Float32s()[0] = 1
				stages = append(stages, &sleepStage{w: w, x: tensor.Zeros(4, 16), fn: fn, first: s == 0,
					last: s == c.PP*c.VPP-1, inputDims: []int{4, 16}})
			}
			e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages})
			if err != nil {
				b.Error(err)
				return
			}
			for i := -1; i < steps; i++ {
				if err := pg.Barrier(ctx); err != nil {
					b.Error(err)
					return
				}
				t0 := time.Now()
				if _, err := e.Step(ctx); err != nil {
					b.Error(err)
					return
				}
				if i >= 0 {
					st := e.Stats()
					starts[i][r], ends[i][r] = t0, time.Now()
					runs[i].compute[r] = st.Forward + st.Backward
				}
			}
		}()
	}
	wg.Wait()
	for i := range runs {
		lo, hi := starts[i][0], ends[i][0]
		for r := range c.PP {
			lo, hi = minTime(lo, starts[i][r]), maxTime(hi, ends[i][r])
		}
		runs[i].makespan = hi.Sub(lo)
	}
	return runs
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// BenchmarkPipelineBubble measures the pipeline bubble, idle time over
// compute time per stage ((makespan − compute_r)/compute_r, the definition
// of (PP−1)/(VPP·M) in Narayanan et al. 2021), on inproc ranks whose
// chunks take F forward and 2F backward (F = 2 ms and 10 ms: the
// executor's fixed cost per exchange shows as the difference). Reported:
// the mean over stages and steps ("bubble"), the largest stage's
// ("bubble-max") and the theory ("theory").
func BenchmarkPipelineBubble(b *testing.B) {
	for _, fwd := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} {
		b.Run(fmt.Sprintf("F=%v", fwd), func(b *testing.B) { benchBubble(b, sleepFn{fwd: fwd, bwd: 2 * fwd}) })
	}
}

func benchBubble(b *testing.B, fn sleepFn) {
	for _, p := range []int{2, 4} {
		for _, v := range []int{1, 2} {
			for _, m := range []int{4, 8, 16} {
				cfg := Config{PP: p, VPP: v, Microbatches: m}
				if cfg.Validate() != nil {
					continue
				}
				b.Run(fmt.Sprintf("P=%d/V=%d/M=%d", p, v, m), func(b *testing.B) {
					runs := measureBubble(b, cfg, fn, b.N)
					var sum, worst float64
					for _, run := range runs {
						for _, c := range run.compute {
							f := float64(run.makespan-c) / float64(c)
							sum += f
							worst = max(worst, f)
						}
					}
					theory, _ := BubbleFraction(cfg)
					b.ReportMetric(sum/float64(len(runs)*p), "bubble")
					b.ReportMetric(worst, "bubble-max")
					b.ReportMetric(theory, "theory")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// allForwardThenBackward is GPipe's order for one chunk per rank: every
// forward (receive, forward, send), then every backward in micro-batch
// order (receive, backward, send). It keeps the package contract, so the
// executor runs it.
func allForwardThenBackward(cfg Config, rank int) []Action {
	c := cfg.withDefaults()
	var out []Action
	for mb := range c.Microbatches {
		if rank > 0 {
			out = append(out, Action{Op: RecvActivation, Microbatch: mb, Peer: rank - 1})
		}
		out = append(out, Action{Op: Forward, Microbatch: mb})
		if rank < c.PP-1 {
			out = append(out, Action{Op: SendActivation, Microbatch: mb, Peer: rank + 1})
		}
	}
	for mb := range c.Microbatches {
		if rank < c.PP-1 {
			out = append(out, Action{Op: RecvGrad, Microbatch: mb, Peer: rank + 1})
		}
		out = append(out, Action{Op: Backward, Microbatch: mb})
		if rank > 0 {
			out = append(out, Action{Op: SendGrad, Microbatch: mb, Peer: rank - 1})
		}
	}
	return out
}

// memModel is the GPT of the memory measurement: 8 layers, hidden 128,
// micro-batch 2 × 128 tokens.
func memModel(b *testing.B) (*gpt.Model, []gpt.Batch) {
	c := gpt.Config{NumLayers: 8, HiddenSize: 128, NumAttentionHeads: 4, VocabSize: 512, MaxPositionEmbeddings: 128, Activation: gpt.GELUTanh}
	m, err := gpt.New(c, tensor.NewRNG(1))
	if err != nil {
		b.Fatal(err)
	}
	var bts []gpt.Batch
	for i := range 16 {
		tok := make([]int32, 2*128)
		for j := range tok {
			tok[j] = int32((i*131 + j*17) % c.VocabSize)
		}
		bts = append(bts, gpt.Batch{Tokens: tensor.FromInt32(tok, 2, 128), Labels: tensor.FromInt32(tok, 2, 128)})
	}
	return m, bts
}

// tapeBytes is what one micro-batch's forward and backward allocate on a
// fresh tape: the activations and activation gradients its arena then
// keeps for reuse (parameter gradients and one-time kernel scratch
// allocated by a first, unmeasured pass).
func tapeBytes(b *testing.B, st *gpt.StageRunner) uint64 {
	passBytes(b, st)
	return passBytes(b, st)
}

func passBytes(b *testing.B, st *gpt.StageRunner) uint64 {
	var in *tensor.Tensor
	if !st.Stage.IsFirst() {
		in = tensor.Zeros(st.InputShape(0)...).SetRequiresGrad(true)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tp := tensor.NewTape()
	out, err := st.Forward(tp, 0, in)
	if err != nil {
		b.Fatal(err)
	}
	if st.Stage.IsLast() {
		err = tp.Backward(out)
	} else {
		err = tp.BackwardFrom([]*tensor.Tensor{out}, []*tensor.Tensor{tensor.Zeros(out.Shape()...)})
	}
	if err != nil {
		b.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// BenchmarkPipelineMemory compares peak activation memory per stage of
// Megatron's 1F1B (and interleaved) schedule with all-forward-then-backward
// (GPipe) on a GPT of 8 layers: the tapes each rank makes (one per
// micro-batch in flight per chunk; reused after backward) times the bytes
// one micro-batch's forward and backward put in a tape's arena. It logs a
// row per rank.
func BenchmarkPipelineMemory(b *testing.B) {
	for _, c := range []struct {
		cfg   Config
		gpipe bool
	}{
		{Config{PP: 2, Microbatches: 8}, false}, {Config{PP: 2, Microbatches: 8}, true},
		{Config{PP: 4, Microbatches: 8}, false}, {Config{PP: 4, Microbatches: 8}, true},
		{Config{PP: 4, Microbatches: 16}, false}, {Config{PP: 4, Microbatches: 16}, true},
		{Config{PP: 2, VPP: 2, Microbatches: 8}, false}, {Config{PP: 4, VPP: 2, Microbatches: 8}, false},
	} {
		name := "1f1b"
		if c.cfg.withDefaults().VPP > 1 {
			name = "interleaved"
		}
		if c.gpipe {
			name = "all-forward-then-backward"
		}
		b.Run(fmt.Sprintf("P=%d/V=%d/M=%d/%s", c.cfg.PP, max(c.cfg.VPP, 1), c.cfg.Microbatches, name), func(b *testing.B) {
			cc := c.cfg.withDefaults()
			full, bts := memModel(b)
			split := gpt.PipelineSplit{PP: cc.PP, VPP: cc.VPP}
			// Each rank's stages, and one micro-batch's arena bytes per
			// chunk, measured one at a time before any rank runs
			// (TotalAlloc is process-wide).
			runners := make([][]Stage, cc.PP)
			bytes := make([][]uint64, cc.PP)
			for r := range cc.PP {
				stages, err := gpt.SplitStages(full, split, r)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range stages {
					st := &gpt.StageRunner{Stage: s, Batches: bts[:cc.Microbatches]}
					runners[r] = append(runners[r], st)
					bytes[r] = append(bytes[r], tapeBytes(b, st))
				}
			}
			tapes := make([][]int, cc.PP)
			inFlight := make([]int, cc.PP)
			for range b.N {
				w, err := inproc.New(inproc.Config{Size: cc.PP})
				if err != nil {
					b.Fatal(err)
				}
				var wg sync.WaitGroup
				for r := range cc.PP {
					wg.Add(1)
					go func() {
						defer wg.Done()
						per := make([]int, cc.VPP)
						ec := ExecConfig{Schedule: c.cfg, Group: w.Group(r), Stages: runners[r],
							NewTape: func(chunk int) *tensor.Tape { per[chunk]++; return tensor.NewTape() }}
						if c.gpipe {
							ec.Actions = allForwardThenBackward(c.cfg, r)
						}
						e, err := NewExecutor(ec)
						if err != nil {
							b.Error(err)
							return
						}
						if _, err := e.Step(context.Background()); err != nil {
							b.Error(err)
							return
						}
						tapes[r], inFlight[r] = per, e.Stats().PeakInFlight
					}()
				}
				wg.Wait()
				w.Close()
			}
			var worst uint64
			for r := range cc.PP {
				var total uint64
				for ch := range tapes[r] {
					total += uint64(tapes[r][ch]) * bytes[r][ch]
				}
				worst = max(worst, total)
				b.Logf("rank %d: peak in flight %d; tapes per chunk %v × MiB per micro-batch %v = %.1f MiB",
					r, inFlight[r], tapes[r], mib(bytes[r]), float64(total)/(1<<20))
			}
			b.ReportMetric(float64(worst)/(1<<20), "MiB-peak-rank")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func mib(xs []uint64) []string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprintf("%.2f", float64(x)/(1<<20)))
	}
	return out
}
