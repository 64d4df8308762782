package kernels_test

import (
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/fp8"
)

// fp8EncodeSample is a dense sample of float32 bit patterns for the cast:
// every sign, exponent and top 4 mantissa bits (the bits that choose the
// FP8 value and the rounding half for both formats, normal or subnormal)
// with the low 19 bits at the tie-deciding patterns (zero, one, the
// largest, around the middle) and random ones, then a stride through all
// 2^32 patterns. Rounding depends on the bits below the kept ones only
// through "zero, below, at or above half", which the patterns cover.
func fp8EncodeSample() []float32 {
	low := []uint32{0, 1, 2, 0x3FFFF, 0x40000, 0x40001, 0x7FFFE, 0x7FFFF}
	r := rand.New(rand.NewPCG(8, 27))
	for range 8 {
		low = append(low, r.Uint32()&0x7FFFF)
	}
	var xs []float32
	for top := range uint32(1 << 13) {
		for _, l := range low {
			xs = append(xs, math.Float32frombits(top<<19|l))
		}
	}
	for i := range uint32(1 << 16) {
		xs = append(xs, math.Float32frombits(i*65537+12345))
	}
	return xs
}

// TestFP8HostEncode: fp8.cu's integer cast (fp8_encode, which the cast
// kernels call on x·scale) gives fp8.Encode's code for every float32 of
// the dense sample, both formats; with bf16, the code of x rounded to
// bfloat16 first (cpu.RoundBF16). GOTRON_FP8_EXHAUSTIVE=1 checks all 2^32
// float32 patterns instead (minutes).
func TestFP8HostEncode(t *testing.T) {
	xs := fp8EncodeSample()
	exhaustive := os.Getenv("GOTRON_FP8_EXHAUSTIVE") == "1"
	for _, f := range []fp8.Format{fp8.E4M3, fp8.E5M2} {
		for _, bf16 := range []bool{false, true} {
			if exhaustive && !bf16 {
				fp8EncodeAll(t, f)
				continue
			}
			got := fp8Host.run(t, leBytes(xs), "encode", int(f), b2i(bf16), len(xs))
			if len(got) != len(xs) {
				t.Fatalf("%v: %d codes for %d values", f, len(got), len(xs))
			}
			for i, x := range xs {
				v := x
				if bf16 {
					v = cpu.RoundBF16(x)
				}
				if want := f.Encode(v); got[i] != want {
					t.Fatalf("%v bf16=%v: fp8_encode(%g, bits %#08x) = %#02x, fp8.Encode %#02x", f, bf16, x, math.Float32bits(x), got[i], want)
				}
			}
		}
	}
}

// fp8EncodeAll compares the cast with fp8.Encode over every float32, in
// chunks of 2^24.
func fp8EncodeAll(t *testing.T, f fp8.Format) {
	const chunk = 1 << 24
	xs := make([]float32, chunk)
	for base := uint64(0); base < 1<<32; base += chunk {
		for i := range xs {
			xs[i] = math.Float32frombits(uint32(base) + uint32(i))
		}
		got := fp8Host.run(t, leBytes(xs), "encode", int(f), 0, chunk)
		for i, x := range xs {
			if want := f.Encode(x); got[i] != want {
				t.Fatalf("%v: fp8_encode(bits %#08x) = %#02x, fp8.Encode %#02x", f, math.Float32bits(x), got[i], want)
			}
		}
	}
}

// TestFP8HostScale: fp8_tensorwise_scale is fp8.TensorwiseScale bit for
// bit: zero, subnormal, tiny (overflowing fmax/amax), ordinary, huge,
// infinite and NaN amaxes.
func TestFP8HostScale(t *testing.T) {
	amaxes := []float32{0, math.SmallestNonzeroFloat32, 1e-39, 1e-36, 2.5e-36, 1e-30, 3e-5, 0.1, 1, 3.14159, 448, 1000, 57344, 1e30, math.MaxFloat32,
		float32(math.Inf(1)), float32(math.NaN())}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		amaxes = append(amaxes, math.Float32frombits(r.Uint32()&0x7FFFFFFF))
	}
	for _, f := range []fp8.Format{fp8.E4M3, fp8.E5M2} {
		got := fromLE[float32](fp8Host.run(t, leBytes(amaxes), "scale", strconv.FormatFloat(float64(f.Max()), 'g', 9, 32), len(amaxes)))
		want := make([]float32, len(amaxes))
		for i, a := range amaxes {
			want[i] = fp8.TensorwiseScale(a, f)
		}
		sameBitsF32(t, f.String()+" scales", got, want)
	}
}

// TestFP8HostDelayedUpdate: fp8_delayed_update is fp8.History.Update on
// the same history (both algorithms, several lengths and margins, a NaN
// and an infinity in the history, an all-zero history that keeps the
// scale).
func TestFP8HostDelayedUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 5, 16} {
		for _, algo := range []fp8.AmaxAlgo{fp8.MostRecent, fp8.MaxOfHistory} {
			for _, margin := range []int{0, 2} {
				for trial := range 4 {
					h := fp8.NewHistory(n)
					amaxes := make([]float32, n)
					// fill the history through Observe/Update (its state is private)
					for k := range n {
						a := r.Float32() * 100
						switch {
						case trial == 1 && k == n/2:
							a = float32(math.NaN())
						case trial == 2 && k == 0:
							a = float32(math.Inf(1))
						case trial == 3:
							a = 0
						}
						h.Observe(a)
						h.Update(fp8.E4M3, margin, algo)
					}
					h.Observe(r.Float32() * 10)
					copy(amaxes, h.Amaxes())
					in := append(append([]float32(nil), amaxes...), h.Scale())
					f := fp8.E5M2
					scaledMax := f.Max() * float32(math.Pow(2, float64(-margin)))
					got := fromLE[float32](fp8Host.run(t, leBytes(in), "delayed", n, strconv.FormatFloat(float64(scaledMax), 'g', 9, 32), b2i(algo == fp8.MostRecent)))
					h.Update(f, margin, algo)
					want := append(h.Amaxes(), h.Scale())
					sameBitsF32(t, "history and scale", got, want)
				}
			}
		}
	}
}
