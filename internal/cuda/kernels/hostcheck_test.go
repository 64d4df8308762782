package kernels_test

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/half"
	"github.com/gotron/gotron/tensor"
)

// The kernels' scalar helpers that must match Go bit for bit (dtype
// conversions, the Philox dropout stream) are __host__ __device__: these
// tests build testdata/hostcheck.cu for the host with nvcc (hostcheck)
// and compare its output with the Go code the kernels port. Without nvcc
// they skip.

// runHostcheck runs the harness with args and stdin, returning its lines.
func runHostcheck(t *testing.T, stdin string, args ...any) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(hostcheck.run(t, []byte(stdin), args...)))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestHostWidening: every bfloat16 and float16 widens as internal/half.
func TestHostWidening(t *testing.T) {
	lines := runHostcheck(t, "", "half")
	if len(lines) != 1<<16 {
		t.Fatalf("hostcheck half printed %d lines, want 65536", len(lines))
	}
	for h, line := range lines {
		want := fmt.Sprintf("%x %x", math.Float32bits(half.BFloat16(h).Float32()), math.Float32bits(half.Float16(h).Float32()))
		if line != want {
			t.Fatalf("16-bit %#04x widens to %s (bf16 f16 bits), internal/half gives %s", h, line, want)
		}
	}
}

// TestHostNarrowing: float32 → bfloat16, float16 (internal/half) and to
// int32, int64 (Go's conversion on amd64) for special values, every
// exponent and random bit patterns.
func TestHostNarrowing(t *testing.T) {
	bits := []uint32{0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345, 0x7F7FFFFF,
		0x477FE000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x387FC000, 0x38800000, 0x00000001,
		0x3F808000, 0x3F818000, 0x3F800001, 0x4F000000, 0xCF000000, 0xCF000001, 0x5F000000, 0xDF000000, 0x4EFFFFFF}
	rng := rand.New(rand.NewPCG(1, 2))
	for e := range uint32(256) {
		for range 64 {
			bits = append(bits, e<<23|rng.Uint32()&0x807FFFFF)
		}
	}
	// Exact ties of both roundings: bfloat16 (low 16 bits 0x8000) and
	// float16, normal (low 13 bits 0x1000) and subnormal (the bits below
	// the kept ones exactly half).
	for e := uint32(100); e < 150; e++ {
		for range 32 {
			m := rng.Uint32()
			bits = append(bits, e<<23|m&0x807F0000|0x8000, e<<23|m&0x807FE000|0x1000)
			if e < 113 { // float16 subnormal: 14-(e-112) bits dropped
				shift := uint32(14 - (int(e) - 112))
				if shift < 24 {
					bits = append(bits, e<<23|(m&0x807FFFFF)&^(1<<shift-1)|1<<(shift-1))
				}
			}
		}
	}
	for range 100000 {
		bits = append(bits, rng.Uint32())
	}
	var in strings.Builder
	for _, b := range bits {
		fmt.Fprintf(&in, "%x\n", b)
	}
	lines := runHostcheck(t, in.String(), "f32")
	if len(lines) != len(bits) {
		t.Fatalf("hostcheck f32 printed %d lines for %d values", len(lines), len(bits))
	}
	for i, b := range bits {
		f := math.Float32frombits(b)
		got := strings.Fields(lines[i])
		if want := fmt.Sprintf("%x", uint16(half.BFloat16From(f))); got[0] != want {
			t.Fatalf("float32 %#08x → bfloat16 %s, internal/half gives %s", b, got[0], want)
		}
		if want := fmt.Sprintf("%x", uint16(half.Float16From(f))); got[1] != want {
			t.Fatalf("float32 %#08x → float16 %s, internal/half gives %s", b, got[1], want)
		}
		// Go leaves NaN and out-of-range conversions to the platform;
		// the kernels do what amd64 does.
		inRange32 := f >= -(1<<31) && f < 1<<31
		inRange64 := f >= -(1<<63) && f < 1<<63
		if inRange32 || runtime.GOARCH == "amd64" {
			if want := fmt.Sprintf("%x", uint32(int32(f))); got[2] != want {
				t.Fatalf("float32 %#08x (%v) → int32 %s, Go gives %s", b, f, got[2], want)
			}
		}
		if inRange64 || runtime.GOARCH == "amd64" {
			if want := fmt.Sprintf("%x", uint64(int64(f))); got[3] != want {
				t.Fatalf("float32 %#08x (%v) → int64 %s, Go gives %s", b, f, got[3], want)
			}
		}
	}
}

// TestHostDropoutMask: dropout.cu's Philox blocks give tensor.RNG's
// DropoutMask bit for bit, across a 2³² block-counter carry, for lengths
// that are not multiples of 4.
func TestHostDropoutMask(t *testing.T) {
	for _, c := range []struct {
		key    [2]uint32
		offset uint64
		p      float32
		n      int
	}{
		{[2]uint32{0, 0}, 0, 0.1, 1001},
		{[2]uint32{0xDEADBEEF, 0x12345678}, 7, 0.5, 4096},
		{[2]uint32{42, 0}, 1<<32 - 3, 0.3, 37},
		{[2]uint32{0xFFFFFFFF, 0xFFFFFFFF}, 1<<63 + 5, 0.9, 18},
		{[2]uint32{1, 2}, 3, 0, 12},
	} {
		r := tensor.NewRNG(0)
		r.SetState(tensor.RNGState{Key: c.key, Offset: c.offset})
		want := make([]float32, c.n)
		r.DropoutMask(want, c.p)
		// The host's share of tensor.cudaBackend.DropoutMask.
		keep := 1 / (1 - c.p)
		thr := uint32(float64(c.p) * (1 << 32))
		lines := runHostcheck(t, "", "dropout", c.key[0], c.key[1], c.offset, thr, math.Float32bits(keep), c.n)
		if len(lines) != c.n {
			t.Fatalf("hostcheck dropout printed %d values, want %d", len(lines), c.n)
		}
		for i, line := range lines {
			if want := fmt.Sprintf("%x", math.Float32bits(want[i])); line != want {
				t.Fatalf("key %x offset %d p %v: mask[%d] bits %s, tensor.RNG gives %s", c.key, c.offset, c.p, i, line, want)
			}
		}
	}
}

// activationBits are float32 bit patterns for the activation checks:
// zeros of both signs, infinities, NaN, the extremes of every exponent
// and random patterns.
func activationBits(rng *rand.Rand, n int) []uint32 {
	bits := []uint32{0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x00000001, 0x80000001,
		0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000, 0x5F800000, 0x1F800000, 0x9F800000}
	for e := range uint32(256) {
		bits = append(bits, e<<23|rng.Uint32()&0x807FFFFF)
	}
	for len(bits) < n {
		// mostly ordinary magnitudes, as activations are
		bits = append(bits, math.Float32bits(float32(rng.NormFloat64()*4)))
	}
	return bits
}

// TestHostSquaredReLU: elem.cu's squared ReLU helpers (the bodies of
// elem_sqrelu_fwd_f32 and _bwd_f32) give internal/cpu's SquaredReLUForward
// and SquaredReLUBackward bit for bit, signed zeros and infinities
// included (NaN gives NaN, whatever its payload).
func TestHostSquaredReLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	n := 20000
	x, d, dx := activationBits(rng, n), activationBits(rng, n), activationBits(rng, n)
	rng.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	rng.Shuffle(len(dx), func(i, j int) { dx[i], dx[j] = dx[j], dx[i] })
	n = min(len(x), len(d), len(dx))
	var in strings.Builder
	xf, df, dxf := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		fmt.Fprintf(&in, "%x %x %x\n", x[i], d[i], dx[i])
		xf[i], df[i], dxf[i] = math.Float32frombits(x[i]), math.Float32frombits(d[i]), math.Float32frombits(dx[i])
	}
	fwd := make([]float32, n)
	cpu.SquaredReLUForward(fwd, xf)
	cpu.SquaredReLUBackward(dxf, df, xf) // accumulates into dxf
	lines := runHostcheck(t, in.String(), "sqrelu")
	if len(lines) != n {
		t.Fatalf("hostcheck sqrelu printed %d lines for %d values", len(lines), n)
	}
	for i, line := range lines {
		// NaN as NaN: its bits are the GPU's canonical NaN there, and
		// Go's max gives its own
		if want := fmt.Sprintf("%s %s", nanAlike(fwd[i]), nanAlike(dxf[i])); nanAlikeLine(line) != want {
			t.Fatalf("x %#08x dout %#08x dx %#08x: the kernel gives %s (forward backward bits), internal/cpu %s", x[i], d[i], dx[i], line, want)
		}
	}
}

// TestHostSigmoidGate: elem.cu's output-gate helpers (the bodies of
// elem_sigmoid_gate_fwd_f32 and _bwd_f32) against tensor's SigmoidGate on
// the CPU, forward and both gradients: within one float32 ulp (the
// host's float64 exp and Go's math.Exp may differ in the last bit, which
// can move a rounding to float32), and equal for all but a few in a
// thousand. A wrong formula, order or rounding is off by far more.
func TestHostSigmoidGate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n := 20000
	x, g, d := activationBits(rng, n), activationBits(rng, n), activationBits(rng, n)
	rng.Shuffle(len(g), func(i, j int) { g[i], g[j] = g[j], g[i] })
	rng.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	n = min(len(x), len(g), len(d))
	var in strings.Builder
	xf, gf, df := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		fmt.Fprintf(&in, "%x %x %x\n", x[i], g[i], d[i])
		xf[i], gf[i], df[i] = math.Float32frombits(x[i]), math.Float32frombits(g[i]), math.Float32frombits(d[i])
	}
	xp, gp := tensor.Param("x", n), tensor.Param("gate", n)
	copy(xp.Float32s(), xf)
	copy(gp.Float32s(), gf)
	tp := tensor.NewTape()
	out := tp.SigmoidGate(xp, gp)
	if err := tp.BackwardFrom([]*tensor.Tensor{out}, []*tensor.Tensor{tensor.FromFloat32(df, n)}); err != nil {
		t.Fatal(err)
	}
	want := [3][]float32{out.Float32s(), xp.Grad.Float32s(), gp.Grad.Float32s()}
	lines := runHostcheck(t, in.String(), "sgate")
	if len(lines) != n {
		t.Fatalf("hostcheck sgate printed %d lines for %d values", len(lines), n)
	}
	differ := 0
	for i, line := range lines {
		f := strings.Fields(line)
		for k, what := range []string{"out", "dx", "dgate"} {
			var u uint32
			fmt.Sscanf(f[k], "%x", &u)
			got, w := math.Float32frombits(u), want[k][i]
			if got == w || got != got && w != w { // ±0 alike: the tape adds the gradient into a zeroed one
				continue
			}
			differ++
			if ulps := int64(math.Float32bits(got)) - int64(math.Float32bits(w)); got*w <= 0 || ulps > 1 || ulps < -1 {
				t.Fatalf("x %v gate %v dout %v: the kernel's %s is %v, the CPU's %v", xf[i], gf[i], df[i], what, got, w)
			}
		}
	}
	if differ > 3*n/1000 {
		t.Errorf("%d of %d values differ by an ulp from the CPU's: more than the float64 exp's last bit explains", differ, 3*n)
	}
	t.Logf("%d of %d values one ulp from the CPU's, the rest equal", differ, 3*n)
}

// nanAlike is f's bits in hex, or "nan" for every NaN.
func nanAlike(f float32) string {
	if f != f {
		return "nan"
	}
	return fmt.Sprintf("%x", math.Float32bits(f))
}

// nanAlikeLine rewrites a harness line of float32 bits in hex with
// nanAlike.
func nanAlikeLine(line string) string {
	f := strings.Fields(line)
	for i, s := range f {
		var u uint32
		fmt.Sscanf(s, "%x", &u)
		f[i] = nanAlike(math.Float32frombits(u))
	}
	return strings.Join(f, " ")
}

// TestHostCausalConvSiLU: gdn.cu's causal convolution with SiLU (the
// bodies of gdn_conv_silu_fwd_f32, _dpre_f32, _dx_f32 and _dw_f32, run over
// every element) against internal/cpu's CausalConvSiLUForward and
// CausalConvSiLUBackward (accumulating into non-zero dx and dw): equal for
// all but a few values in a thousand and those within a few ulps (the
// host's float64 exp and Go's may differ in the last bit, which can move a
// float32 rounding, and dx, dw sum such values), for kernel widths 1 to 4,
// one and several batch rows, sequences shorter than the kernel.
func TestHostCausalConvSiLU(t *testing.T) {
	for _, c := range []struct{ b, t, c, k int }{{1, 9, 5, 4}, {2, 7, 6, 3}, {3, 2, 4, 4}, {2, 5, 3, 1}} {
		t.Run(fmt.Sprintf("b%d-t%d-c%d-k%d", c.b, c.t, c.c, c.k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.b*c.t), uint64(c.c*c.k)))
			n, nw := c.b*c.t*c.c, c.c*c.k
			fill := func(m int, std float64) []float32 {
				v := make([]float32, m)
				for i := range v {
					v[i] = float32(rng.NormFloat64() * std)
				}
				return v
			}
			x, w, dout, dx, dw := fill(n, 2), fill(nw, 0.7), fill(n, 1), fill(n, 1), fill(nw, 1)
			var in strings.Builder
			for _, a := range [][]float32{x, w, dout, dx, dw} {
				for _, v := range a {
					fmt.Fprintf(&in, "%x\n", math.Float32bits(v))
				}
			}
			out := make([]float32, n)
			cpu.CausalConvSiLUForward(out, x, w, c.b, c.t, c.c, c.k)
			cpu.CausalConvSiLUBackward(dx, dw, dout, x, w, c.b, c.t, c.c, c.k)
			lines := runHostcheck(t, in.String(), "gdnconv", c.b, c.t, c.c, c.k)
			want := append(append(out, dx...), dw...)
			if len(lines) != len(want) {
				t.Fatalf("hostcheck gdnconv printed %d lines, want %d", len(lines), len(want))
			}
			differ := 0
			for i, line := range lines {
				var u uint32
				fmt.Sscanf(line, "%x", &u)
				got := math.Float32frombits(u)
				if got == want[i] {
					continue
				}
				differ++
				if ulps := int64(u) - int64(math.Float32bits(want[i])); got*want[i] <= 0 || ulps > 4 || ulps < -4 {
					t.Fatalf("value %d (out, dx, dw in turn): the kernel's %v, the CPU's %v", i, got, want[i])
				}
			}
			if differ > max(1, 3*len(want)/1000) {
				t.Errorf("%d of %d values differ from the CPU's: more than the float64 exp's last bit explains", differ, len(want))
			}
		})
	}
}
