package gpt

import (
	"errors"
	"fmt"

	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Part is the share of a model one decoding rank holds: a pipeline stage's
// layers, with the embedding on the first stage and the final norm and
// output layer on the last, each tensor sliced for its tensor-parallel
// rank. NewPart builds only these tensors, so a rank that fills them from a
// checkpoint (train.LoadModelPart) never holds the whole model.
type Part struct {
	// FirstLayer and EndLayer bound the layers held, [FirstLayer,
	// EndLayer); the others are empty Layers.
	FirstLayer, EndLayer int
	// Embedding holds the word (and position) embeddings: the first stage.
	Embedding bool
	// Head holds the final norm and output layer (the word embedding with
	// tied embeddings): the last stage.
	Head bool
	// TP, when set, slices each tensor for its rank (Parallelize's slices)
	// as soon as its layer is built, and gives the model Parallelize's
	// Sharding over TP (no dropout stream: a decoding model has no
	// dropout).
	TP *tp.Region
	// Experts, when set, keeps of each MoE layer the experts of its
	// expert-parallel rank, sliced for its expert-tensor rank
	// (SliceExperts' split), as soon as the layer is built; DecodeExperts
	// takes the model as it is then.
	Experts ExpertParallel
	// ExpertsOverTP, with TP and without Experts, splits every routed
	// expert over the tensor-parallel ranks as SplitExpertsOverTP does
	// (decoding's expert layout at its default), as soon as its layer is
	// built, so a rank never holds whole experts.
	ExpertsOverTP bool

	cfg Config // the model's, for its TP plan
	err error  // the first slicing error
}

// NewPart is New building only part's tensors (from the same seed, so
// each holds New's values, or Parallelize's slice of them): the model's
// other layers are empty, its embedding and head nil off the stages that
// hold them. Parallelize and SplitStages take it as they take New's model
// (Parallelize once: a part with TP is already sliced).
func NewPart(cfg Config, rng *tensor.RNG, part Part) (*Model, error) {
	return newModel(cfg, rng, &part)
}

// Check reports a part that model c cannot be split into (NewPart's
// refusals), naming the flags.
func (p Part) Check(c *Config) error { return p.check(c) }

func (p *Part) check(c *Config) error {
	if p == nil {
		return nil
	}
	if p.FirstLayer < 0 || p.FirstLayer >= p.EndLayer || p.EndLayer > c.NumLayers {
		return fmt.Errorf("gpt: part of layers [%d, %d): want a range within the model's %d layers", p.FirstLayer, p.EndLayer, c.NumLayers)
	}
	p.cfg = *c
	if p.Experts != nil {
		if !c.MoE.Enabled() {
			return errors.New("gpt: a part with experts of a model without (--num-experts)")
		}
		if err := c.CheckExpertSplit(p.Experts.Size(), p.Experts.TensorSize()); err != nil {
			return err
		}
	}
	if p.ExpertsOverTP {
		switch {
		case p.TP == nil:
			return errors.New("gpt: a part with its experts split over the tensor-parallel ranks and no tensor parallelism (TP)")
		case p.Experts != nil:
			return errors.New("gpt: a part with its experts split both over the tensor-parallel ranks and by an expert layout")
		case !c.MoE.Enabled():
			return errors.New("gpt: a part with its experts split over the tensor-parallel ranks, of a model without (--num-experts)")
		case p.TP.SequenceParallel:
			return errors.New("gpt: a part with its experts split over the tensor-parallel ranks is sequence-parallel: each rank holds a shard of the tokens, which expert tensor parallelism over the tensor-parallel ranks alone cannot route")
		}
		if f, Q := c.MoE.FFNHiddenSize, p.TP.Size(); f%Q != 0 {
			return fmt.Errorf("gpt: --moe-ffn-hidden-size=%d is not divisible by --tensor-model-parallel-size=%d (each expert is split over the tensor-parallel ranks)", f, Q)
		}
	}
	if p.TP != nil {
		return c.CheckTP(p.TP.Size(), p.TP.SequenceParallel, 0)
	}
	return nil
}

// SliceOf is how the part holds parameter name of its model c: the split's
// style, this rank's index in it and its size (tp.Replicated, 0, 1: whole).
// Routed experts split over the expert-tensor-parallel ranks with Experts,
// over the tensor-parallel ones with ExpertsOverTP (and are whole without
// either: tensor parallelism leaves them whole), every other tensor over
// the tensor-parallel ones.
func (p Part) SliceOf(c *Config, name string) (style tp.Style, rank, size int) {
	switch {
	case IsRoutedExpert(name) && p.ExpertsOverTP && p.TP != nil:
		return c.ExpertStyle(name), p.TP.Rank(), p.TP.Size()
	case IsRoutedExpert(name):
		if p.Experts == nil || p.Experts.TensorSize() == 1 {
			return tp.Replicated, 0, 1
		}
		return c.ExpertStyle(name), p.Experts.TensorRank(), p.Experts.TensorSize()
	case p.TP == nil:
		return tp.Replicated, 0, 1
	}
	return c.TPStyle(name), p.TP.Rank(), p.TP.Size()
}

func (p *Part) holdsLayer(i int) bool { return p == nil || (i >= p.FirstLayer && i < p.EndLayer) }
func (p *Part) embedding() bool       { return p == nil || p.Embedding }
func (p *Part) head() bool            { return p == nil || p.Head }

// wordEmbedding reports whether the part holds the word embedding: on the
// first stage, and on the last with tied embeddings (SplitStages copies it
// to the output layer there).
func (p *Part) wordEmbedding(c *Config) bool {
	return p.embedding() || (p.head() && !c.UntieEmbeddingsAndOutputWeights)
}

// shard is x, or its tensor-parallel slice.
func (p *Part) shard(x *tensor.Tensor) *tensor.Tensor {
	if p == nil || p.TP == nil || x == nil || p.err != nil {
		return x
	}
	s, err := tp.Shard(x, p.cfg.TPStyle(x.Name), p.TP.Rank(), p.TP.Size())
	if err != nil {
		p.err = err
		return x
	}
	return s
}
