package fp8

import (
	"fmt"
	"math"
)

// Kind is a scaling recipe (Megatron's --fp8-recipe).
type Kind int

const (
	// Tensorwise is TE's Float8CurrentScaling: each tensor's scale comes
	// from its own amax at the moment it is quantized.
	Tensorwise Kind = iota + 1
	// Delayed is TE's DelayedScaling: a tensor is quantized with the scale
	// its amax history gave at the last update; its amax goes into the
	// history, and the scale is updated after each forward (forward
	// tensors) and each backward (gradients).
	Delayed
)

func (k Kind) String() string {
	switch k {
	case Tensorwise:
		return "tensorwise"
	case Delayed:
		return "delayed"
	}
	return fmt.Sprintf("fp8.Kind(%d)", int(k))
}

// AmaxAlgo is how the delayed recipe reads its amax history
// (--fp8-amax-compute-algo).
type AmaxAlgo int

const (
	// MostRecent uses the amax recorded since the last update (Megatron's
	// default).
	MostRecent AmaxAlgo = iota
	// MaxOfHistory uses the largest amax of the whole history.
	MaxOfHistory
)

func (a AmaxAlgo) String() string {
	if a == MaxOfHistory {
		return "max"
	}
	return "most_recent"
}

// Recipe is one FP8 training or inference setting: the formats and the
// scaling. Megatron builds TE's recipe from its flags in
// megatron/core/fp8_utils.py get_fp8_recipe.
type Recipe struct {
	Kind Kind
	// Hybrid (--fp8-format hybrid) quantizes gradients to E5M2 and
	// forward tensors (activations, weights) to E4M3; otherwise
	// (--fp8-format e4m3) everything is E4M3.
	Hybrid bool
	// Delayed scaling only: the history length (--fp8-amax-history-len,
	// >= 1), how the history is read and the margin (scale divided by
	// 2^Margin, --fp8-margin).
	AmaxHistoryLen int
	AmaxAlgo       AmaxAlgo
	Margin         int
	// NoWgradFP8 (--no-fp8-wgrad, delayed only: TE's
	// override_linear_precision=(False, False, True)) computes the weight
	// gradient in high precision from the unquantized operands.
	NoWgradFP8 bool
}

// Validate checks the recipe's fields.
func (r Recipe) Validate() error {
	switch r.Kind {
	case Tensorwise:
		if r.NoWgradFP8 {
			return fmt.Errorf("fp8: --no-fp8-wgrad changes only the delayed recipe (TE's Float8CurrentScaling has no override_linear_precision); with --fp8-recipe tensorwise it would be ignored")
		}
	case Delayed:
		if r.AmaxHistoryLen < 1 {
			return fmt.Errorf("fp8: --fp8-amax-history-len %d: want >= 1", r.AmaxHistoryLen)
		}
		if r.Margin < 0 || r.Margin > 64 {
			return fmt.Errorf("fp8: --fp8-margin %d: want 0..64", r.Margin)
		}
	default:
		return fmt.Errorf("fp8: unknown recipe %v", r.Kind)
	}
	return nil
}

// ForwardFormat is the format of activations and weights: E4M3.
func (r Recipe) ForwardFormat() Format { return E4M3 }

// GradFormat is the format of output gradients: E5M2 under hybrid, else
// E4M3.
func (r Recipe) GradFormat() Format {
	if r.Hybrid {
		return E5M2
	}
	return E4M3
}

func (r Recipe) String() string {
	format := "e4m3"
	if r.Hybrid {
		format = "hybrid"
	}
	if r.Kind == Delayed {
		return fmt.Sprintf("%s/%s (history %d, %s, margin %d)", format, r.Kind, r.AmaxHistoryLen, r.AmaxAlgo, r.Margin)
	}
	return fmt.Sprintf("%s/%s", format, r.Kind)
}

// CurrentScale is TE's compute_scale_from_amax (recipe_common.cuh), the
// tensorwise recipe's scale: amax floored at epsilon; 1 for a zero,
// infinite or NaN amax; fmax/amax (float32 division) otherwise, with
// valueForInf when that overflows (TE's current-scaling kernel passes the
// largest float32; its block-scaling recipes the input type's largest
// value); with pow2, the scale's mantissa
// cleared (rounded down to a power of 2). Megatron's Float8CurrentScaling
// has epsilon 0 and pow2 off (TE's NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES
// unset).
func CurrentScale(amax, fmax float32, pow2 bool, epsilon, valueForInf float32) float32 {
	if amax < epsilon {
		amax = epsilon
	}
	if math.IsInf(float64(amax), 0) || amax == 0 || amax != amax {
		return 1
	}
	scale := fmax / amax
	if math.IsInf(float64(scale), 0) {
		scale = valueForInf
	}
	if pow2 {
		scale = math.Float32frombits(math.Float32bits(scale) & 0xFF800000)
	}
	return scale
}

// TensorwiseScale is CurrentScale as Megatron's tensorwise recipe calls it
// (TE's compute_scale_from_amax_kernel): epsilon 0, no power-of-2
// rounding, the largest float32 for an overflowing scale.
func TensorwiseScale(amax float32, f Format) float32 {
	return CurrentScale(amax, f.Max(), false, 0, math.MaxFloat32)
}

// History is one tensor's delayed-scaling state (TE's amax_history column
// and scale): History[0] collects the amax of every quantization since
// the last update; Update rolls it into the history and computes the next
// scale. The zero History is not usable: NewHistory.
type History struct {
	amax     []float32
	scale    float32
	observed bool // a quantization since the last Update
}

// NewHistory returns a history of n amaxes (n >= 1), all zero, and scale
// 1, as TE initializes them.
func NewHistory(n int) *History {
	if n < 1 {
		panic(fmt.Sprintf("fp8: amax history length %d", n))
	}
	return &History{amax: make([]float32, n), scale: 1}
}

// Scale is the scale quantizations use until the next Update.
func (h *History) Scale() float32 { return h.scale }

// Observe records the amax of one quantization: History[0] becomes the
// larger of the two (TE's atomic max into amax_history[0]; NaNs skipped).
func (h *History) Observe(amax float32) {
	h.observed = true
	if amax > h.amax[0] {
		h.amax[0] = amax
	}
}

// Observed reports whether a quantization was recorded since the last
// Update: TE updates only the tensors of the modules that ran in the
// fp8_autocast region ending.
func (h *History) Observed() bool { return h.observed }

// Current is the amax observed since the last update (History[0]); Reduce
// replaces it by its maximum over a group before Update, as TE's amax
// reduction does.
func (h *History) Current() float32 { return h.amax[0] }

// SetCurrent sets History[0] (the group's reduced amax).
func (h *History) SetCurrent(a float32) { h.amax[0] = a }

// Amaxes returns a copy of the history, History[0] first.
func (h *History) Amaxes() []float32 { return append([]float32(nil), h.amax...) }

// Restore sets the history and scale to a saved Amaxes and Scale (a
// checkpoint's), as between two updates: nothing observed since.
func (h *History) Restore(amax []float32, scale float32) error {
	if len(amax) != len(h.amax) {
		return fmt.Errorf("fp8: a saved amax history of %d, this run's is %d (--fp8-amax-history-len)", len(amax), len(h.amax))
	}
	if !(scale > 0) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("fp8: saved scale %v: want a positive finite number", scale)
	}
	copy(h.amax, amax)
	h.scale, h.observed = scale, false
	return nil
}

// Update is TE's amax_and_scale_update (delayed_scaling.cu): the amax is
// History[0] (MostRecent) or the largest of the history (MaxOfHistory);
// the history rolls one place toward its start — History[i] takes
// History[i+1], the last takes the old History[0] — and History[0]
// restarts at 0; the scale becomes (fmax·2^-margin)/amax in float32 when
// the amax is finite and positive, and stays otherwise, the largest
// float32 when the division overflows.
func (h *History) Update(f Format, margin int, algo AmaxAlgo) {
	h.observed = false
	last := h.amax[0]
	var amax float32
	n := len(h.amax)
	for i := range n {
		a := last
		if i < n-1 {
			a = h.amax[i+1]
		}
		if a > amax { // fmaxf: the largest of the whole history, NaNs skipped
			amax = a
		}
		if i > 0 {
			h.amax[i] = a
		}
	}
	h.amax[0] = 0
	if algo == MostRecent {
		amax = last
	}
	scaledMax := f.Max() * float32(math.Pow(2, float64(-margin)))
	if !math.IsInf(float64(amax), 0) && amax == amax && amax > 0 {
		h.scale = scaledMax / amax
	}
	if math.IsInf(float64(h.scale), 0) {
		h.scale = math.MaxFloat32
	}
}
