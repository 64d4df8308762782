package tensor

import (
	"testing"

	"github.com/gotron/gotron/internal/cuda/kernels"
)

// TestElemGateArgsMatchPTX checks, without a GPU, that the squared ReLU's
// and the output gate's launch arguments (cuda_backend_elem.go,
// cuda_backend_gate.go) match elem.cu's PTX parameters, in number and
// size.
func TestElemGateArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["elem"])
		for name, args := range map[string][]any{
			"elem_sqrelu_fwd_f32":       sqreluArgs(1, 0, 1, 1),
			"elem_sqrelu_bwd_f32":       sqreluArgs(1, 1, 1, 1),
			"elem_sigmoid_gate_fwd_f32": sigmoidGateArgs(1, 0, 0, 1, 1, 1),
			"elem_sigmoid_gate_bwd_f32": sigmoidGateArgs(1, 1, 1, 1, 1, 1),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}

// TestGDNConvArgsMatchPTX checks, without a GPU, that the causal
// convolution's launch arguments (cuda_backend_gdn.go) match gdn.cu's PTX
// parameters.
func TestGDNConvArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["gdn"])
		for name, args := range map[string][]any{
			"gdn_conv_silu_fwd_f32":  gdnConvArgs(1, 0, 1, 1, 1, 0, 1, 1, 1),
			"gdn_conv_silu_dpre_f32": gdnConvArgs(1, 1, 1, 1, 1, 0, 1, 1, 1),
			"gdn_conv_silu_dx_f32":   gdnConvArgs(1, 0, 1, 1, 1, 0, 1, 1, 1),
			"gdn_conv_silu_dw_f32":   gdnConvArgs(1, 0, 1, 1, 1, 1, 1, 1, 1),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}
