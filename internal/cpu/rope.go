package cpu

import (
	"fmt"
	"math"
)

// RoPEStyle selects which dimensions of a head RoPE rotates together.
type RoPEStyle int

const (
	// RotateHalf pairs dimension i with i+Dim/2 (GPT-NeoX, Llama, Megatron's
	// default rotate_half). It is the zero value.
	RotateHalf RoPEStyle = iota
	// Interleaved pairs dimensions (2i, 2i+1) (GPT-J, Megatron
	// --rotary-interleaved).
	Interleaved
)

// RoPEConfig configures rotary position embeddings.
type RoPEConfig struct {
	// Dim is the number of rotated dimensions at the start of each head
	// (kv_channels*rotary_percent); it must be even and at most the head size.
	Dim int
	// Base is the theta base of the frequencies; 0 means 10000 (Megatron's
	// --rotary-base default).
	Base float64
	// MaxPositions is the number of positions the cos/sin tables hold;
	// positions passed to Forward/Backward must be in [0, MaxPositions).
	MaxPositions int
	// Style is RotateHalf (zero value) or Interleaved.
	Style RoPEStyle
	// InterpolationFactor divides positions before the angles are formed
	// (Megatron --rotary-seq-len-interpolation-factor); 0 means none.
	InterpolationFactor float64
	// Llama3, if non-nil, rescales the frequencies as Llama 3.1+ does
	// (Megatron --use-rope-scaling, Hugging Face rope_type "llama3").
	Llama3 *Llama3Scaling
	// Yarn, if non-nil, builds the tables as Megatron's YarnRotaryEmbedding
	// (multi-latent attention's rope_type "yarn"): frequencies blended
	// between interpolated and extrapolated ones, and cos/sin multiplied by
	// the concentration factor. At most one of Llama3 and Yarn.
	Yarn *YarnScaling
}

// YarnScaling holds YaRN's parameters, Megatron's MLATransformerConfig
// fields: Factor (rotary_scaling_factor), OriginalMaxPositions
// (original_max_position_embeddings), BetaFast, BetaSlow, Mscale and
// MscaleAllDim. There are no defaults: every field is used as given
// (Megatron's are 40, 4096, 32, 1, 1, 0; its command line gives Factor 1).
type YarnScaling struct {
	Factor               float64
	OriginalMaxPositions int
	BetaFast, BetaSlow   float64
	Mscale, MscaleAllDim float64
}

// YarnMscale is Megatron's _yarn_get_mscale: 1 for scale ≤ 1, else
// 0.1·mscale·ln(scale) + 1.
func YarnMscale(scale, mscale float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*mscale*math.Log(scale) + 1
}

// Concentration is the factor YaRN multiplies cos and sin by (Megatron's
// _yarn_get_concentration_factor with both mscales given).
func (y YarnScaling) Concentration() float64 {
	return YarnMscale(y.Factor, y.Mscale) / YarnMscale(y.Factor, y.MscaleAllDim)
}

// yarnCorrectionDim is Megatron's _yarn_find_correction_dim.
func yarnCorrectionDim(rotations float64, dim int, base float64, maxPos int) float64 {
	return float64(dim) * math.Log(float64(maxPos)/(rotations*2*math.Pi)) / (2 * math.Log(base))
}

// yarnInvFreqs is YarnRotaryEmbedding.get_emb's inv_freq, op by op in
// float32 as torch evaluates it (the correction range in float64, as
// Python does, rounded to integers: correction_range_round_to_int).
func yarnInvFreqs(cfg *RoPEConfig) []float32 {
	y, dim := cfg.Yarn, cfg.Dim
	low := math.Floor(yarnCorrectionDim(y.BetaFast, dim, cfg.Base, y.OriginalMaxPositions))
	high := math.Ceil(yarnCorrectionDim(y.BetaSlow, dim, cfg.Base, y.OriginalMaxPositions))
	low, high = max(low, 0), min(high, float64(dim-1))
	if low == high {
		high += 0.001 // Megatron's guard against a zero-width ramp
	}
	f := make([]float32, dim/2)
	for i := range f {
		e := float32(2*i) / float32(dim)
		pow := float32(math.Pow(cfg.Base, float64(e)))
		extra := 1 / pow
		inter := 1 / (float32(y.Factor) * pow)
		ramp := (float32(i) - float32(low)) / float32(high-low)
		ramp = min(max(ramp, 0), 1)
		mask := 1 - ramp
		f[i] = inter*(1-mask) + extra*mask
	}
	return f
}

// Llama3Scaling holds the Llama-3.x frequency-scaling parameters; each zero
// field takes the Llama 3.1 default: Factor 8, LowFreqFactor 1,
// HighFreqFactor 4, OriginalMaxPositions 8192. Frequencies whose wavelength
// exceeds OriginalMaxPositions/LowFreqFactor are divided by Factor, those
// below OriginalMaxPositions/HighFreqFactor are kept, and those between are
// interpolated smoothly.
type Llama3Scaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  int
}

func (l Llama3Scaling) withDefaults() Llama3Scaling {
	if l.Factor == 0 {
		l.Factor = 8
	}
	if l.LowFreqFactor == 0 {
		l.LowFreqFactor = 1
	}
	if l.HighFreqFactor == 0 {
		l.HighFreqFactor = 4
	}
	if l.OriginalMaxPositions == 0 {
		l.OriginalMaxPositions = 8192
	}
	return l
}

// RoPE applies rotary position embeddings with cos/sin tables computed once.
// It is immutable after NewRoPE and safe for concurrent use.
type RoPE struct {
	cfg      RoPEConfig
	cos, sin []float32 // (MaxPositions, Dim/2)
}

// NewRoPE builds the tables the way Megatron's RotaryEmbedding does, in
// float32: inv_freq[i] = 1/base^(2i/Dim) (then Llama-3 scaling, op by op in
// float32 as torch evaluates it), angle = float32(pos [* 1/InterpolationFactor])
// * inv_freq[i] rounded to float32; cos and sin of that float32 angle are then
// correctly rounded to float32.
func NewRoPE(cfg RoPEConfig) (*RoPE, error) {
	if cfg.Base == 0 {
		cfg.Base = 10000
	}
	if cfg.Llama3 != nil {
		l := cfg.Llama3.withDefaults()
		if !(l.Factor > 0) || !(l.HighFreqFactor > l.LowFreqFactor) || l.LowFreqFactor <= 0 || l.OriginalMaxPositions < 0 {
			return nil, fmt.Errorf("cpu: RoPE Llama3 scaling %+v: want Factor > 0, 0 < LowFreqFactor < HighFreqFactor, OriginalMaxPositions > 0", *cfg.Llama3)
		}
		cfg.Llama3 = &l
	}
	switch {
	case cfg.InterpolationFactor < 0 || math.IsNaN(cfg.InterpolationFactor):
		return nil, fmt.Errorf("cpu: RoPE InterpolationFactor=%g: want > 0 (or 0 for none)", cfg.InterpolationFactor)
	case cfg.Dim <= 0 || cfg.Dim%2 != 0:
		return nil, fmt.Errorf("cpu: RoPE Dim=%d: want a positive even number", cfg.Dim)
	case cfg.Base <= 0:
		return nil, fmt.Errorf("cpu: RoPE Base=%g: want > 0", cfg.Base)
	case cfg.MaxPositions <= 0:
		return nil, fmt.Errorf("cpu: RoPE MaxPositions=%d: want > 0", cfg.MaxPositions)
	case cfg.Style != RotateHalf && cfg.Style != Interleaved:
		return nil, fmt.Errorf("cpu: RoPE Style=%d: want RotateHalf or Interleaved", cfg.Style)
	}
	if y := cfg.Yarn; y != nil {
		switch {
		case cfg.Llama3 != nil:
			return nil, fmt.Errorf("cpu: RoPE with both Llama3 and Yarn scaling: want at most one")
		case !(y.Factor > 0) || math.IsInf(y.Factor, 0):
			return nil, fmt.Errorf("cpu: RoPE Yarn Factor=%g: want a finite value > 0", y.Factor)
		case y.OriginalMaxPositions <= 0:
			return nil, fmt.Errorf("cpu: RoPE Yarn OriginalMaxPositions=%d: want > 0", y.OriginalMaxPositions)
		case !(y.BetaFast > 0) || !(y.BetaSlow > 0) || math.IsInf(y.BetaFast, 0) || math.IsInf(y.BetaSlow, 0):
			return nil, fmt.Errorf("cpu: RoPE Yarn BetaFast=%g BetaSlow=%g: want finite values > 0", y.BetaFast, y.BetaSlow)
		case math.IsNaN(y.Mscale) || math.IsInf(y.Mscale, 0) || math.IsNaN(y.MscaleAllDim) || math.IsInf(y.MscaleAllDim, 0):
			return nil, fmt.Errorf("cpu: RoPE Yarn Mscale=%g MscaleAllDim=%g: want finite values", y.Mscale, y.MscaleAllDim)
		case !(y.Concentration() > 0) || math.IsInf(y.Concentration(), 0):
			return nil, fmt.Errorf("cpu: RoPE Yarn Mscale=%g MscaleAllDim=%g with Factor=%g give concentration %g: want a finite value > 0", y.Mscale, y.MscaleAllDim, y.Factor, y.Concentration())
		}
	}
	half := cfg.Dim / 2
	r := &RoPE{cfg: cfg, cos: make([]float32, cfg.MaxPositions*half), sin: make([]float32, cfg.MaxPositions*half)}
	// YaRN's concentration multiplies the float32 cos and sin (torch's
	// cos(freqs) * mscale in float32); 1 leaves them as they are.
	scale := float32(1)
	if cfg.Yarn != nil {
		scale = float32(cfg.Yarn.Concentration())
	}
	for i, invFreq := range ropeInvFreqs(&cfg) {
		for p := 0; p < cfg.MaxPositions; p++ {
			angle := float64(ropePosition(&cfg, p) * invFreq)
			r.cos[p*half+i] = float32(math.Cos(angle)) * scale
			r.sin[p*half+i] = float32(math.Sin(angle)) * scale
		}
	}
	return r, nil
}

// ropeInvFreqs returns the Dim/2 float32 inverse frequencies, Llama-3 scaled
// if configured (cfg has defaults filled in).
func ropeInvFreqs(cfg *RoPEConfig) []float32 {
	if cfg.Yarn != nil {
		return yarnInvFreqs(cfg)
	}
	f := make([]float32, cfg.Dim/2)
	for i := range f {
		f[i] = ropeInvFreq(cfg.Base, i, cfg.Dim)
		if cfg.Llama3 != nil {
			f[i] = llama3Scale(f[i], *cfg.Llama3)
		}
	}
	return f
}

// llama3Scale is Megatron's/Hugging Face's Llama-3 apply_scaling for one
// frequency, each operation in float32 as torch does on a float32 tensor with
// Python-float scalars.
func llama3Scale(f float32, l Llama3Scaling) float32 {
	old := float32(l.OriginalMaxPositions)
	lowWavelen := old / float32(l.LowFreqFactor)
	highWavelen := old / float32(l.HighFreqFactor)
	wavelen := float32(2*math.Pi) / f
	scaled := f
	if wavelen > lowWavelen {
		scaled = f / float32(l.Factor)
	}
	if wavelen < highWavelen || wavelen > lowWavelen {
		return scaled
	}
	smooth := (old/wavelen - float32(l.LowFreqFactor)) / float32(l.HighFreqFactor-l.LowFreqFactor)
	return (1-smooth)*scaled/float32(l.Factor) + smooth*scaled
}

// ropePosition is the float32 position the angles use: p, or
// p * float32(1/InterpolationFactor) as Megatron scales its float32 positions.
func ropePosition(cfg *RoPEConfig, p int) float32 {
	if cfg.InterpolationFactor == 0 {
		return float32(p)
	}
	return float32(p) * float32(1/cfg.InterpolationFactor)
}

// ropeInvFreq is torch's float32 1.0/(base**(arange(0,dim,2)/dim))[i]: the
// exponent and the reciprocal are float32 operations, the power is rounded once.
func ropeInvFreq(base float64, i, dim int) float32 {
	e := float32(2*i) / float32(dim)
	return 1 / float32(math.Pow(base, float64(e)))
}

// Config returns the configuration with defaults filled in.
func (r *RoPE) Config() RoPEConfig { return r.cfg }

// Tables returns the cos and sin tables, (MaxPositions, Dim/2) row-major:
// entry (p, i) is pair i's rotation at position p. They alias r's storage.
func (r *RoPE) Tables() (cos, sin []float32) { return r.cos, r.sin }

// Forward rotates the first Dim dimensions of every head; the rest are copied.
//
//	x, out: (b, t, h, d); positions: (b*t) or nil for 0..t-1 in every row
//
// RotateHalf: out[i] = x[i]cos - x[i+Dim/2]sin, out[i+Dim/2] = x[i+Dim/2]cos + x[i]sin;
// Interleaved uses the pairs (2i, 2i+1). out may alias x. A position outside
// [0, MaxPositions) panics before any work (positions come from the caller's
// code; data-derived ones should be checked where they are built).
func (r *RoPE) Forward(out, x []float32, positions []int32, b, t, h, d int) {
	r.apply(out, x, positions, b, t, h, d, 1, false)
}

// Backward accumulates dx += Rᵀ·dout, the gradient of Forward (the inverse
// rotation). Shapes as Forward.
func (r *RoPE) Backward(dx, dout []float32, positions []int32, b, t, h, d int) {
	r.apply(dx, dout, positions, b, t, h, d, -1, true)
}

// apply rotates by sign*angle, writing (acc=false) or adding (acc=true).
func (r *RoPE) apply(out, x []float32, positions []int32, b, t, h, d int, sign float32, acc bool) {
	rot, half := r.cfg.Dim, r.cfg.Dim/2
	if rot > d {
		panic(fmt.Sprintf("cpu: RoPE Dim=%d exceeds head size %d", rot, d))
	}
	if positions != nil && len(positions) < b*t {
		panic(fmt.Sprintf("cpu: RoPE has %d positions, want b*t=%d", len(positions), b*t))
	}
	if positions == nil && t > r.cfg.MaxPositions {
		panic(fmt.Sprintf("cpu: RoPE sequence length %d exceeds MaxPositions=%d", t, r.cfg.MaxPositions))
	}
	for row, p := range positions[:min(len(positions), b*t)] {
		if p < 0 || int(p) >= r.cfg.MaxPositions {
			panic(fmt.Sprintf("cpu: RoPE position %d at row %d outside [0,%d)", p, row, r.cfg.MaxPositions))
		}
	}
	lo1, lo2, step := 0, half, 1 // RotateHalf: pair (i, i+half)
	if r.cfg.Style == Interleaved {
		lo1, lo2, step = 0, 1, 2 // pair (2i, 2i+1)
	}
	Parallel(b*t, max(1, normGrain/h), func(rlo, rhi int) {
		for row := rlo; row < rhi; row++ {
			p := row % t
			if positions != nil {
				p = int(positions[row])
			}
			cs, sn := r.cos[p*half:p*half+half], r.sin[p*half:p*half+half]
			for hh := 0; hh < h; hh++ {
				base := (row*h + hh) * d
				xi, oi := x[base:base+d], out[base:base+d]
				for i := 0; i < half; i++ {
					a, c := lo1+i*step, lo2+i*step
					x1, x2 := xi[a], xi[c]
					s := sign * sn[i]
					y1, y2 := x1*cs[i]-x2*s, x2*cs[i]+x1*s
					if acc {
						oi[a] += y1
						oi[c] += y2
					} else {
						oi[a], oi[c] = y1, y2
					}
				}
				for j := rot; j < d; j++ {
					if acc {
						oi[j] += xi[j]
					} else {
						oi[j] = xi[j]
					}
				}
			}
		}
	})
}

// ropeForwardRef is the reference for RoPE.Forward: the float32 angles are
// the specification (Megatron forms them in float32), the rotation runs in
// float64 with float64 cos/sin.
func ropeForwardRef(out, x []float64, positions []int32, b, t, h, d int, cfg RoPEConfig, sign float64) {
	if cfg.Base == 0 {
		cfg.Base = 10000
	}
	if cfg.Llama3 != nil {
		l := cfg.Llama3.withDefaults()
		cfg.Llama3 = &l
	}
	invFreqs := ropeInvFreqs(&cfg)
	half := cfg.Dim / 2
	scale := 1.0
	if cfg.Yarn != nil {
		scale = cfg.Yarn.Concentration()
	}
	for row := 0; row < b*t; row++ {
		p := row % t
		if positions != nil {
			p = int(positions[row])
		}
		for hh := 0; hh < h; hh++ {
			base := (row*h + hh) * d
			copy(out[base+cfg.Dim:base+d], x[base+cfg.Dim:base+d])
			for i := 0; i < half; i++ {
				angle := sign * float64(ropePosition(&cfg, p)*invFreqs[i])
				a, c := i, i+half
				if cfg.Style == Interleaved {
					a, c = 2*i, 2*i+1
				}
				x1, x2 := x[base+a], x[base+c]
				out[base+a] = scale * (x1*math.Cos(angle) - x2*math.Sin(angle))
				out[base+c] = scale * (x2*math.Cos(angle) + x1*math.Sin(angle))
			}
		}
	}
}

// ropeBackwardRef is the reference for RoPE.Backward: dx += rotation by -angle.
func ropeBackwardRef(dx, dout []float64, positions []int32, b, t, h, d int, cfg RoPEConfig) {
	tmp := make([]float64, len(dout))
	ropeForwardRef(tmp, dout, positions, b, t, h, d, cfg, -1)
	for i := range tmp {
		dx[i] += tmp[i]
	}
}
