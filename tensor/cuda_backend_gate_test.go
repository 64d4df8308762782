package tensor

import (
	"regexp"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
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

// TestGDNArgsMatchPTX checks, without a GPU, that the launch arguments of
// every kernel in gdn.cu's PTX (cuda_backend_gdn.go) match its parameters,
// and that none is left without a case here.
func TestGDNArgsMatchPTX(t *testing.T) {
	s := cpu.DeltaRuleShape{B: 1, T: 1, Heads: 1, DK: 1, DV: 1, Scale: 1, Chunk: 1}
	var p gdnPtrs
	cases := map[string][]any{
		"gdn_conv_silu_fwd_f32":  gdnConvArgs(1, 0, 1, 1, 1, 0, 1, 1, 1),
		"gdn_conv_silu_dpre_f32": gdnConvArgs(1, 1, 1, 1, 1, 0, 1, 1, 1),
		"gdn_conv_silu_dx_f32":   gdnConvArgs(1, 0, 1, 1, 1, 0, 1, 1, 1),
		"gdn_conv_silu_dw_f32":   gdnConvArgs(1, 0, 1, 1, 1, 1, 1, 1, 1),
		"gdn_l2norm_fwd_f32":     gdnL2NormArgs(1, 0, 1, 1, 1, 1e-6),
		"gdn_l2norm_bwd_f32":     gdnL2NormArgs(1, 1, 1, 1, 1, 1e-6),
		"gdn_repeat_heads_f32":   gdnHeadsArgs(1, 1, 1, 1, 1, 1),
		"gdn_fold_heads_f32":     gdnHeadsArgs(1, 1, 1, 1, 1, 1),
	}
	for _, k := range []string{"gdn_gates_fwd_f32", "gdn_gates_bwd_f32", "gdn_gates_sums_f32"} {
		cases[k] = gdnGatesArgs(k, p, 1, 1)
	}
	for _, k := range append([]string{"gdn_delta_fwd_f32"}, gdnDeltaBackwardKernels...) {
		cases[k] = gdnDeltaArgs(k, p, s, 0)
	}
	for _, k := range []string{"gdn_conv_runs_f32", "gdn_delta_runs_f32", "gdn_conv_runs_ptr_f32", "gdn_delta_runs_ptr_f32"} {
		cases[k] = gdnRunsArgs(k, p, 1, 1, 1, 1, 1, 1, 1)
	}
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["gdn"])
		entries := regexp.MustCompile(`\.entry (\w+)\(`).FindAllStringSubmatch(ptx, -1)
		if len(entries) != len(cases) {
			t.Errorf("sm_%d%d: gdn.cu has %d kernels, the test %d cases", arch[0], arch[1], len(entries), len(cases))
		}
		for _, e := range entries {
			args, ok := cases[e[1]]
			if !ok {
				t.Errorf("sm_%d%d: kernel %s has no case here", arch[0], arch[1], e[1])
				continue
			}
			checkArgsMatchPTX(t, arch, ptx, e[1], args)
		}
	}
}

// TestDSAArgsMatchPTX checks, without a GPU, that the launch arguments of
// every kernel in dsa.cu's PTX (cuda_backend_dsa.go) match its parameters,
// and that none is left without a case here.
func TestDSAArgsMatchPTX(t *testing.T) {
	cases := map[string][]any{
		"dsa_hadamard_f32":      dsaHadamardArgs(1, 1, 1, 1, 1, 1),
		"dsa_index_combine_f32": dsaCombineArgs(1, 1, 1, 1, 1, 1, 1, 1, true),
		"dsa_topk_keys_u64":     dsaTopKKeysArgs(1, 1, 1, 1, 1),
		"dsa_bitonic_u64":       dsaBitonicArgs(1, 1, 1, 1, 1),
		"dsa_topk_out_i32":      dsaTopKOutArgs(1, 1, 1, 1, 1),
		"dsa_sparse_fwd_f32":    dsaSparseRowArgs(1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
		"dsa_sparse_probs_f32":  dsaSparseRowArgs(1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
		"dsa_sparse_ds_f32":     dsaSparseDSArgs(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
		"dsa_target_f32":        dsaTargetArgs(1, 1, 1, 1, 1, 1, 1, true),
		"dsa_loss_f32":          dsaLossArgs(1, 1, 1, 1, 1, 1, 1, 1, true, 1),
		"dsa_index_bwd_f32":     dsaIndexBwdArgs(1, 1, 1, 1, 1, 1, 1, 1, 1, true),
	}
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["dsa"])
		entries := regexp.MustCompile(`\.entry (\w+)\(`).FindAllStringSubmatch(ptx, -1)
		if len(entries) != len(cases) {
			t.Errorf("sm_%d%d: dsa.cu has %d kernels, the test %d cases", arch[0], arch[1], len(entries), len(cases))
		}
		for _, e := range entries {
			args, ok := cases[e[1]]
			if !ok {
				t.Errorf("sm_%d%d: kernel %s has no case here", arch[0], arch[1], e[1])
				continue
			}
			checkArgsMatchPTX(t, arch, ptx, e[1], args)
		}
	}
}
