package cpu

import (
	"fmt"
	"math"
)

// CrossEntropyConfig describes a batch of rows for the fused softmax
// cross-entropy kernels.
type CrossEntropyConfig struct {
	// N is the number of rows (tokens) and V the number of classes (the
	// padded vocabulary); logits are (N, V).
	N, V int
	// LabelSmoothing s in [0, 1) mixes the one-hot target with the uniform
	// distribution as torch's F.cross_entropy(label_smoothing=s) does:
	// loss = (1-s)*nll + s*mean_j(-log p_j). Zero means none.
	// (Megatron's vocab-parallel CE rescales s by V/(V-1) first; a caller
	// wanting Megatron's numbers passes s*V/(V-1).)
	LabelSmoothing float32
	// IgnoreIndex, when non-zero, marks rows whose target equals it: their
	// loss is 0 and their gradient row is 0. Use -1 for Megatron-style loss
	// masks, -100 for PyTorch's default, or a padding token id. The zero value
	// ignores nothing (0 is a valid class; mask class 0 with a loss mask).
	IgnoreIndex int32
}

// Validate reports a config the kernels cannot run.
func (c CrossEntropyConfig) Validate() error {
	switch {
	case c.N < 0 || c.V < 1:
		return fmt.Errorf("cpu: cross-entropy shape N=%d V=%d: want N >= 0 and V >= 1", c.N, c.V)
	case !(c.LabelSmoothing >= 0 && c.LabelSmoothing < 1):
		return fmt.Errorf("cpu: cross-entropy LabelSmoothing=%g: want 0 <= s < 1", c.LabelSmoothing)
	}
	return nil
}

// CheckTargets returns an error naming the first row whose target is neither
// in [0, V) nor the (non-zero) IgnoreIndex. Call it where targets enter from
// data; the kernels run it too and panic on a bad target (O(N), before any work).
func (c CrossEntropyConfig) CheckTargets(targets []int32) error {
	if len(targets) < c.N {
		return fmt.Errorf("cpu: cross-entropy has %d targets, want N=%d", len(targets), c.N)
	}
	for i, t := range targets[:c.N] {
		if !c.ignored(t) && (t < 0 || int(t) >= c.V) {
			return fmt.Errorf("cpu: cross-entropy target[%d]=%d: want 0 <= target < V=%d or IgnoreIndex", i, t, c.V)
		}
	}
	return nil
}

func (c CrossEntropyConfig) ignored(t int32) bool { return c.IgnoreIndex != 0 && t == c.IgnoreIndex }

// mustCheck panics, on the caller's goroutine, on a config or target the
// kernels cannot use.
func (c CrossEntropyConfig) mustCheck(targets []int32) {
	err := c.Validate()
	if err == nil {
		err = c.CheckTargets(targets)
	}
	if err != nil {
		panic(err.Error())
	}
}

// CrossEntropyForward computes per-row softmax cross-entropy without
// materialising the softmax (no second (N, V) buffer).
//
//	logits: (N, V); targets: (N); losses: (N); lse: (N) = logsumexp(logits[i,:]),
//	cached for CrossEntropyBackward
//
// losses[i] = (1-s)*(lse-logits[i,t]) + s*(lse-mean_j logits[i,j]); ignored
// rows get loss 0 (their lse is still written). exp runs in float32
// (AVX-512 or AVX2 per ActiveISA, within 2 ulp); the smoothing mean in float64.
func CrossEntropyForward(losses, lse, logits []float32, targets []int32, cfg CrossEntropyConfig) {
	cfg.mustCheck(targets)
	v, s := cfg.V, float64(cfg.LabelSmoothing)
	Parallel(cfg.N, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := logits[i*v : i*v+v]
			m := maxRowF32(float32(math.Inf(-1)), x)
			l := float64(m) + math.Log(float64(expSumF32(x, m)))
			lse[i] = float32(l)
			t := targets[i]
			if cfg.ignored(t) {
				losses[i] = 0
				continue
			}
			loss := (1 - s) * (l - float64(x[t]))
			if s != 0 {
				var sum float64
				for _, z := range x {
					sum += float64(z)
				}
				loss += s * (l - sum/float64(v))
			}
			losses[i] = float32(loss)
		}
	})
}

// CrossEntropyBackward writes dlogits[i,:] = dlosses[i]*(softmax(logits[i,:])
// - (1-s)*onehot(t) - s/V), and zero rows for ignored targets.
//
//	logits, dlogits: (N, V); lse, dlosses: (N); targets: (N)
//
// Unlike every other backward kernel it OVERWRITES dlogits, and dlogits may
// alias logits (the gradient then replaces the logits in place, saving the
// (N, V) buffer).
func CrossEntropyBackward(dlogits, logits, lse []float32, targets []int32, dlosses []float32, cfg CrossEntropyConfig) {
	cfg.mustCheck(targets)
	v, s := cfg.V, cfg.LabelSmoothing
	Parallel(cfg.N, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x, dx := logits[i*v:i*v+v], dlogits[i*v:i*v+v]
			t := targets[i]
			if cfg.ignored(t) {
				clear(dx)
				continue
			}
			g, l, u := dlosses[i], lse[i], s/float32(v)
			// One fused pass where AVX-512 has it; the rest as before (the
			// same bits either way: see TestCrossEntropyGradKernel).
			j := ceGradVec(dx, x, l, g, u)
			tail := dx[j:]
			copy(tail, x[j:]) // no-op when dlogits aliases logits
			expSubF32(tail, l)
			for k := range tail {
				tail[k] = g * (tail[k] - u)
			}
			dx[t] -= g * (1 - s)
		}
	})
}

// crossEntropyForwardRef is the reference for CrossEntropyForward.
func crossEntropyForwardRef(losses, lse, logits []float64, targets []int32, cfg CrossEntropyConfig) {
	v, s := cfg.V, float64(cfg.LabelSmoothing)
	for i := 0; i < cfg.N; i++ {
		x := logits[i*v : i*v+v]
		m := math.Inf(-1)
		for _, z := range x {
			m = math.Max(m, z)
		}
		se, mean := 0.0, 0.0
		for _, z := range x {
			se += math.Exp(z - m)
			mean += z / float64(v)
		}
		lse[i] = m + math.Log(se)
		losses[i] = 0
		if t := targets[i]; !cfg.ignored(t) {
			losses[i] = (1-s)*(lse[i]-x[t]) + s*(lse[i]-mean)
		}
	}
}

// crossEntropyBackwardRef is the reference for CrossEntropyBackward.
func crossEntropyBackwardRef(dlogits, logits, lse []float64, targets []int32, dlosses []float64, cfg CrossEntropyConfig) {
	v, s := cfg.V, float64(cfg.LabelSmoothing)
	for i := 0; i < cfg.N; i++ {
		t := targets[i]
		for j := 0; j < v; j++ {
			d := 0.0
			if !cfg.ignored(t) {
				d = math.Exp(logits[i*v+j]-lse[i]) - s/float64(v)
				if j == int(t) {
					d -= 1 - s
				}
				d *= dlosses[i]
			}
			dlogits[i*v+j] = d
		}
	}
}
