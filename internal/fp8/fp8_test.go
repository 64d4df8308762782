package fp8

import (
	"encoding/json"
	"math"
	"os"
	"strconv"
	"testing"
)

type golden struct {
	Decode map[string][]string `json:"decode"`
	Encode map[string]struct {
		Inputs []string `json:"inputs"`
		Codes  []uint8  `json:"codes"`
	} `json:"encode"`
	CurrentScale []struct {
		Format  string `json:"format"`
		Amax    string `json:"amax"`
		Pow2    bool   `json:"pow2"`
		Epsilon string `json:"epsilon"`
		Scale   string `json:"scale"`
	} `json:"current_scale"`
	Delayed []struct {
		Format     string     `json:"format"`
		HistoryLen int        `json:"history_len"`
		Algo       string     `json:"algo"`
		Margin     int        `json:"margin"`
		Observed   [][]string `json:"observed"`
		After      []struct {
			History []string `json:"history"`
			Scale   string   `json:"scale"`
		} `json:"after"`
	} `json:"delayed"`
}

func loadGolden(t *testing.T) golden {
	t.Helper()
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// f32 reads a float32 written as its bits in hex ("nan" for a NaN).
func f32(t *testing.T, s string) float32 {
	t.Helper()
	if s == "nan" {
		return float32(math.NaN())
	}
	b, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	return math.Float32frombits(uint32(b))
}

func format(t *testing.T, name string) Format {
	switch name {
	case "e4m3":
		return E4M3
	case "e5m2":
		return E5M2
	}
	t.Fatalf("format %q", name)
	return 0
}

func sameF32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// TestGoldenDecode: all 256 codes of both formats decode to the values the
// bit layout defines (tools/golden/fp8.py), and every code that is not a
// NaN round-trips through Encode (NaNs encode to 0x7F).
func TestGoldenDecode(t *testing.T) {
	g := loadGolden(t)
	for name, want := range g.Decode {
		f := format(t, name)
		if len(want) != 256 {
			t.Fatalf("%s: %d codes", name, len(want))
		}
		for c := range 256 {
			got := f.Decode(uint8(c))
			if w := f32(t, want[c]); !sameF32(got, w) {
				t.Errorf("%s Decode(%#02x) = %v, want %v", name, c, got, w)
			}
			back := f.Encode(got)
			switch {
			case got != got:
				if back != NaN {
					t.Errorf("%s Encode(NaN from %#02x) = %#02x, want %#02x", name, c, back, NaN)
				}
			case math.IsInf(float64(got), 0):
				if want := f.maxCode() | uint8(c)&0x80; back != want {
					t.Errorf("%s Encode(%v) = %#02x, want the saturated %#02x", name, got, back, want)
				}
			case back != uint8(c):
				t.Errorf("%s Encode(Decode(%#02x) = %v) = %#02x", name, c, got, back)
			}
		}
	}
}

// TestGoldenEncode: the cast rounds to nearest even, saturates and keeps
// signs as the golden's nearest-value search does, on midpoints, their
// float32 neighbours, subnormals, overflow, infinities, NaN and random
// values.
func TestGoldenEncode(t *testing.T) {
	g := loadGolden(t)
	for name, c := range g.Encode {
		f := format(t, name)
		if len(c.Inputs) != len(c.Codes) || len(c.Inputs) < 1000 {
			t.Fatalf("%s: %d inputs, %d codes", name, len(c.Inputs), len(c.Codes))
		}
		bad := 0
		for i, in := range c.Inputs {
			x := f32(t, in)
			if got := f.Encode(x); got != c.Codes[i] {
				if bad++; bad < 10 {
					t.Errorf("%s Encode(%v [%s]) = %#02x, want %#02x", name, x, in, got, c.Codes[i])
				}
			}
		}
	}
}

// TestEncodeTies pins a few ties by hand: 1.0625 lies halfway between
// E4M3's 1 and 1.125 and goes to 1 (even mantissa); 1.1875 between 1.125
// and 1.25 goes to 1.25; 464 (between 448 and the missing 480) saturates.
func TestEncodeTies(t *testing.T) {
	for _, c := range []struct {
		f    Format
		x    float32
		want float32
	}{
		{E4M3, 1.0625, 1}, {E4M3, 1.1875, 1.25}, {E4M3, 464, 448}, {E4M3, 1e9, 448}, {E4M3, -1e9, -448},
		{E4M3, float32(math.Ldexp(1, -10)), 0}, {E4M3, float32(math.Ldexp(3, -11)), float32(math.Ldexp(1, -9))},
		{E5M2, 1.125, 1}, {E5M2, 1.375, 1.5}, {E5M2, float32(math.Inf(1)), 57344}, {E5M2, 61440, 57344},
	} {
		if got := c.f.Round(c.x); got != c.want {
			t.Errorf("%v Round(%v) = %v, want %v", c.f, c.x, got, c.want)
		}
	}
}

// TestGoldenCurrentScale: TE's compute_scale_from_amax.
func TestGoldenCurrentScale(t *testing.T) {
	g := loadGolden(t)
	if len(g.CurrentScale) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range g.CurrentScale {
		f := format(t, c.Format)
		got := CurrentScale(f32(t, c.Amax), f.Max(), c.Pow2, f32(t, c.Epsilon), math.MaxFloat32)
		if want := f32(t, c.Scale); !sameF32(got, want) {
			t.Errorf("%s amax %s pow2 %v eps %s: scale %v, want %v", c.Format, c.Amax, c.Pow2, c.Epsilon, got, want)
		}
	}
}

// TestGoldenDelayedUpdate: the delayed recipe's history roll and scale
// update against TE's formulas, step by step.
func TestGoldenDelayedUpdate(t *testing.T) {
	g := loadGolden(t)
	if len(g.Delayed) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range g.Delayed {
		f := format(t, c.Format)
		algo := MostRecent
		if c.Algo == "max" {
			algo = MaxOfHistory
		}
		h := NewHistory(c.HistoryLen)
		for step, obs := range c.Observed {
			for _, a := range obs {
				h.Observe(f32(t, a))
			}
			h.Update(f, c.Margin, algo)
			am := h.Amaxes()
			got := append(am[:min(4, len(am)):min(4, len(am))], am[len(am)-1])
			want := c.After[step]
			if !sameF32(h.Scale(), f32(t, want.Scale)) {
				t.Errorf("%s len %d %s margin %d step %d: scale %v, want %v", c.Format, c.HistoryLen, c.Algo, c.Margin, step, h.Scale(), f32(t, want.Scale))
			}
			for i := range got {
				if !sameF32(got[i], f32(t, want.History[i])) {
					t.Errorf("%s len %d %s step %d: history %v, want %v", c.Format, c.HistoryLen, c.Algo, step, got, want.History)
					break
				}
			}
		}
	}
}

// TestQuantizeScaled: Quantize multiplies by the scale in float32 and
// casts; dequantizing with ScaleInv lands within half an E4M3 step.
func TestQuantizeScaled(t *testing.T) {
	src := []float32{0.001, -0.5, 0.77, 3.2}
	scale := TensorwiseScale(Amax(src), E4M3)
	if scale != 448/float32(3.2) {
		t.Fatalf("scale %v", scale)
	}
	dst := make([]float32, len(src))
	Quantize(E4M3, dst, src, scale)
	if dst[3] != 448 {
		t.Errorf("amax element quantized to %v, want 448", dst[3])
	}
	for i, x := range src {
		d := dst[i] * ScaleInv(scale)
		if rel := math.Abs(float64(d-x)) / math.Abs(float64(x)); rel > 1.0/16 {
			t.Errorf("%v → %v (%v), relative error %v", x, dst[i], d, rel)
		}
	}
	if got := Amax([]float32{1, float32(math.NaN()), -2}); got != 2 {
		t.Errorf("Amax skips NaN: got %v", got)
	}
}

// TestRoundMatchesEncode: Round, computed on float32 bits, is
// Decode(Encode(x)) for the golden's inputs and a million float32 bit
// patterns spread over every exponent (NaNs, infinities, subnormals).
func TestRoundMatchesEncode(t *testing.T) {
	g := loadGolden(t)
	var inputs []float32
	for _, c := range g.Encode {
		for _, in := range c.Inputs {
			inputs = append(inputs, f32(t, in))
		}
	}
	for i := uint32(0); i < 1<<20; i++ {
		inputs = append(inputs, math.Float32frombits(i*4093+i>>7)) // odd stride: every exponent, varied mantissas
	}
	for _, f := range []Format{E4M3, E5M2} {
		for _, x := range inputs {
			if got, want := f.Round(x), f.Decode(f.Encode(x)); !sameF32(got, want) {
				t.Fatalf("%v Round(%v [%08x]) = %v, Decode(Encode) %v", f, x, math.Float32bits(x), got, want)
			}
		}
	}
}
