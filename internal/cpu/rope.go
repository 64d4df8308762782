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
}

// RoPE applies rotary position embeddings with cos/sin tables computed once.
// It is immutable after NewRoPE and safe for concurrent use.
type RoPE struct {
	cfg      RoPEConfig
	cos, sin []float32 // (MaxPositions, Dim/2)
}

// NewRoPE builds the tables the way Megatron's RotaryEmbedding does, in
// float32: inv_freq[i] = 1/base^(2i/Dim), angle = float32(pos)*inv_freq[i]
// rounded to float32; cos and sin of that float32 angle are then correctly
// rounded to float32.
func NewRoPE(cfg RoPEConfig) (*RoPE, error) {
	if cfg.Base == 0 {
		cfg.Base = 10000
	}
	switch {
	case cfg.Dim <= 0 || cfg.Dim%2 != 0:
		return nil, fmt.Errorf("cpu: RoPE Dim=%d: want a positive even number", cfg.Dim)
	case cfg.Base <= 0:
		return nil, fmt.Errorf("cpu: RoPE Base=%g: want > 0", cfg.Base)
	case cfg.MaxPositions <= 0:
		return nil, fmt.Errorf("cpu: RoPE MaxPositions=%d: want > 0", cfg.MaxPositions)
	case cfg.Style != RotateHalf && cfg.Style != Interleaved:
		return nil, fmt.Errorf("cpu: RoPE Style=%d: want RotateHalf or Interleaved", cfg.Style)
	}
	half := cfg.Dim / 2
	r := &RoPE{cfg: cfg, cos: make([]float32, cfg.MaxPositions*half), sin: make([]float32, cfg.MaxPositions*half)}
	for i := 0; i < half; i++ {
		invFreq := ropeInvFreq(cfg.Base, i, cfg.Dim)
		for p := 0; p < cfg.MaxPositions; p++ {
			angle := float64(float32(p) * invFreq)
			r.cos[p*half+i] = float32(math.Cos(angle))
			r.sin[p*half+i] = float32(math.Sin(angle))
		}
	}
	return r, nil
}

// ropeInvFreq is torch's float32 1.0/(base**(arange(0,dim,2)/dim))[i]: the
// exponent and the reciprocal are float32 operations, the power is rounded once.
func ropeInvFreq(base float64, i, dim int) float32 {
	e := float32(2*i) / float32(dim)
	return 1 / float32(math.Pow(base, float64(e)))
}

// Config returns the configuration with defaults filled in.
func (r *RoPE) Config() RoPEConfig { return r.cfg }

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

// ropeForwardRef is the reference for RoPE.Forward, computing angles in
// float64 from the same float32 angles (so only cos/sin rounding differs).
func ropeForwardRef(out, x []float64, positions []int32, b, t, h, d int, cfg RoPEConfig, sign float64) {
	if cfg.Base == 0 {
		cfg.Base = 10000
	}
	half := cfg.Dim / 2
	for row := 0; row < b*t; row++ {
		p := row % t
		if positions != nil {
			p = int(positions[row])
		}
		for hh := 0; hh < h; hh++ {
			base := (row*h + hh) * d
			copy(out[base+cfg.Dim:base+d], x[base+cfg.Dim:base+d])
			for i := 0; i < half; i++ {
				invFreq := ropeInvFreq(cfg.Base, i, cfg.Dim)
				angle := sign * float64(float32(p)*invFreq)
				a, c := i, i+half
				if cfg.Style == Interleaved {
					a, c = 2*i, 2*i+1
				}
				x1, x2 := x[base+a], x[base+c]
				out[base+a] = x1*math.Cos(angle) - x2*math.Sin(angle)
				out[base+c] = x2*math.Cos(angle) + x1*math.Sin(angle)
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
