package tensor

import (
	"testing"

	"github.com/gotron/gotron/internal/cuda/kernels"
	"github.com/gotron/gotron/internal/fp8"
)

// TestFP8ArgsMatchPTX checks, without a GPU, that fp8.cu's launch
// arguments (cuda_fp8.go) match its PTX parameters.
func TestFP8ArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["fp8"])
		for name, args := range map[string][]any{
			"fp8_amax_f32":           fp8AmaxArgs(1, 1, 1, true),
			"fp8_scale_tensorwise":   fp8ScaleArgs(1, fp8.E4M3),
			"fp8_scale_set":          fp8ScaleSetArgs(1, 2),
			"fp8_cast_f32":           fp8CastArgs(1, 1, 1, 1, fp8.E5M2, false),
			"fp8_cast_transpose_f32": fp8CastTransposeArgs(1, 1, 1, 1, 1, fp8.E4M3, true),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}
