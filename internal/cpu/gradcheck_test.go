package cpu

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// gcInput is one differentiable input of an op under gradient check.
type gcInput struct {
	name string
	x    []float64
}

// gradCheck checks an op's float64 reference backward against central finite
// differences of L = Σ out·g for a fixed random g. fwd recomputes the output
// from the current values of the inputs; bwd adds the gradients of L into
// grads (one per input, same order). It also checks the accumulate contract:
// bwd on grads pre-filled with 0.5 must give 0.5 + the gradient (skip that with
// overwrite=true for ops that overwrite). Tolerance: |analytic - numeric| <=
// 1e-6*max(1, |numeric|) with step 1e-6 (central difference error ~1e-10).
func gradCheck(t *testing.T, ins []gcInput, fwd func() []float64, bwd func(dout []float64, grads [][]float64), overwrite bool) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	out := fwd()
	g := make([]float64, len(out))
	for i := range g {
		g[i] = rng.Float64()*2 - 1
	}
	loss := func() float64 {
		s := 0.0
		for i, o := range fwd() {
			s += o * g[i]
		}
		return s
	}
	grads := make([][]float64, len(ins))
	for i, in := range ins {
		grads[i] = make([]float64, len(in.x))
	}
	bwd(g, grads)
	const h = 1e-6
	for n, in := range ins {
		// check every element of small inputs, a spread sample of large ones
		stride := max(1, len(in.x)/97)
		for e := 0; e < len(in.x); e += stride {
			orig := in.x[e]
			in.x[e] = orig + h
			lp := loss()
			in.x[e] = orig - h
			lm := loss()
			in.x[e] = orig
			num := (lp - lm) / (2 * h)
			if d := math.Abs(grads[n][e] - num); d > 1e-6*math.Max(1, math.Abs(num)) || math.IsNaN(grads[n][e]) {
				t.Fatalf("d%s[%d]: analytic %.10g, numeric %.10g", in.name, e, grads[n][e], num)
			}
		}
	}
	if overwrite {
		return
	}
	acc := make([][]float64, len(ins))
	for i := range acc {
		acc[i] = make([]float64, len(ins[i].x))
		for j := range acc[i] {
			acc[i][j] = 0.5
		}
	}
	bwd(g, acc)
	for i := range acc {
		for j := range acc[i] {
			if d := math.Abs(acc[i][j] - 0.5 - grads[i][j]); d > 1e-12*math.Max(1, math.Abs(grads[i][j])) {
				t.Fatalf("d%s[%d]: backward does not accumulate: got %g after 0.5, want %g", ins[i].name, j, acc[i][j], 0.5+grads[i][j])
			}
		}
	}
}

// randF64 returns n uniform values in [-scale, scale) from a seeded generator.
func randF64(rng *rand.Rand, n int, scale float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = (rng.Float64()*2 - 1) * scale
	}
	return x
}

func to32(x []float64) []float32 {
	if x == nil {
		return nil
	}
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// to64 widens x; the fast-vs-reference tests feed both paths the same
// float32-representable inputs this way.
func to64(x []float32) []float64 {
	if x == nil {
		return nil
	}
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// round32 rounds x to float32 precision in place and returns it.
func round32(x []float64) []float64 {
	for i, v := range x {
		x[i] = float64(float32(v))
	}
	return x
}

// assertClose fails if any |got-want| > tol*max(1,|want|).
func assertClose(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), want[i]
		if math.IsNaN(g) || math.Abs(g-w) > tol*math.Max(1, math.Abs(w)) {
			t.Fatalf("%s[%d] = %.9g, want %.9g (tol %g)", what, i, g, w, tol)
		}
	}
}

func TestGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type op struct {
		name      string
		ins       []gcInput
		fwd       func() []float64
		bwd       func(dout []float64, grads [][]float64)
		overwrite bool
	}
	var ops []op
	{ // LayerNorm with and without bias
		n, c := 3, 7
		x, w, bb := randF64(rng, n*c, 2), randF64(rng, c, 1), randF64(rng, c, 1)
		out, mean, rstd := make([]float64, n*c), make([]float64, n), make([]float64, n)
		fwd := func() []float64 { layerNormForwardRef(out, mean, rstd, x, w, bb, n, c, 1e-5); return out }
		ops = append(ops, op{name: "layernorm", ins: []gcInput{{"inp", x}, {"weight", w}, {"bias", bb}}, fwd: fwd,
			bwd: func(g []float64, gr [][]float64) {
				fwd()
				layerNormBackwardRef(gr[0], gr[1], gr[2], g, x, w, mean, rstd, n, c)
			}})
		fwdNB := func() []float64 { layerNormForwardRef(out, mean, rstd, x, w, nil, n, c, 1e-5); return out }
		ops = append(ops, op{name: "layernorm-nobias", ins: []gcInput{{"inp", x}, {"weight", w}}, fwd: fwdNB,
			bwd: func(g []float64, gr [][]float64) {
				fwdNB()
				layerNormBackwardRef(gr[0], gr[1], nil, g, x, w, mean, rstd, n, c)
			}})
	}
	{
		n, c := 4, 5
		x, w := randF64(rng, n*c, 2), randF64(rng, c, 1)
		out, rstd := make([]float64, n*c), make([]float64, n)
		fwd := func() []float64 { rmsNormForwardRef(out, rstd, x, w, n, c, 1e-5); return out }
		ops = append(ops, op{name: "rmsnorm", ins: []gcInput{{"inp", x}, {"weight", w}}, fwd: fwd,
			bwd: func(g []float64, gr [][]float64) { fwd(); rmsNormBackwardRef(gr[0], gr[1], g, x, w, rstd, n, c) }})
	}
	for _, a := range []struct {
		name     string
		fwd, bwd any
	}{
		{"gelu-tanh", geluTanhForwardRef, geluTanhBackwardRef},
		{"gelu-erf", geluErfForwardRef, geluErfBackwardRef},
		{"silu", siluForwardRef, siluBackwardRef},
		{"squared-relu", squaredReLUForwardRef, squaredReLUBackwardRef},
	} {
		x := randF64(rng, 40, 4)
		out := make([]float64, len(x))
		f := a.fwd.(func(out, inp []float64))
		b := a.bwd.(func(dinp, dout, inp []float64))
		ops = append(ops, op{name: a.name, ins: []gcInput{{"inp", x}},
			fwd: func() []float64 { f(out, x); return out },
			bwd: func(g []float64, gr [][]float64) { b(gr[0], g, x) }})
	}
	{
		n, f := 3, 5
		x := randF64(rng, n*2*f, 3)
		out := make([]float64, n*f)
		ops = append(ops, op{name: "swiglu", ins: []gcInput{{"inp", x}},
			fwd: func() []float64 { swigluForwardRef(out, x, n, f); return out },
			bwd: func(g []float64, gr [][]float64) { swigluBackwardRef(gr[0], g, x, n, f) }})
	}
	{
		n, c := 3, 6
		x := randF64(rng, n*c, 3)
		out := make([]float64, n*c)
		fwd := func() []float64 { softmaxForwardRef(out, x, n, c); return out }
		ops = append(ops, op{name: "softmax", ins: []gcInput{{"inp", x}}, fwd: fwd,
			bwd: func(g []float64, gr [][]float64) { fwd(); softmaxBackwardRef(gr[0], g, out, n, c) }})
	}
	for _, s := range []float32{0, 0.1} {
		cfg := CrossEntropyConfig{N: 4, V: 7, LabelSmoothing: s, IgnoreIndex: -1}
		x := randF64(rng, cfg.N*cfg.V, 3)
		targets := []int32{2, -1, 6, 0}
		losses, lse := make([]float64, cfg.N), make([]float64, cfg.N)
		fwd := func() []float64 { crossEntropyForwardRef(losses, lse, x, targets, cfg); return losses }
		ops = append(ops, op{name: fmt.Sprintf("crossentropy-s%g", s), ins: []gcInput{{"logits", x}}, fwd: fwd, overwrite: true,
			bwd: func(g []float64, gr [][]float64) {
				fwd()
				crossEntropyBackwardRef(gr[0], x, lse, targets, g, cfg)
			}})
	}
	yarn := &YarnScaling{Factor: 40, OriginalMaxPositions: 8, BetaFast: 32, BetaSlow: 1, Mscale: 0.707, MscaleAllDim: 0.3}
	for _, cfg := range []RoPEConfig{{Dim: 4, MaxPositions: 16}, {Dim: 4, MaxPositions: 16, Style: Interleaved},
		{Dim: 4, MaxPositions: 16, Style: Interleaved, Yarn: yarn}} { // YaRN: scaled tables (MLA)
		b, tt, h, d := 2, 3, 2, 6
		pos := []int32{0, 5, 9, 1, 2, 15}
		x := randF64(rng, b*tt*h*d, 1)
		out := make([]float64, len(x))
		ops = append(ops, op{name: fmt.Sprintf("rope-style%d-yarn%v", cfg.Style, cfg.Yarn != nil), ins: []gcInput{{"x", x}},
			fwd: func() []float64 { ropeForwardRef(out, x, pos, b, tt, h, d, cfg, 1); return out },
			bwd: func(g []float64, gr [][]float64) { ropeBackwardRef(gr[0], g, pos, b, tt, h, d, cfg) }})
	}
	for _, cfg := range []AttentionConfig{
		{B: 1, T: 5, HQ: 2, HKV: 2, D: 3, Causal: true},
		{B: 2, T: 4, HQ: 4, HKV: 2, D: 3, Causal: true},
		{B: 1, T: 6, HQ: 2, HKV: 1, D: 4, Causal: true, DocIDs: []int32{0, 0, 1, 1, 1, 2}},
		{B: 1, T: 4, HQ: 1, HKV: 1, D: 2, Scale: 0.7},
		// attention dropout, the mask fixed by the key
		{B: 2, T: 5, HQ: 4, HKV: 2, D: 3, Causal: true, Dropout: 0.3, DropoutSeed: 3, FirstHead: 2},
		{B: 1, T: 6, HQ: 2, HKV: 1, D: 4, Causal: true, DocIDs: []int32{0, 0, 1, 1, 1, 2}, Dropout: 0.5, DropoutSeed: 4},
		{B: 1, T: 5, HQ: 1, HKV: 1, D: 2, Scale: 0.7, Dropout: 0.2, DropoutSeed: 5},
		// a block of a longer sequence (context parallelism): positions
		// offset, the causal cut off the diagonal, dropout keyed by
		// position from an odd key position
		{B: 2, T: 5, HQ: 2, HKV: 1, D: 3, Causal: true, QPos: 7, KPos: 4},
		{B: 1, T: 6, HQ: 2, HKV: 2, D: 3, Causal: true, QPos: 9, KPos: 3, Dropout: 0.3, DropoutSeed: 6, FirstHead: 1},
	} {
		if kept, dropped := allowedDrops(cfg); cfg.Dropout > 0 && (kept == 0 || dropped == 0) {
			t.Fatalf("attention %+v: dropout keeps %d and drops %d probabilities: the check needs both", cfg, kept, dropped)
		}
		q := randF64(rng, cfg.B*cfg.T*cfg.HQ*cfg.D, 1)
		k := randF64(rng, cfg.B*cfg.T*cfg.HKV*cfg.D, 1)
		v := randF64(rng, cfg.B*cfg.T*cfg.HKV*cfg.D, 1)
		out, lse := make([]float64, len(q)), make([]float64, cfg.B*cfg.HQ*cfg.T)
		fwd := func() []float64 { attentionForwardRef(out, lse, q, k, v, cfg); return out }
		ops = append(ops, op{name: fmt.Sprintf("attention-%+v", cfg), ins: []gcInput{{"q", q}, {"k", k}, {"v", v}}, fwd: fwd,
			bwd: func(g []float64, gr [][]float64) {
				fwd()
				attentionBackwardRef(gr[0], gr[1], gr[2], g, q, k, v, lse, cfg)
			}})
	}
	for _, o := range ops {
		t.Run(o.name, func(t *testing.T) { gradCheck(t, o.ins, o.fwd, o.bwd, o.overwrite) })
	}
}

// golden is one PyTorch fixture written by tools/golden/ops.py.
type golden struct {
	Op      string         `json:"op"`
	Params  map[string]any `json:"params"`
	Tensors []struct {
		Name  string `json:"name"`
		Dtype string `json:"dtype"`
		Shape []int  `json:"shape"`
	} `json:"tensors"`
	name string // file name without .bin
	f32  map[string][]float32
	i32  map[string][]int32
}

const goldenVersion = 1

// loadGolden reads testdata/golden/name.bin (format in tools/golden/ops.py).
func loadGolden(t *testing.T, name string) *golden {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+".bin")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 16 || string(b[:8]) != "GTGOLDEN" {
		t.Fatalf("%s: not a golden file (bad magic); regenerate with /usr/bin/python3 tools/golden/ops.py", path)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != goldenVersion {
		t.Fatalf("%s: version %d, want %d; regenerate with /usr/bin/python3 tools/golden/ops.py", path, v, goldenVersion)
	}
	hlen := int(binary.LittleEndian.Uint32(b[12:]))
	if 16+hlen > len(b) {
		t.Fatalf("%s: header length %d past end of file (%d bytes)", path, hlen, len(b))
	}
	g := &golden{name: name, f32: map[string][]float32{}, i32: map[string][]int32{}}
	if err := json.Unmarshal(b[16:16+hlen], g); err != nil {
		t.Fatalf("%s: header: %v", path, err)
	}
	off := 16 + hlen
	for _, ts := range g.Tensors {
		n := 1
		for _, s := range ts.Shape {
			n *= s
		}
		if off+4*n > len(b) {
			t.Fatalf("%s: tensor %s (%d elements) past end of file", path, ts.Name, n)
		}
		for i := 0; i < n; i++ {
			u := binary.LittleEndian.Uint32(b[off+4*i:])
			if ts.Dtype == "i32" {
				g.i32[ts.Name] = append(g.i32[ts.Name], int32(u))
			} else {
				g.f32[ts.Name] = append(g.f32[ts.Name], math.Float32frombits(u))
			}
		}
		off += 4 * n
	}
	if off != len(b) {
		t.Fatalf("%s: %d trailing bytes", path, len(b)-off)
	}
	return g
}

// f returns float32 tensor name, failing if absent.
func (g *golden) f(t *testing.T, name string) []float32 {
	t.Helper()
	x, ok := g.f32[name]
	if !ok {
		t.Fatalf("golden %s: no tensor %q", g.name, name)
	}
	return x
}

// p returns integer parameter name.
func (g *golden) p(name string) int { return int(g.Params[name].(float64)) }

// goldenTol is the tolerance against PyTorch goldens (computed in float64,
// stored as float32): |got - want| <= 1e-5*max(1, |want|).
const goldenTol = 1e-5

// checkGolden compares got with golden tensor name.
func (g *golden) check(t *testing.T, name string, got []float32) {
	t.Helper()
	assertClose(t, g.name+" "+name, got, to64(g.f(t, name)), goldenTol)
}

// forEachISA runs fn as a subtest under every ISA this CPU supports (pure Go,
// AVX2, AVX-512), restoring the active ISA afterwards.
func forEachISA(t *testing.T, name string, fn func(t *testing.T)) {
	for isa := ISAGeneric; isa <= DetectedISA(); isa++ {
		t.Run(name+"/"+isa.String(), func(t *testing.T) {
			defer SetISA(SetISA(isa))
			fn(t)
		})
	}
}
