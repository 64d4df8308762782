package cpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestCrossEntropyFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 13))
	for _, tc := range []struct {
		n, v   int
		s      float32
		ignore int32
	}{{1, 1, 0, 0}, {5, 11, 0, -1}, {7, 3001, 0.1, -100}, {33, 50, 0.5, -1}, {9, 20, 0.2, 3}} {
		t.Run(fmt.Sprintf("%dx%d-s%g", tc.n, tc.v, tc.s), func(t *testing.T) {
			cfg := CrossEntropyConfig{N: tc.n, V: tc.v, LabelSmoothing: tc.s, IgnoreIndex: tc.ignore}
			x := round32(randF64(rng, tc.n*tc.v, 10))
			targets := make([]int32, tc.n)
			for i := range targets {
				targets[i] = int32(rng.IntN(tc.v))
				if i%3 == 1 && tc.ignore != 0 {
					targets[i] = tc.ignore
				}
			}
			if err := cfg.CheckTargets(targets); err != nil {
				t.Fatal(err)
			}
			dl := round32(randF64(rng, tc.n, 1))
			losses, lse, dx := make([]float64, tc.n), make([]float64, tc.n), make([]float64, len(x))
			crossEntropyForwardRef(losses, lse, x, targets, cfg)
			crossEntropyBackwardRef(dx, x, lse, targets, dl, cfg)

			x32 := to32(x)
			l32, lse32 := make([]float32, tc.n), make([]float32, tc.n)
			CrossEntropyForward(l32, lse32, x32, targets, cfg)
			assertClose(t, "losses", l32, losses, fastTol)
			assertClose(t, "lse", lse32, lse, fastTol)
			dx32 := to32(filled(len(x), 7)) // overwritten, not accumulated
			CrossEntropyBackward(dx32, x32, lse32, targets, to32(dl), cfg)
			assertClose(t, "dlogits", dx32, dx, fastTol)
			// in place: dlogits aliases logits
			CrossEntropyBackward(x32, x32, lse32, targets, to32(dl), cfg)
			assertClose(t, "dlogits in place", x32, dx, fastTol)
		})
	}
}

func TestCrossEntropyConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg     CrossEntropyConfig
		targets []int32
		want    string
	}{
		{CrossEntropyConfig{N: 2, V: 0}, []int32{0, 0}, "V >= 1"},
		{CrossEntropyConfig{N: 1, V: 4, LabelSmoothing: 1}, []int32{0}, "LabelSmoothing"},
		{CrossEntropyConfig{N: 2, V: 4}, []int32{0, 4}, "target[1]=4"},
		{CrossEntropyConfig{N: 2, V: 4}, []int32{-1, 0}, "target[0]=-1"},
		{CrossEntropyConfig{N: 2, V: 4, IgnoreIndex: -1}, []int32{-1, -100}, "target[1]=-100"},
		{CrossEntropyConfig{N: 3, V: 4}, []int32{0}, "want N=3"},
	} {
		err := tc.cfg.Validate()
		if err == nil {
			err = tc.cfg.CheckTargets(tc.targets)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v %v: error %v, want it to mention %q", tc.cfg, tc.targets, err, tc.want)
		}
	}
}

func TestCrossEntropyGolden(t *testing.T) {
	for _, name := range []string{"crossentropy", "crossentropy_smooth"} {
		forEachISA(t, name, func(t *testing.T) { crossEntropyGolden(t, name) })
	}
}

func crossEntropyGolden(t *testing.T, name string) {
	{
		g := loadGolden(t, name)
		cfg := CrossEntropyConfig{N: g.p("n"), V: g.p("v"), LabelSmoothing: float32(g.Params["label_smoothing"].(float64)),
			IgnoreIndex: int32(g.p("ignore_index"))}
		targets := g.i32["targets"]
		if err := cfg.CheckTargets(targets); err != nil {
			t.Fatal(err)
		}
		losses, lse := make([]float32, cfg.N), make([]float32, cfg.N)
		CrossEntropyForward(losses, lse, g.f(t, "logits"), targets, cfg)
		g.check(t, "losses", losses)
		g.check(t, "lse", lse)
		dx := make([]float32, cfg.N*cfg.V)
		CrossEntropyBackward(dx, g.f(t, "logits"), lse, targets, g.f(t, "dlosses"), cfg)
		g.check(t, "dlogits", dx)
	}
}

// BenchmarkCrossEntropy reports GB/s of logits streamed by forward+backward
// (the forward reads them twice, the backward reads and writes them once).
func BenchmarkCrossEntropy(b *testing.B) {
	cfg := CrossEntropyConfig{N: 256, V: 50304, IgnoreIndex: -1}
	rng := rand.New(rand.NewPCG(1, 1))
	logits := to32(randF64(rng, cfg.N*cfg.V, 5))
	targets := make([]int32, cfg.N)
	for i := range targets {
		targets[i] = int32(rng.IntN(cfg.V))
	}
	losses, lse, dl, dx := make([]float32, cfg.N), make([]float32, cfg.N), to32(filled(cfg.N, 1)), make([]float32, len(logits))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		CrossEntropyForward(losses, lse, logits, targets, cfg)
		CrossEntropyBackward(dx, logits, lse, targets, dl, cfg)
	}
	b.ReportMetric(float64(4*4*len(logits))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func TestCrossEntropyBadTargetPanics(t *testing.T) {
	cfg := CrossEntropyConfig{N: 2, V: 3, IgnoreIndex: -1}
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "target[1]=3") {
			t.Fatalf("panic %q, want it to name target[1]=3", msg)
		}
	}()
	CrossEntropyForward(make([]float32, 2), make([]float32, 2), make([]float32, 6), []int32{0, 3}, cfg)
}
