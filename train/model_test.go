package train

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// foreignModel is a model the trainer knows only through Model: a GPT
// under another type, as a new architecture's model would be.
type foreignModel struct{ m *gpt.Model }

func (f foreignModel) Params() []*tensor.Tensor { return f.m.Params() }
func (f foreignModel) Forward(tp *tensor.Tape, bt gpt.Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	return f.m.Forward(tp, bt, rng, training)
}
func (f foreignModel) Loss(tp *tensor.Tape, logits *tensor.Tensor, bt gpt.Batch) *tensor.Tensor {
	return f.m.Loss(tp, logits, bt)
}

// foreignArch builds foreignModels: an Architecture other than GPT.
type foreignArch struct{ GPT }

func (a foreignArch) Build(rng *tensor.RNG) (Model, error) {
	m, err := a.GPT.Build(rng)
	if err != nil {
		return nil, err
	}
	return foreignModel{m.(*gpt.Model)}, nil
}

func (a foreignArch) TiedEmbedding(m Model) *tensor.Tensor {
	return a.GPT.TiedEmbedding(m.(foreignModel).m)
}

// TestArchitecturePlugsIn: a model the trainer sees only through the
// Model and Architecture interfaces trains, evaluates, saves and resumes
// exactly as the GPT it wraps.
func TestArchitecturePlugsIn(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 4
	want := runTrainer(t, cfg)
	foreign := cfg
	foreign.Architecture = foreignArch{GPT{Config: cfg.Model}}
	foreign.Save = t.TempDir()
	got := runTrainer(t, foreign)
	for i := range want.Losses {
		if math.Float64bits(got.Losses[i]) != math.Float64bits(want.Losses[i]) {
			t.Fatalf("iteration %d: loss %v through the interfaces, %v as GPT", i+1, got.Losses[i], want.Losses[i])
		}
	}
	if math.Float64bits(got.ValidLoss) != math.Float64bits(want.ValidLoss) {
		t.Fatalf("validation loss %v through the interfaces, %v as GPT", got.ValidLoss, want.ValidLoss)
	}
	m, _, err := LoadModel(foreign.Save)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumParams() == 0 {
		t.Fatal("the saved checkpoint holds no parameters")
	}
}

// TestSquaredReLURefusedOnCUDA: the squared ReLU's CUDA kernels have not
// run on a GPU; a run asking for both is refused before any device work,
// naming the flags and the GOTRON_CUDA_UNVERIFIED feature that allows it.
func TestSquaredReLURefusedOnCUDA(t *testing.T) {
	t.Setenv("GOTRON_CUDA_UNVERIFIED", "")
	cfg := tinyConfig(t)
	cfg.Model.Activation, cfg.Device = gpt.SquaredReLU, tensor.CUDA
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	if _, err := New(cfg, src, nil); err == nil || !strings.Contains(err.Error(), "--squared-relu with --device cuda") ||
		!strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED=sqrelu") {
		t.Fatalf("squared ReLU on CUDA: %v", err)
	}
	cfg.Device = tensor.Sim
	if res := runTrainer(t, cfg); len(res.Losses) != int(cfg.TrainIters) {
		t.Fatalf("squared ReLU on the simulated device: %d losses", len(res.Losses))
	}
}
