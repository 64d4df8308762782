// Package hftest is the Hugging Face checkpoints in ckpt/hf/testdata for
// the tests that import, convert, score or decode them: which there are,
// how close gotron's logits must come to the PyTorch reference's, and that
// reference (golden.safetensors, written with each checkpoint by
// tools/golden/hf.py, hf_moe.py, hf_deepseek.py and hf_qwen3next.py).
package hftest

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// Fixture is one checkpoint.
type Fixture struct {
	Name string  // its folder under ckpt/hf/testdata
	Tol  float64 // relative logits tolerance: 1e-4 for float32 weights, 2e-2 for 16-bit ones
}

// Fixtures lists every checkpoint in ckpt/hf/testdata.
func Fixtures() []Fixture {
	return []Fixture{
		// tools/golden/hf.py: GPT-2 and Llama, tied and untied, in every dtype, one file and sharded
		{"gpt2_tied_f32", 1e-4},
		{"gpt2_untied_bf16", 2e-2},
		{"llama_gqa_untied_f32", 1e-4},
		{"llama_gqa_tied_bf16", 2e-2},
		{"llama_mha_untied_f16_sharded", 2e-2},
		// tools/golden/hf_moe.py: Mixtral, Qwen2-MoE and Qwen3-MoE
		{"mixtral_gqa_untied_f32", 1e-4},
		{"qwen2_moe_untied_f32", 1e-4},
		{"qwen2_moe_step2_tied_f32", 1e-4},
		{"qwen3_moe_untied_f32", 1e-4},
		{"qwen3_moe_step2_tied_f32", 1e-4},
		// tools/golden/hf_deepseek.py: DeepSeek-V3 and -V2 (multi-latent attention, YaRN, DeepSeekMoE)
		{"deepseek_v3_untied_f32", 1e-4},
		{"deepseek_v2_tied_f32", 1e-4},
		// tools/golden/hf_qwen3next.py: gated delta nets, gated attention, MoE with a gated shared expert
		{"qwen3_next_untied_f32", 1e-4},
	}
}

// Golden reads the reference of the checkpoint in dir: the tokens of its
// prompt and PyTorch's float64 logits for them (tokens × vocabulary, as
// float32).
func Golden(t testing.TB, dir string) (tokens []int32, logits []float32) {
	t.Helper()
	f, err := safetensors.ReadFile(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err = Int32s(f, "tokens")
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	lt, err := f.Tensor("logits")
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	logits = make([]float32, lt.NumElements())
	if err := lt.DecodeFloat32(logits); err != nil {
		t.Fatalf("%s: logits: %v", dir, err)
	}
	if len(tokens) == 0 || len(logits)%len(tokens) != 0 {
		t.Fatalf("%s: %d logits for %d tokens", dir, len(logits), len(tokens))
	}
	return tokens, logits
}

// Tensors reads every tensor of the HF checkpoint in dir (one file or
// shards), by name; the files stay open until the test ends.
func Tensors(t testing.TB, dir string) map[string]safetensors.Tensor {
	t.Helper()
	s, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	out := map[string]safetensors.Tensor{}
	for _, n := range s.Names() {
		if out[n], err = s.Tensor(n); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
	}
	return out
}

// Int32s decodes the I32 tensor name of f (the prompt's tokens, or the
// greedy continuation some references carry).
func Int32s(f *safetensors.File, name string) ([]int32, error) {
	tt, err := f.Tensor(name)
	if err != nil {
		return nil, err
	}
	if tt.DType != safetensors.I32 {
		return nil, fmt.Errorf("%s: dtype %s, want I32", name, tt.DType)
	}
	v := make([]int32, tt.NumElements())
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(tt.Data[4*i:]))
	}
	return v, nil
}
