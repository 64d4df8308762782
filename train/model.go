package train

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// The trainer sees a model through the three small interfaces below
// (docs/design/trainer.md): what one rank runs (Model, or its pipeline
// Stages) and how an architecture is built and laid out over the parallel
// groups (Architecture). Everything else (the data order, the optimizer,
// gradient reduction, checkpoints, logging) is the same for every model, so
// a new model family (an MoE GPT, BERT) implements these and plugs in
// without touching the trainer.

// Model is one rank's model as a training step runs it: the parameters it
// trains, in checkpoint order under their Megatron names (a rank's
// tensor-parallel slices of them), and the forward pass and loss of one
// micro-batch. *gpt.Model implements it.
type Model interface {
	Params() []*tensor.Tensor
	// Forward returns the logits of bt (this rank's vocabulary slice with
	// tensor parallelism); rng draws dropout masks while training.
	Forward(tp *tensor.Tape, bt gpt.Batch, rng *tensor.RNG, training bool) *tensor.Tensor
	// Loss is the mean loss of the logits over bt's labels and loss mask,
	// a one-element tensor.
	Loss(tp *tensor.Tape, logits *tensor.Tensor, bt gpt.Batch) *tensor.Tensor
}

// moeModel is a Model with Mixture-of-Experts layers (*gpt.Model with
// --num-experts): the trainer sets the scale of the routers' losses before
// an iteration's micro-batches, and after their gradients are reduced takes
// the logged losses and lets the routers update their expert biases.
type moeModel interface {
	SetAuxLossScale(s float64)
	SetPerTokenLoss(on bool)
	MoEMetrics(microBatches int) map[string]float64
	ExpertBiasCounts() [][]float64
	FinishMoEIteration()
}

// Stage is one of a pipeline rank's model chunks (a virtual stage):
// Model's parts from the activation the previous stage sent. *gpt.Stage
// implements it.
type Stage interface {
	Params() []*tensor.Tensor
	// Forward runs the stage on x (ignored on the first stage, which
	// embeds bt) and returns the activation for the next stage, or the
	// logits on the last.
	Forward(tp *tensor.Tape, x *tensor.Tensor, bt gpt.Batch, rng *tensor.RNG, training bool) *tensor.Tensor
	// Loss is Model.Loss on the last stage.
	Loss(tp *tensor.Tape, logits *tensor.Tensor, bt gpt.Batch) *tensor.Tensor
	IsFirst() bool
	IsLast() bool
	// ActivationShape is the shape of the activation between stages for
	// a micro-batch of b sequences of t tokens.
	ActivationShape(b, t int) []int
	// SharedEmbedding is the parameter whose gradient is summed with
	// another stage's over the embedding group (a tied word embedding),
	// or nil.
	SharedEmbedding() *tensor.Tensor
	// IsEmbeddingCopy reports whether p is a copy of another stage's
	// parameter: trained, but not written to checkpoints and counted once
	// in the gradient norm.
	IsEmbeddingCopy(p *tensor.Tensor) bool
}

// Architecture is what the trainer needs to know of a model family to lay
// it out over the parallel groups: how to build it, its tensor-parallel
// plan, and how it splits into pipeline stages. The trainer builds the
// whole model from the seed on every rank, slices it with Parallelize and
// splits it with SplitStages, so that every layout starts from the same
// values; checkpoints hold whole tensors, which TPStyle maps to and from a
// rank's slices.
type Architecture interface {
	// Build returns the whole model, its parameters drawn from rng.
	Build(rng *tensor.RNG) (Model, error)
	// TPStyle is the tensor-parallel style of parameter name: how its
	// whole tensor is sliced over the ranks of a tensor-parallel group.
	TPStyle(name string) tp.Style
	// Parallelize returns a tensor-parallel rank's slices of full (from
	// Build), communicating over region; rankRNG is the rank's own
	// dropout stream.
	Parallelize(full Model, region *tp.Region, rankRNG *tensor.RNG) (Model, error)
	// SplitStages returns pipeline rank rank's stages of m.
	SplitStages(m Model, split gpt.PipelineSplit, rank int) ([]Stage, error)
	// TiedEmbedding is m's parameter used twice (a word embedding tied to
	// the output layer), which data parallelism keeps in a bucket of its
	// own, or nil.
	TiedEmbedding(m Model) *tensor.Tensor
}

// GPT is the Architecture of package model/gpt (GPT and Llama): the
// trainer's default (Config.Architecture nil).
type GPT struct {
	Config    gpt.Config
	Recompute gpt.Recompute // activation recomputation of every model built
	Fusions   gpt.Fusions   // the fused ops every model built leaves off
	// FP8 is the FP8 state every model built shares (nil: no FP8).
	FP8 *gpt.FP8
}

// Build implements Architecture.
func (a GPT) Build(rng *tensor.RNG) (Model, error) {
	m, err := gpt.New(a.Config, rng)
	if err != nil {
		return nil, err
	}
	m.Recompute, m.Fusions, m.FP8 = a.Recompute, a.Fusions, a.FP8
	return m, nil
}

// TPStyle implements Architecture: GPT's tensor-parallel plan (gpt.TPPlan).
func (a GPT) TPStyle(name string) tp.Style { return a.Config.TPStyle(name) }

// Parallelize implements Architecture: gpt.Parallelize.
func (a GPT) Parallelize(full Model, region *tp.Region, rankRNG *tensor.RNG) (Model, error) {
	m, err := a.model(full)
	if err != nil {
		return nil, err
	}
	sliced, err := gpt.Parallelize(m, region, rankRNG)
	if err != nil {
		return nil, err
	}
	sliced.Recompute, sliced.FP8 = m.Recompute, m.FP8
	return sliced, nil
}

// SplitStages implements Architecture: gpt.SplitStages.
func (a GPT) SplitStages(m Model, split gpt.PipelineSplit, rank int) ([]Stage, error) {
	gm, err := a.model(m)
	if err != nil {
		return nil, err
	}
	stages, err := gpt.SplitStages(gm, split, rank)
	if err != nil {
		return nil, err
	}
	out := make([]Stage, len(stages))
	for i, s := range stages {
		out[i] = s
	}
	return out, nil
}

// TiedEmbedding implements Architecture: the word embedding when the
// output layer is tied to it.
func (a GPT) TiedEmbedding(m Model) *tensor.Tensor {
	if gm, ok := m.(*gpt.Model); ok && gm.OutputLayer == nil {
		return gm.WordEmb
	}
	return nil
}

func (GPT) model(m Model) (*gpt.Model, error) {
	gm, ok := m.(*gpt.Model)
	if !ok {
		return nil, fmt.Errorf("train: the GPT architecture got a %T, not a *gpt.Model", m)
	}
	return gm, nil
}

// architecture is the run's Architecture: Config.Architecture, or GPT.
func (c *Config) architecture() Architecture {
	if c.Architecture != nil {
		return c.Architecture
	}
	g := GPT{Config: c.Model, Recompute: c.Recompute, Fusions: c.Fusions}
	if c.FP8 != nil {
		g.FP8 = gpt.NewFP8(*c.FP8, c.BF16)
	}
	return g
}
