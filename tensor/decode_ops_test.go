package tensor_test

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tensor/backendtest"
)

// TestDecodeOpsThreadIndependent: the CPU's PagedAttention splits a step's
// rows (and, with few rows, their heads) over the kernel threads, and
// SampleTokens its draws; every split must give the reference's bits.
func TestDecodeOpsThreadIndependent(t *testing.T) {
	defer cpu.SetThreads(cpu.SetThreads(1))
	for _, n := range []int{1, 2, 3, 8, 64} {
		cpu.SetThreads(n)
		if err := backendtest.CheckPagedAttention(tensor.CPUBackend()); err != nil {
			t.Fatalf("%d threads: %v", n, err)
		}
		if err := backendtest.CheckSampleTokens(tensor.CPUBackend()); err != nil {
			t.Fatalf("%d threads: %v", n, err)
		}
	}
}

// TestDecodeOpsCheckInputs: the ops reject inconsistent shapes and tables
// before any arithmetic, naming the problem.
func TestDecodeOpsCheckInputs(t *testing.T) {
	q, out := tensor.Zeros(2, 4, 8), tensor.Zeros(2, 4, 8)
	pool := func() *tensor.Tensor { return tensor.Zeros(3, 2, 4, 8) }
	cfg := func(tables, spans []int32) tensor.PagedAttentionConfig {
		return tensor.PagedAttentionConfig{
			BlockTables: tensor.FromInt32(tables, len(spans)/3, len(tables)/(len(spans)/3)),
			Spans:       tensor.FromInt32(spans, len(spans)/3, 3),
		}
	}
	for _, c := range []struct {
		name, want string
		run        func()
	}{
		{"heads", "query heads", func() {
			tensor.PagedAttention(tensor.Zeros(2, 3, 8), tensor.Zeros(2, 3, 8), pool(), pool(), cfg([]int32{0}, []int32{0, 2, 0}))
		}},
		{"head dim", "must be (blocks", func() {
			tensor.PagedAttention(out, q, tensor.Zeros(3, 2, 4, 6), tensor.Zeros(3, 2, 4, 6), cfg([]int32{0}, []int32{0, 2, 0}))
		}},
		{"rows", "spans cover 1 rows of 2", func() {
			tensor.PagedAttention(out, q, pool(), pool(), cfg([]int32{0}, []int32{0, 1, 0}))
		}},
		{"table", "beyond its block table", func() {
			tensor.PagedAttention(out, q, pool(), pool(), cfg([]int32{0}, []int32{0, 2, 3}))
		}},
		{"block", "outside the pool", func() {
			tensor.PagedAttention(out, q, pool(), pool(), cfg([]int32{0, 5}, []int32{0, 2, 3}))
		}},
		{"slot", "outside the pool", func() {
			tensor.PagedKVWrite(pool(), pool(), tensor.Zeros(1, 2, 8), tensor.Zeros(1, 2, 8), tensor.FromInt32([]int32{12}, 1))
		}},
		{"slots", "slots", func() {
			tensor.PagedKVWrite(pool(), pool(), tensor.Zeros(2, 2, 8), tensor.Zeros(2, 2, 8), tensor.FromInt32([]int32{1}, 1))
		}},
		{"pack dtype", "float16 storage", func() { tensor.PackWeight(tensor.Zeros(4, 3), tensor.Float16) }},
		{"packed input", "does not match", func() {
			var tp *tensor.Tape
			tp.LinearPacked(tensor.Zeros(2, 4), tensor.PackWeight(tensor.Zeros(4, 3), tensor.Float32), nil)
		}},
		{"packed grad", "records no gradient", func() {
			tensor.NewTape().LinearPacked(tensor.Param("x", 2, 3), tensor.PackWeight(tensor.Zeros(4, 3), tensor.Float32), nil)
		}},
	} {
		func() {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, c.want) {
					t.Errorf("%s: panic %v, want one containing %q", c.name, r, c.want)
				}
			}()
			c.run()
		}()
	}
}

// TestLinearPackedShapes: LinearPacked keeps x's leading dims and adds
// the bias as Linear does (a product exact in float32: small integers).
func TestLinearPackedShapes(t *testing.T) {
	x, w, b := tensor.Zeros(2, 3, 4), tensor.Zeros(5, 4), tensor.Zeros(5)
	for i, s := range [][]float32{x.Float32s(), w.Float32s(), b.Float32s()} {
		for j := range s {
			s[j] = float32((i+2*j)%7 - 3)
		}
	}
	var tp *tensor.Tape
	want := tp.Linear(x, w, b)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		got := tp.LinearPacked(x, tensor.PackWeight(w, dt), b)
		if !tensor.SameShape(got.Shape(), []int{2, 3, 5}) {
			t.Fatalf("%v: shape %v, want [2 3 5]", dt, got.Shape())
		}
		for i, v := range want.Float32s() {
			if got.Float32s()[i] != v {
				t.Fatalf("%v: element %d = %v, want %v", dt, i, got.Float32s()[i], v)
			}
		}
	}
}

// TestLinearPackedMatchesLinear: on every ISA path this CPU has, a product
// through a packed weight — float32, or bfloat16 of a weight whose values
// are bfloat16 — equals Linear's bit for bit, bias included, at decode
// and prefill row counts; except on AVX-512, whose one-to-three-row
// products take a dot-product path (then within float32 rounding).
func TestLinearPackedMatchesLinear(t *testing.T) {
	rng := tensor.NewRNG(5)
	in, out := 200, 70
	w, b := tensor.Zeros(out, in), tensor.Zeros(out)
	rng.Normal(w.Float32s(), 0, 1)
	rng.Normal(b.Float32s(), 0, 1)
	w = w.To(tensor.BFloat16).To(tensor.Float32) // bfloat16 values: both packings hold them exactly
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		func() {
			defer cpu.SetISA(cpu.SetISA(isa))
			if got := cpu.ActiveISA(); got != isa {
				t.Fatalf("SetISA(%v): active ISA is %v", isa, got)
			}
			for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
				pw := tensor.PackWeight(w, dt)
				for _, rows := range []int{1, 2, 3, 5, 40} {
					x := tensor.Zeros(rows, in)
					rng.Normal(x.Float32s(), 0, 1)
					var tp *tensor.Tape
					for _, bias := range []*tensor.Tensor{nil, b} {
						want, got := tp.Linear(x, w, bias).Float32s(), tp.LinearPacked(x, pw, bias).Float32s()
						for i := range want {
							d := float64(got[i] - want[i])
							if isa == cpu.ISAAVX512 && d < 1e-4 && d > -1e-4 || got[i] == want[i] {
								continue
							}
							t.Fatalf("%v, %v weight, %d rows, bias %v: element %d = %v, Linear %v", isa, dt, rows, bias != nil, i, got[i], want[i])
						}
					}
				}
			}
		}()
	}
}
