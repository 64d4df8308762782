package megatron

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestImportMoE: Megatron legacy MoE checkpoints (tools/golden/
// megatron_moe_ckpt.py: TP=2 with TEGroupedMLP experts, a gated shared
// expert and a dense first layer; EP=2 × TP=2, each expert-parallel rank's
// file holding its local experts numbered from 0; PP=2 with SequentialMLP
// experts) import
// to a model whose every parameter equals the script's whole tensor, and
// whose MoE settings are the args'.
func TestImportMoE(t *testing.T) {
	t.Run("missing expert-parallel rank", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "moe_ep2_tp2"))); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(dir, "iter_0000009", "mp_rank_01_001"))
		_, _, err := Load(dir, Options{})
		if err == nil || !strings.Contains(err.Error(), "mp_rank_01_001/model_optim_rng.pt is missing (args: tensor_model_parallel_size=2, pipeline_model_parallel_size=1, expert_model_parallel_size=2, so 4 rank files are expected)") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("router dtype fp64", func(t *testing.T) {
		c, err := Open(filepath.Join("testdata", "moe_pp2_sequential"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.args.d.Set("moe_router_dtype", "fp64"); err != nil {
			t.Fatal(err)
		}
		m, _, err := c.Model(Options{})
		if err != nil || !m.Config.MoE.RouterFP64 {
			t.Fatalf("err %v, RouterFP64 %v", err, err == nil && m.Config.MoE.RouterFP64)
		}
		c.args.d.Set("moe_router_dtype", "bf16")
		if _, _, err := c.Model(Options{}); err == nil || !strings.Contains(err.Error(), "args.moe_router_dtype=bf16") {
			t.Fatalf("err = %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		want gpt.MoEConfig
	}{
		{"moe_tp2_grouped", gpt.MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 8, LayerFreq: "[0,1]", GroupedGEMM: true,
			SharedExpertFFN: 12, SharedExpertGate: true, AuxLossCoeff: 0.01}},
		{"moe_ep2_tp2", gpt.MoEConfig{NumExperts: 6, TopK: 2, FFNHiddenSize: 8, LayerFreq: "1", GroupedGEMM: true, AuxLossCoeff: 0.01}},
		{"moe_pp2_sequential", gpt.MoEConfig{NumExperts: 3, TopK: 1, FFNHiddenSize: 8, LayerFreq: "1", AuxLossCoeff: 0.01}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join("testdata", tc.name)
			m, _, err := Load(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := m.Config.MoE
			got.ExpertBiasUpdateRate = 0 // a default Validate fills
			if got != tc.want {
				t.Fatalf("MoE config %+v, want %+v", got, tc.want)
			}
			f, err := safetensors.ReadFile(filepath.Join(dir, "expected.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			want := f.Tensors()
			params := m.Params()
			n := 0
			for _, p := range params {
				if p == nil {
					continue
				}
				n++
				w, ok := want[p.Name]
				if !ok {
					t.Fatalf("model parameter %s is not in expected.safetensors", p.Name)
				}
				v := make([]float32, w.NumElements())
				if err := w.DecodeFloat32(v); err != nil {
					t.Fatal(err)
				}
				if len(v) != p.Numel() {
					t.Fatalf("%s: %d values, want %d", p.Name, p.Numel(), len(v))
				}
				for i, x := range p.Float32s() {
					if x != v[i] {
						t.Fatalf("%s[%d] = %g, want %g", p.Name, i, x, v[i])
					}
				}
			}
			if n != len(want) {
				t.Fatalf("model has %d parameters, expected.safetensors %d", n, len(want))
			}
			// and it runs
			logits := m.Forward(nil, gpt.Batch{Tokens: tensor.FromInt32([]int32{1, 2, 3, 4}, 1, 4)}, nil, false)
			if logits.Dim(2) != m.Config.VocabSize {
				t.Fatalf("logits %v", logits.Shape())
			}
		})
	}
}
