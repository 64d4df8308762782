package hf

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ep"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// tpFixtures are the fixtures of every architecture the importer reads:
// GPT-2 (Conv1D transposes, per-head fused QKV, biases, tied and untied),
// Llama (GQA, MHA sharded F16, tied BF16), Mixtral, Qwen2/3-MoE (shared
// experts and their gate, q/k norms, QKV biases), DeepSeek-V2/V3 (MLA) and
// Qwen3-Next (gated delta nets, gated attention).
var tpFixtures = []string{"gpt2_tied_f32", "gpt2_untied_bf16", "llama_gqa_untied_f32", "llama_gqa_tied_bf16",
	"llama_mha_untied_f16_sharded", "mixtral_gqa_untied_f32", "qwen2_moe_untied_f32", "qwen2_moe_step2_tied_f32",
	"qwen3_moe_untied_f32", "qwen3_moe_step2_tied_f32", "deepseek_v2_tied_f32", "deepseek_v3_untied_f32", "qwen3_next_untied_f32"}

// sameTensors fails unless got holds exactly want's tensors: names, shapes
// and bits.
func sameTensors(t *testing.T, what string, got, want *gpt.Model) {
	t.Helper()
	g, w := got.Params(), want.Params()
	if len(g) != len(w) {
		t.Fatalf("%s: %d tensors, want %d", what, len(g), len(w))
	}
	for i, p := range g {
		q := w[i]
		if p.Name != q.Name || !slices.Equal(p.Shape(), q.Shape()) {
			t.Fatalf("%s: tensor %d is %s%v, want %s%v", what, i, p.Name, p.Shape(), q.Name, q.Shape())
		}
		for j, v := range p.Float32s() {
			if math.Float32bits(v) != math.Float32bits(q.Float32s()[j]) {
				t.Fatalf("%s: %s[%d] = %v, want %v", what, p.Name, j, v, q.Float32s()[j])
			}
		}
	}
	gb, wb := got.Buffers(), want.Buffers()
	if len(gb) != len(wb) {
		t.Fatalf("%s: %d buffers, want %d", what, len(gb), len(wb))
	}
	for i, p := range gb {
		if p.Name != wb[i].Name || !slices.Equal(p.Float32s(), wb[i].Float32s()) {
			t.Fatalf("%s: buffer %s differs from %s", what, p.Name, wb[i].Name)
		}
	}
}

// TestImportTensorParallelPart: a tensor-parallel rank's import
// (ImportOptions.Part with TP) holds, bit for bit, gpt.Parallelize's slice
// of the whole import (then SplitExpertsOverTP's with Part.ExpertsOverTP),
// for every architecture at TP=2 and 4 (where the heads divide), and over
// PP=2 × TP=2; and it reads from the files exactly the bytes of the values
// it holds (checkBytesRead).
func TestImportTensorParallelPart(t *testing.T) {
	worlds := map[int][]comm.ProcessGroup{}
	for _, n := range []int{2, 4} {
		w, err := inproc.NewWorld(n)
		if err != nil {
			t.Fatal(err)
		}
		worlds[n] = w
	}
	for _, fixture := range tpFixtures {
		dir := "testdata/" + fixture
		var wholeRead int64
		full, info, err := Import(dir, ImportOptions{bytesRead: &wholeRead})
		if err != nil {
			t.Fatal(err)
		}
		checkBytesRead(t, fixture, full, info, 0, 1, wholeRead)
		c := full.Config
		var experts int64 // bytes of the routed experts' tensors
		for _, p := range full.Params() {
			if gpt.IsRoutedExpert(p.Name) {
				experts += int64(p.Numel())
			}
		}
		experts = experts * wholeRead / int64(full.NumParams()) // in the files' dtype (one per fixture)
		for _, size := range []int{2, 4} {
			if err := c.CheckTP(size, false, 0); err != nil {
				t.Logf("%s: no TP=%d: %v", fixture, size, err)
				continue
			}
			for rank := range size {
				region := &tp.Region{Group: worlds[size][rank]}
				part := gpt.Part{FirstLayer: 0, EndLayer: c.NumLayers, Embedding: true, Head: true, TP: region}
				var read int64
				m, _, err := Import(dir, ImportOptions{Part: func(gpt.Config) (gpt.Part, error) { return part, nil }, bytesRead: &read})
				if err != nil {
					t.Fatalf("%s TP=%d rank %d: %v", fixture, size, rank, err)
				}
				want, err := gpt.Parallelize(full, region, nil)
				if err != nil {
					t.Fatal(err)
				}
				what := fmt.Sprintf("%s TP=%d rank %d", fixture, size, rank)
				sameTensors(t, what, m, want)
				checkBytesRead(t, what, m, info, rank, size, read)
				share := float64(read-experts) / float64(wholeRead-experts)
				t.Logf("%s: read %d of the whole import's %d bytes (%.3f of those outside the routed experts)", what, read, wholeRead, share)
				if !c.MoE.Enabled() || c.MoE.FFNHiddenSize%size != 0 {
					continue
				}
				// decoding's default expert layout: each expert split over
				// the tensor-parallel ranks as it is read
				part.ExpertsOverTP = true
				if m, _, err = Import(dir, ImportOptions{Part: func(gpt.Config) (gpt.Part, error) { return part, nil }, bytesRead: &read}); err != nil {
					t.Fatalf("%s with its experts split: %v", what, err)
				}
				if err := want.SplitExpertsOverTP(); err != nil {
					t.Fatal(err)
				}
				what += " with the experts split over TP"
				sameTensors(t, what, m, want)
				checkBytesRead(t, what, m, info, rank, size, read)
				t.Logf("%s: read %d of the whole import's %d bytes (%.3f)", what, read, wholeRead, float64(read)/float64(wholeRead))
			}
		}
	}
	// a pipeline stage's slice: PP=2 × TP=2 (the tied model's last stage
	// holds its word embedding's slice too)
	for _, fixture := range []string{"llama_gqa_untied_f32", "gpt2_tied_f32"} {
		ppTimesTP(t, "testdata/"+fixture, worlds[2])
	}
}

// ppTimesTP checks each rank of PP=2 × TP=2 imports, bit for bit, what
// gpt.Parallelize then gpt.SplitStages keep of the whole import.
func ppTimesTP(t *testing.T, dir string, world []comm.ProcessGroup) {
	t.Helper()
	full, _, err := LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	for stage := range 2 {
		for rank := range 2 {
			region := &tp.Region{Group: world[rank]}
			L := full.Config.NumLayers
			part := gpt.Part{FirstLayer: stage * L / 2, EndLayer: (stage + 1) * L / 2, Embedding: stage == 0, Head: stage == 1, TP: region}
			m, _, err := Import(dir, ImportOptions{Part: func(gpt.Config) (gpt.Part, error) { return part, nil }})
			if err != nil {
				t.Fatal(err)
			}
			sliced, err := gpt.Parallelize(full, region, nil)
			if err != nil {
				t.Fatal(err)
			}
			stages, err := gpt.SplitStages(sliced, gpt.PipelineSplit{PP: 2}, stage)
			if err != nil {
				t.Fatal(err)
			}
			stages[0].DropOtherStages()
			want := stages[0].DecodeModel()
			byName := map[string][]float32{}
			for _, p := range want.Params() {
				byName[p.Name] = p.Float32s()
			}
			what := fmt.Sprintf("%s PP=2 stage %d TP=2 rank %d", dir, stage, rank)
			n := 0
			for _, p := range m.Params() {
				w, ok := byName[p.Name]
				if !ok || len(w) != p.Numel() {
					t.Fatalf("%s: %s%v: the stage's slice has %d values", what, p.Name, p.Shape(), len(w))
				}
				for j, v := range p.Float32s() {
					if math.Float32bits(v) != math.Float32bits(w[j]) {
						t.Fatalf("%s: %s[%d] = %v, want %v", what, p.Name, j, v, w[j])
					}
				}
				n++
			}
			if n != len(byName) {
				t.Errorf("%s: %d tensors, the stage's slice %d", what, n, len(byName))
			}
		}
	}
}

// checkBytesRead fails unless read is the bytes of m's values (and
// buffers) in the files' dtype, less the vocabulary padding's (no file
// holds those): tensor-parallel rank rank of size read exactly what it
// holds.
func checkBytesRead(t *testing.T, what string, m *gpt.Model, info Info, rank, size int, read int64) {
	t.Helper()
	es := map[string]int64{"F32": 4, "BF16": 2, "F16": 2}[info.DType]
	if es == 0 {
		t.Fatalf("%s: dtype %q", what, info.DType)
	}
	var want int64
	for _, p := range append(m.Params(), m.Buffers()...) { // the routers' expert biases
		n := int64(p.Numel())
		if p.Name == "embedding.word_embeddings.weight" || p.Name == "output_layer.weight" {
			vp, h := m.Config.VocabSize, p.Dim(1)
			first, end := rank*vp/size, (rank+1)*vp/size
			n -= int64(max(0, end-max(first, info.VocabSize)) * h) // padding rows held
		}
		want += n * es
	}
	if read != want {
		t.Errorf("%s: read %d bytes, want %d: the %s values it holds, less the vocabulary padding", what, read, want, info.DType)
	}
}

// TestImportExpertParallelPart: an expert-parallel rank's import
// (ImportOptions.Part with Experts, and TP) holds, bit for bit, what
// SliceExperts keeps of gpt.Parallelize's slice of the whole import, and
// reads of the routed experts only its own (1/(EP·ETP) of their bytes).
func TestImportExpertParallelPart(t *testing.T) {
	epWorld, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	etpWorld, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	tpWorld, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, fixture := range tpFixtures {
		dir := "testdata/" + fixture
		var wholeRead int64
		full, info, err := Import(dir, ImportOptions{bytesRead: &wholeRead})
		if err != nil {
			t.Fatal(err)
		}
		c := full.Config
		if !c.MoE.Enabled() || c.MoE.NumExperts%2 != 0 {
			continue
		}
		for _, k := range []struct{ etp, epRank, etpRank, tpRank int }{{1, 1, 0, 0}, {2, 0, 1, 1}, {2, 1, 0, 1}} {
			g := &ep.Group{PG: epWorld[k.epRank]}
			if k.etp > 1 {
				g.TP = etpWorld[k.etpRank]
			}
			region := &tp.Region{Group: tpWorld[k.tpRank]}
			part := gpt.Part{FirstLayer: 0, EndLayer: c.NumLayers, Embedding: true, Head: true, TP: region, Experts: g}
			var read int64
			m, _, err := Import(dir, ImportOptions{Part: func(gpt.Config) (gpt.Part, error) { return part, nil }, bytesRead: &read})
			what := fmt.Sprintf("%s TP=2 rank %d, EP=2 rank %d, ETP=%d rank %d", fixture, k.tpRank, k.epRank, k.etp, k.etpRank)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			want, err := gpt.Parallelize(full, region, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := want.SliceExperts(g); err != nil {
				t.Fatal(err)
			}
			sameTensors(t, what, m, want)
			var wholeExperts, heldExperts int64
			for _, p := range full.Params() {
				if gpt.IsRoutedExpert(p.Name) {
					wholeExperts += int64(p.Numel())
				}
			}
			for _, p := range m.Params() {
				if gpt.IsRoutedExpert(p.Name) {
					heldExperts += int64(p.Numel())
				}
			}
			if heldExperts*int64(2*k.etp) != wholeExperts {
				t.Errorf("%s: holds %d expert values of %d, want 1/%d", what, heldExperts, wholeExperts, 2*k.etp)
			}
			checkBytesRead(t, what, m, info, k.tpRank, 2, read)
			t.Logf("%s: read %d of the whole import's %d bytes", what, read, wholeRead)
		}
	}
}

// TestImportTensorParallelPartRefusals: a TP size the model does not
// split over is refused naming the flag and the sizes.
func TestImportTensorParallelPartRefusals(t *testing.T) {
	w, err := inproc.NewWorld(4)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ fixture, want string }{
		{"llama_gqa_untied_f32", "--num-query-groups=2 is not divisible by --tensor-model-parallel-size=4"},
		{"qwen3_next_untied_f32", "--linear-num-key-heads=2 is not divisible by --tensor-model-parallel-size=4"},
	} {
		dir := "testdata/" + c.fixture
		_, _, err := Import(dir, ImportOptions{Part: func(cfg gpt.Config) (gpt.Part, error) {
			return gpt.Part{FirstLayer: 0, EndLayer: cfg.NumLayers, Embedding: true, Head: true, TP: &tp.Region{Group: w[1]}}, nil
		}})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s at TP=4: %v, want an error naming %s and %q", c.fixture, err, dir, c.want)
		}
	}
}

// TestImportTensorParallelPartReadsHalf: on a Llama-style model whose
// replicated tensors (the norms) are small, as in real models, each TP=2
// rank reads half of the bytes the whole import reads (within 1%), each
// TP=4 rank a quarter.
func TestImportTensorParallelPartReadsHalf(t *testing.T) {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 128, NumAttentionHeads: 8, NumQueryGroups: 4, KVChannels: 16, FFNHiddenSize: 384,
		Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, PositionEmbeddingType: gpt.RoPE, RotaryBase: 10000, RotaryPercent: 1,
		VocabSize: 512, MaxPositionEmbeddings: 64, InitMethodStd: 0.02, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true}
	model, err := gpt.New(cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := Export(context.Background(), dir, model, Info{}, ExportOptions{DType: "BF16"}); err != nil {
		t.Fatal(err)
	}
	var whole int64
	full, _, err := Import(dir, ImportOptions{bytesRead: &whole})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{2, 4} {
		world, err := inproc.NewWorld(size)
		if err != nil {
			t.Fatal(err)
		}
		for rank := range size {
			region := &tp.Region{Group: world[rank]}
			var read int64
			m, _, err := Import(dir, ImportOptions{bytesRead: &read, Part: func(c gpt.Config) (gpt.Part, error) {
				return gpt.Part{FirstLayer: 0, EndLayer: c.NumLayers, Embedding: true, Head: true, TP: region}, nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			want, err := gpt.Parallelize(full, region, nil)
			if err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("TP=%d rank %d", size, rank)
			sameTensors(t, what, m, want)
			share := float64(read) / float64(whole)
			t.Logf("%s: read %d of the whole import's %d bytes (%.4f)", what, read, whole, share)
			if math.Abs(share*float64(size)-1) > 0.01 {
				t.Errorf("%s: read %.4f of the whole import's bytes, want 1/%d", what, share, size)
			}
		}
	}
}
