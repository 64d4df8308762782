package cpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestRoPEFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 15))
	for vi, variant := range []RoPEConfig{
		{Style: RotateHalf}, {Style: Interleaved},
		{Style: RotateHalf, Base: 500000, Llama3: &Llama3Scaling{OriginalMaxPositions: 64}},
		{Style: Interleaved, InterpolationFactor: 2.5},
	} {
		for _, sh := range []struct{ b, t, h, d, rot int }{{1, 1, 1, 2, 2}, {2, 5, 3, 10, 6}, {2, 37, 4, 64, 64}} {
			// variants: 0 rotate-half, 1 interleaved, 2 Llama-3 scaled, 3 interpolated
			t.Run(fmt.Sprintf("variant%d-%v", vi, sh), func(t *testing.T) {
				cfg := variant
				cfg.Dim, cfg.MaxPositions = sh.rot, 64
				r, err := NewRoPE(cfg)
				if err != nil {
					t.Fatal(err)
				}
				n := sh.b * sh.t * sh.h * sh.d
				x, g := round32(randF64(rng, n, 2)), round32(randF64(rng, n, 1))
				for _, pos := range [][]int32{nil, randPositions(rng, sh.b*sh.t, 64)} {
					out, dx := make([]float64, n), filled(n, 0.5)
					ropeForwardRef(out, x, pos, sh.b, sh.t, sh.h, sh.d, cfg, 1)
					ropeBackwardRef(dx, g, pos, sh.b, sh.t, sh.h, sh.d, cfg)
					out32, dx32 := make([]float32, n), to32(filled(n, 0.5))
					r.Forward(out32, to32(x), pos, sh.b, sh.t, sh.h, sh.d)
					r.Backward(dx32, to32(g), pos, sh.b, sh.t, sh.h, sh.d)
					assertClose(t, "out", out32, out, fastTol)
					assertClose(t, "dx", dx32, dx, fastTol)
					inPlace := to32(x) // out aliases x
					r.Forward(inPlace, inPlace, pos, sh.b, sh.t, sh.h, sh.d)
					assertClose(t, "out in place", inPlace, out, fastTol)
				}
			})
		}
	}
}

func randPositions(rng *rand.Rand, n, maxPos int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(maxPos))
	}
	return p
}

func TestNewRoPEErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  RoPEConfig
		want string
	}{
		{RoPEConfig{Dim: 3, MaxPositions: 4}, "Dim=3"},
		{RoPEConfig{Dim: 0, MaxPositions: 4}, "Dim=0"},
		{RoPEConfig{Dim: 4, MaxPositions: 0}, "MaxPositions=0"},
		{RoPEConfig{Dim: 4, MaxPositions: 4, Base: -1}, "Base=-1"},
		{RoPEConfig{Dim: 4, MaxPositions: 4, Style: 7}, "Style=7"},
		{RoPEConfig{Dim: 4, MaxPositions: 4, InterpolationFactor: -2}, "InterpolationFactor=-2"},
		{RoPEConfig{Dim: 4, MaxPositions: 4, Llama3: &Llama3Scaling{LowFreqFactor: 4, HighFreqFactor: 2}}, "Llama3 scaling"},
	} {
		_, err := NewRoPE(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRoPE(%+v) error %v, want it to mention %q", tc.cfg, err, tc.want)
		}
	}
	r, err := NewRoPE(RoPEConfig{Dim: 4, MaxPositions: 4})
	if err != nil || r.Config().Base != 10000 {
		t.Fatalf("zero Base: got %+v, %v; want Base 10000", r.Config(), err)
	}
}

func TestRoPEGolden(t *testing.T) {
	for _, name := range []string{"rope_half", "rope_interleaved", "rope_llama3", "rope_interp"} {
		g := loadGolden(t, name)
		b, tt, h, d := g.p("b"), g.p("t"), g.p("h"), g.p("d")
		cfg := RoPEConfig{Dim: g.p("dim"), Base: g.Params["base"].(float64), MaxPositions: 5000,
			InterpolationFactor: g.Params["interpolation_factor"].(float64)}
		if g.Params["style"] == "interleaved" {
			cfg.Style = Interleaved
		}
		if g.Params["llama3"].(bool) {
			cfg.Llama3 = &Llama3Scaling{} // Llama 3.1 defaults
		}
		r, err := NewRoPE(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pos := g.i32["positions"] // nil for rope_half: 0..t-1
		out, dx := make([]float32, b*tt*h*d), make([]float32, b*tt*h*d)
		r.Forward(out, g.f(t, "x"), pos, b, tt, h, d)
		r.Backward(dx, g.f(t, "dout"), pos, b, tt, h, d)
		g.check(t, "out", out)
		g.check(t, "dx", dx)
	}
}

func TestRoPEBadPositionPanics(t *testing.T) {
	r, err := NewRoPE(RoPEConfig{Dim: 2, MaxPositions: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pos  []int32
		t    int
		want string
	}{
		{[]int32{0, 4}, 2, "position 4 at row 1 outside [0,4)"},
		{[]int32{-1, 0}, 2, "position -1 at row 0"},
		{nil, 5, "sequence length 5 exceeds MaxPositions=4"},
	} {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, tc.want) {
					t.Errorf("positions %v t=%d: panic %q, want %q", tc.pos, tc.t, msg, tc.want)
				}
			}()
			x := make([]float32, tc.t*2)
			r.Forward(x, x, tc.pos, 1, tc.t, 1, 2)
		}()
	}
}
