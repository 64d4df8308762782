package half_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/half"
	"github.com/gotron/gotron/tensor"
)

// TestOneBFloat16Rounding: every bfloat16 rounding in gotron (--bf16 matrix
// operands, bf16 collectives, tensor storage, safetensors export) gives the
// bits of half.BFloat16From, NaNs included (three copies used to disagree
// on NaN payloads).
func TestOneBFloat16Rounding(t *testing.T) {
	inputs := []uint32{0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x3F808000, 0x3F818000,
		0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FFFFFFF, 0xFFC12345}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		inputs = append(inputs, rng.Uint32())
	}
	for _, in := range inputs {
		f := math.Float32frombits(in)
		want := uint16(half.BFloat16From(f))
		st, err := safetensors.FromFloat32(safetensors.BF16, []int{1}, []float32{f})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			got  uint16
		}{
			{"cpu.RoundBF16", uint16(math.Float32bits(cpu.RoundBF16(f)) >> 16)},
			{"tensor.Float32ToBFloat16", tensor.Float32ToBFloat16(f)},
			{"safetensors BF16", uint16(st.Data[0]) | uint16(st.Data[1])<<8},
		} {
			if c.got != want {
				t.Fatalf("%s(%#08x) = %#04x, half.BFloat16From gives %#04x", c.name, in, c.got, want)
			}
		}
		if low := math.Float32bits(cpu.RoundBF16(f)) & 0xFFFF; low != 0 {
			t.Fatalf("cpu.RoundBF16(%#08x) leaves low bits %#04x", in, low)
		}
	}
}
