package tensor

import (
	"regexp"
	"testing"

	"github.com/gotron/gotron/internal/cuda/kernels"
)

// TestAttnmatArgsMatchPTX checks, without a GPU, that the materialized
// attention's launch arguments match its kernels' parameters in the
// embedded PTX one for one in size: cuLaunchKernel cannot, and a missing or
// misplaced argument would read garbage on the device.
func TestAttnmatArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["attnmat"])
		a := cudaAttn{}
		for name, args := range map[string][]any{
			"attnmat_fwd_f32": attnmatFwdArgs(0, 0, 0, a, 1, 1, 1, 1, 0),
			"attnmat_bwd_f32": attnmatBwdArgs(0, 0, 0, 0, 0, a, 1, 1, 1, 1, 0),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}

// ptxParamBytes returns the sizes of entry's .param list in ptx.
func ptxParamBytes(t *testing.T, ptx, entry string) []int {
	t.Helper()
	sig := regexp.MustCompile(`(?s)\.entry ` + entry + `\((.*?)\)`).FindStringSubmatch(ptx)
	if sig == nil {
		t.Fatalf("no .entry %s in the PTX", entry)
	}
	var sizes []int
	for _, m := range regexp.MustCompile(`\.param \.[a-z]+(\d+) `).FindAllStringSubmatch(sig[1], -1) {
		switch m[1] {
		case "64":
			sizes = append(sizes, 8)
		case "32":
			sizes = append(sizes, 4)
		default:
			t.Fatalf("%s: parameter width %s bits", entry, m[1])
		}
	}
	return sizes
}

// checkArgsMatchPTX checks that a kernel's launch arguments match, one
// for one in size, the parameters of its .entry name in the arch's PTX.
func checkArgsMatchPTX(t *testing.T, arch [2]int, ptx, name string, args []any) {
	t.Helper()
	want := ptxParamBytes(t, ptx, name)
	if len(want) != len(args) {
		t.Fatalf("sm_%d%d %s: %d arguments, the PTX has %d parameters", arch[0], arch[1], name, len(args), len(want))
	}
	for i, x := range args {
		if got := argBytes(x); got != want[i] {
			t.Errorf("sm_%d%d %s argument %d: %T is %d bytes, the PTX parameter %d", arch[0], arch[1], name, i, x, got, want[i])
		}
	}
}

func argBytes(x any) int {
	switch x.(type) {
	case uintptr, int64, uint64, float64:
		return 8
	case int32, uint32, float32:
		return 4
	}
	return -1
}

// TestCUDACopyName: under GOTRON_CUDA_PROFILE a host copy's profile entry
// names the site that asked for it; without profiling the name is the bare
// kind. copySite names the first function past the copy helpers.
func TestCUDACopyName(t *testing.T) {
	rt := &cudaRuntime{}
	if got := rt.copyName("copy host to device", "train.batchTo"); got != "copy host to device" {
		t.Errorf("without profiling: %q", got)
	}
	rt.prof = &cudaProfile{byName: map[string]*cudaProfEntry{}}
	if got, want := rt.copyName("copy host to device", "train.batchTo"), "copy host to device from train.batchTo"; got != want {
		t.Errorf("profiling: %q, want %q", got, want)
	}
	// as copyToCUDA calls it: one frame (this closure) between the caller
	// and copySite
	copyToCUDALike := func() string { return copySite() }
	if got, want := copyToCUDALike(), "tensor.TestCUDACopyName"; got != want {
		t.Errorf("copySite: %q, want %q", got, want)
	}
}

// TestCUDAUnverified: GOTRON_CUDA_UNVERIFIED turns on every unverified
// feature with 1 or all, only the named ones with a list, none unset.
func TestCUDAUnverified(t *testing.T) {
	for _, c := range []struct {
		env, feature string
		want         bool
	}{
		{"", "cp", false}, {"1", "cp", true}, {"all", "staged-copies", true}, {"0", "cp", false},
		{"cp, staged-copies", "staged-copies", true}, {"cp,staged-copies", "attn-bf16", false},
		{"attn-bf16,flash-tc", "flash-tc", true}, {"flash-tc", "attn-bf16", false},
		{"fusion,gemm-bf16", "gemm-bf16", true}, {"attn-bf16", "gemm-bf16", false},
	} {
		getenv := func(k string) string {
			if k == "GOTRON_CUDA_UNVERIFIED" {
				return c.env
			}
			return ""
		}
		if got := CUDAUnverified(getenv, c.feature); got != c.want {
			t.Errorf("GOTRON_CUDA_UNVERIFIED=%q, %s: %v, want %v", c.env, c.feature, got, c.want)
		}
	}
}

// TestFusedArgsMatchPTX checks, without a GPU, that the fused kernels'
// launch arguments (cuda_backend_fused.go) match fused.cu's PTX parameters.
func TestFusedArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["fused"])
		rng := RNGState{}
		for name, args := range map[string][]any{
			biasGELUKernel(true, "fwd"):       biasGELUArgs(1, 0, 1, 1, 1, 1),
			biasGELUKernel(true, "bwd"):       biasGELUArgs(1, 1, 1, 1, 1, 1),
			biasGELUKernel(false, "fwd"):      biasGELUArgs(1, 0, 1, 1, 1, 1),
			biasGELUKernel(false, "bwd"):      biasGELUArgs(1, 1, 1, 1, 1, 1),
			"fused_bias_swiglu_fwd_f32":       biasGELUArgs(1, 0, 1, 1, 1, 1),
			"fused_bias_swiglu_bwd_f32":       biasGELUArgs(1, 1, 1, 1, 1, 1),
			"fused_bias_dropout_add_f32":      biasDropoutAddArgs(1, 1, 1, 1, 1, 1, 0.1, rng),
			"fused_dropout_bwd_f32":           dropoutBackwardArgs(1, 1, 1, 0.1, rng),
			"fused_bias_dropout_add_norm_f32": biasDropoutAddNormArgs(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0.1, rng, 1e-5),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}

// TestMoERouterArgsMatchPTX checks, without a GPU, that the MoE router
// kernels' launch arguments (cuda_backend_router.go) match moe.cu's PTX
// parameters, for every score function the kernels take, with the losses
// and the z-loss, and the permutation's.
func TestMoERouterArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["moe"])
		for _, c := range []*RouterConfig{
			{Experts: 8, TopK: 2},
			{Experts: 16, TopK: 4, Score: ScoreSigmoid, NumGroups: 4, GroupTopK: 2, ScalingFactor: 2.5},
			{Experts: 8, TopK: 2, Losses: true, ZLossCoeff: 1e-3, Batch: 1, SeqLen: 3, Balancing: []LoadBalancing{{Coeff: 0.01}}},
		} {
			for name, args := range map[string][]any{
				"moe_route_fwd_f32":      moeRouteFwdArgs(1, 1, 1, 1, 1, 3, c.Experts, c),
				"moe_route_bwd_f32":      moeRouteBwdArgs(1, 1, 1, 1, 1, 1, 3, c.Experts, c, 0.5),
				"moe_route_aux_f32":      moeRouteAuxArgs(1, 1, 1, 3, c.Experts, c),
				"moe_route_aux_sums_f64": moeRouteAuxSumsArgs(1, 1, c),
				"moe_route_z_f64":        moeRouteZArgs(1, 1, 3, c.Experts),
				"moe_route_zsum_f64":     moeRouteZSumArgs(1, 1, 3),
				"moe_perm_count_i32":     moePermCountArgs(1, 1, 3, c.Experts, c.TopK, moePermChunk),
				"moe_perm_scan_i32":      moePermScanArgs(1, 1, 1, c.Experts),
				"moe_perm_rows_i32":      moePermRowsArgs(1, 1, 1, 1, 1, 3, c.Experts, c.TopK, moePermChunk),
			} {
				checkArgsMatchPTX(t, arch, ptx, name, args)
			}
		}
	}
}

// TestNormBF16ArgsMatchPTX checks, without a GPU, that the norm kernels
// writing a bfloat16 operand beside their output (cuda_backend_norm.go,
// gemm-bf16) get the arguments norm.cu's PTX declares.
func TestNormBF16ArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["norm"])
		for name, args := range map[string][]any{
			"norm_layernorm_fwd_f32_bf16": layerNormBF16Args(1, 1, 1, 1, 1, 1, 0, 1, 1, 1e-5),
			"norm_rmsnorm_fwd_f32_bf16":   rmsNormBF16Args(1, 1, 1, 1, 1, 1, 1, 1e-5),
		} {
			checkArgsMatchPTX(t, arch, ptx, name, args)
		}
	}
}
