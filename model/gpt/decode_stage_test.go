package gpt

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestStageDecodeBatch: the golden GPT-2 and Llama models cut into two
// pipeline stages, each with its own KV cache of its layers, chain
// Stage.DecodeBatch over prefill chunks and decode tokens to the same
// logits, bit for bit, as Model.DecodeBatch of the whole model, also after
// each stage let go of the rest of its copy of the model.
func TestStageDecodeBatch(t *testing.T) {
	for _, preset := range []string{"gpt2", "llama"} {
		t.Run(preset, func(t *testing.T) {
			g := loadGolden(t, preset)
			m, bt := newGoldenModel(t, g)
			tokens := bt.Tokens.Int32s()[:8]
			whole := m.NewKVCache(8)
			const pp = 2
			var stages []*Stage
			var caches []*KVCache
			for r := range pp {
				own, _ := newGoldenModel(t, g) // each rank loads the whole model
				ss, err := SplitStages(own, PipelineSplit{PP: pp}, r)
				if err != nil {
					t.Fatal(err)
				}
				ss[0].DropOtherStages() // and keeps its stage's tensors alone
				if r == 0 && (own.Layers[1].QKV != nil || own.FinalNorm != nil) {
					t.Fatal("stage 0 kept the full model's other layers or head")
				}
				stages = append(stages, ss[0])
				caches = append(caches, ss[0].DecodeModel().NewKVCache(8))
			}
			if n := len(caches[1].k); n != len(stages[1].Layers) {
				t.Fatalf("a stage's cache holds %d layers, want its %d", n, len(stages[1].Layers))
			}
			p := 0
			for _, n := range []int{3, 1, 2, 1, 1} {
				pos := make([]int32, n)
				for i := range pos {
					pos[i] = int32(p + i)
				}
				rows := []int{n - 1}
				if n > 1 {
					rows = []int{0, n - 1}
				}
				want, err := m.DecodeBatch(nil, tokens[p:p+n], pos, &cacheAttender{kv: whole, p0: p}, rows, nil)
				if err != nil {
					t.Fatal(err)
				}
				var x *tensor.Tensor
				for r, s := range stages {
					if x, err = s.DecodeBatch(nil, x, tokens[p:p+n], pos, &cacheAttender{kv: caches[r], p0: p}, rows, nil); err != nil {
						t.Fatal(err)
					}
					if r < pp-1 && (x.Dim(0) != n || x.Dim(1) != m.Config.HiddenSize) {
						t.Fatalf("stage %d returned %v, want [%d %d]", r, x.Shape(), n, m.Config.HiddenSize)
					}
				}
				for i, w := range want.Float32s() {
					if got := x.Float32s()[i]; math.Float32bits(got) != math.Float32bits(w) {
						t.Fatalf("chunk of %d at %d: logit %d: stages %v, whole model %v", n, p, i, got, w)
					}
				}
				p += n
			}
			// A later stage needs its input, of the batch's shape.
			if _, err := stages[1].DecodeBatch(nil, nil, tokens[:1], []int32{0}, &cacheAttender{kv: caches[1]}, []int{0}, nil); err == nil || !strings.Contains(err.Error(), "no input") {
				t.Errorf("stage 1 without input: %v", err)
			}
			bad := tensor.Zeros(2, m.Config.HiddenSize)
			if _, err := stages[1].DecodeBatch(nil, bad, tokens[:1], []int32{0}, &cacheAttender{kv: caches[1]}, []int{0}, nil); err == nil || !strings.Contains(err.Error(), "want [1 ") {
				t.Errorf("stage 1 with a wrong input: %v", err)
			}
		})
	}
}
