package cpu

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

func TestRoPEFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 15))
	for vi, variant := range []RoPEConfig{
		{Style: RotateHalf}, {Style: Interleaved},
		{Style: RotateHalf, Base: 500000, Llama3: &Llama3Scaling{OriginalMaxPositions: 64}},
		{Style: Interleaved, InterpolationFactor: 2.5},
		{Style: Interleaved, Yarn: &YarnScaling{Factor: 40, OriginalMaxPositions: 32, BetaFast: 32, BetaSlow: 1, Mscale: 0.707, MscaleAllDim: 0.2}},
	} {
		for _, sh := range []struct{ b, t, h, d, rot int }{{1, 1, 1, 2, 2}, {2, 5, 3, 10, 6}, {2, 37, 4, 64, 64}} {
			// variants: 0 rotate-half, 1 interleaved, 2 Llama-3 scaled, 3 interpolated, 4 YaRN
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

// TestYarnMatchesMegatron checks YaRN's frequencies, concentration factor
// and softmax mscale, and multi-latent attention's rotation, against
// Megatron's own functions (yarn_rotary_pos_embedding.py, rope_utils.py),
// run out of tree: testdata/yarn_megatron.json. MLA rotates the
// de-interleaved halves (mla_rotary_interleaved): the pairs (2i, 2i+1) of
// the Interleaved style, its output permuted to [evens; odds]; queries and
// keys are permuted alike, so their products are the same.
func TestYarnMatchesMegatron(t *testing.T) {
	raw, err := os.ReadFile("testdata/yarn_megatron.json")
	if err != nil {
		t.Fatal(err)
	}
	var fix struct {
		Cases []struct {
			Dim                  int
			Base, Factor         float64
			OriginalMaxPositions int     `json:"original_max_positions"`
			BetaFast             float64 `json:"beta_fast"`
			BetaSlow             float64 `json:"beta_slow"`
			Mscale               float64
			MscaleAllDim         float64 `json:"mscale_all_dim"`
			T                    int
			InvFreq              []float64 `json:"inv_freq"`
			Concentration        float64
			SoftmaxMscale        float64 `json:"softmax_mscale"`
			X, Y                 []float64
		}
	}
	if err := json.Unmarshal(raw, &fix); err != nil {
		t.Fatal(err)
	}
	if len(fix.Cases) == 0 {
		t.Fatal("no cases in testdata/yarn_megatron.json")
	}
	for _, c := range fix.Cases {
		y := &YarnScaling{Factor: c.Factor, OriginalMaxPositions: c.OriginalMaxPositions, BetaFast: c.BetaFast,
			BetaSlow: c.BetaSlow, Mscale: c.Mscale, MscaleAllDim: c.MscaleAllDim}
		cfg := RoPEConfig{Dim: c.Dim, Base: c.Base, MaxPositions: c.T, Style: Interleaved, Yarn: y}
		name := fmt.Sprintf("dim%d-factor%g", c.Dim, c.Factor)
		for i, f := range yarnInvFreqs(&cfg) {
			if math.Abs(float64(f)-c.InvFreq[i]) > 2e-7*math.Abs(c.InvFreq[i]) {
				t.Errorf("%s: inv_freq[%d] = %g, Megatron %g", name, i, f, c.InvFreq[i])
			}
		}
		if math.Abs(y.Concentration()-c.Concentration) > 1e-15 {
			t.Errorf("%s: concentration %g, Megatron %g", name, y.Concentration(), c.Concentration)
		}
		if m := YarnMscale(c.Factor, c.MscaleAllDim); math.Abs(m-c.SoftmaxMscale) > 1e-15 {
			t.Errorf("%s: softmax mscale %g, Megatron %g", name, m, c.SoftmaxMscale)
		}
		r, err := NewRoPE(cfg)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(c.X))
		r.Forward(out, to32(c.X), nil, 1, c.T, 1, c.Dim)
		half := c.Dim / 2
		for row := 0; row < c.T; row++ {
			for i := 0; i < c.Dim; i++ {
				src := 2 * i // Megatron's [evens; odds] order
				if i >= half {
					src = 2*(i-half) + 1
				}
				got, want := float64(out[row*c.Dim+src]), c.Y[row*c.Dim+i]
				if math.Abs(got-want) > 2e-6*(1+math.Abs(want)) {
					t.Errorf("%s: position %d dim %d: %g, Megatron %g", name, row, i, got, want)
				}
			}
		}
	}
}
