package gpt

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// Decoding a model with gated delta net layers: beside the key/value cache
// of its attention layers, each sequence keeps, per gated delta net layer,
// the convolution's last K-1 inputs and the delta rule's dk×dv state per
// value head (GDNState). Prefill runs the recurrence over the prompt from a
// zero state and leaves the last step's; each decode step advances it by a
// token. The arithmetic is the training forward's, step for step
// (tensor.CausalConvSiLURuns, tensor.GatedDeltaRuleRuns), so a sequence
// decoded in pieces gets the bits of the whole sequence's forward in its
// recurrent parts.

// GDNStates keeps the recurrent state of a decode step's sequences: an
// Attender given to DecodeBatch for a model with gated delta net layers
// implements it too (infer's paged cache, KVCache).
type GDNStates interface {
	// GDNRuns returns, for gated delta net layer layer (its global index),
	// the step's sequences in token order: each one's number of
	// consecutive tokens and its state in that layer, which the layer
	// advances in place. DecodeBatch zeroes the state of a sequence whose
	// run starts at position 0 (a new sequence, or one recomputed after
	// preemption).
	GDNRuns(layer int) []GDNRun
}

// GDNRun is one sequence's share of a decode step and its state in one
// gated delta net layer.
type GDNRun struct {
	Tokens int
	// Conv is the convolution's last K-1 inputs, oldest first ((K-1) ×
	// channels, Model.GDNStateSize's conv); Rule the delta rule's state
	// (value heads × dk × dv, its rule). Host memory, float32.
	Conv, Rule []float32
	// ConvDev and RuleDev hold them instead on the model's device (a
	// model off the CPU: GDNState's Dev views), advanced there in place.
	ConvDev, RuleDev *tensor.Tensor
}

// GDNState is one sequence's recurrent state in every gated delta net
// layer of a model (nil entries for attention layers), one allocation: in
// host memory (Conv, Rule) for a model on the CPU, on the model's device
// (ConvDev, RuleDev: views of one tensor) otherwise, so that decoding on a
// GPU copies no state a step.
type GDNState struct {
	Conv, Rule       [][]float32
	ConvDev, RuleDev []*tensor.Tensor
}

// Run is the state's run of tokens in layer (a GDNRun for GDNStates).
func (s *GDNState) Run(layer, tokens int) GDNRun {
	r := GDNRun{Tokens: tokens}
	if s.ConvDev != nil {
		r.ConvDev, r.RuleDev = s.ConvDev[layer], s.RuleDev[layer]
	} else {
		r.Conv, r.Rule = s.Conv[layer], s.Rule[layer]
	}
	return r
}

// GDNStateSize is the floats of one sequence's state in one gated delta
// net layer on this rank (a tensor-parallel rank keeps its heads'): the
// convolution's (K-1)·channels and the delta rule's heads·dk·dv. Both are 0
// for a model without such layers.
func (m *Model) GDNStateSize() (conv, rule int) {
	c := &m.Config.GDN
	for _, l := range m.Layers {
		if g := l.GDN; g != nil {
			return (c.ConvKernel - 1) * (2*g.InQ.Dim(0) + g.InV.Dim(0)), g.InBeta.Dim(0) * c.KeyHeadDim * c.ValueHeadDim
		}
	}
	return 0, 0
}

// GDNStateBytes is the memory of one sequence's GDNState: float32 state of
// every gated delta net layer this rank runs.
func (m *Model) GDNStateBytes() int64 {
	conv, rule := m.GDNStateSize()
	return 4 * int64(conv+rule) * int64(m.numGDNLayersHere())
}

func (m *Model) numGDNLayersHere() int {
	n := 0
	for _, l := range m.Layers {
		if l.GDN != nil {
			n++
		}
	}
	return n
}

// NewGDNState allocates a zero state for one sequence (nil for a model
// without gated delta net layers), on the model's device.
func (m *Model) NewGDNState() *GDNState {
	conv, rule := m.GDNStateSize()
	n := m.numGDNLayersHere()
	if n == 0 {
		return nil
	}
	if dev := m.Device(); dev != tensor.CPU {
		flat := tensor.ZerosOn(dev, n*(conv+rule))
		var noGrad *tensor.Tape
		s := &GDNState{ConvDev: make([]*tensor.Tensor, len(m.Layers)), RuleDev: make([]*tensor.Tensor, len(m.Layers))}
		off := 0
		for i, l := range m.Layers {
			if l.GDN == nil {
				continue
			}
			s.ConvDev[i] = noGrad.Narrow(flat, 0, off, conv)
			s.RuleDev[i] = noGrad.Narrow(flat, 0, off+conv, rule)
			off += conv + rule
		}
		return s
	}
	all := make([]float32, n*(conv+rule))
	s := &GDNState{Conv: make([][]float32, len(m.Layers)), Rule: make([][]float32, len(m.Layers))}
	for i, l := range m.Layers {
		if l.GDN == nil {
			continue
		}
		s.Conv[i], all = all[:conv:conv], all[conv:]
		s.Rule[i], all = all[:rule:rule], all[rule:]
	}
	return s
}

// checkGDNRuns checks what GDNRuns gives for every gated delta net layer
// against the step's positions and returns which runs start their
// sequence: a bad Attender is an error, not a panic in a layer.
func (m *Model) checkGDNRuns(gs GDNStates, positions []int32, firstLayer int) ([]bool, error) {
	conv, rule := m.GDNStateSize()
	var start []bool
	for i, l := range m.Layers {
		if l.GDN == nil {
			continue
		}
		runs := gs.GDNRuns(firstLayer + i) // the layer's global index, as the pass asks
		if start == nil {
			start = make([]bool, len(runs))
		} else if len(runs) != len(start) {
			return nil, fmt.Errorf("gpt: gated delta net layer %d: %d sequences, another layer %d", i, len(runs), len(start))
		}
		r0 := 0
		for j, r := range runs {
			if r.Tokens <= 0 || r.Tokens > len(positions)-r0 {
				return nil, fmt.Errorf("gpt: gated delta net layer %d: sequence %d of %d tokens from token %d of %d", i, j, r.Tokens, r0, len(positions))
			}
			nc, nr := len(r.Conv), len(r.Rule)
			if r.ConvDev != nil || r.RuleDev != nil {
				if r.ConvDev == nil || r.RuleDev == nil || r.Conv != nil || r.Rule != nil {
					return nil, fmt.Errorf("gpt: gated delta net layer %d: sequence %d's state is partly on the device", i, j)
				}
				nc, nr = r.ConvDev.Numel(), r.RuleDev.Numel()
			}
			if nc != conv || nr != rule {
				return nil, fmt.Errorf("gpt: gated delta net layer %d: sequence %d's state has %d and %d floats, want %d and %d", i, j, nc, nr, conv, rule)
			}
			for t := 1; t < r.Tokens; t++ {
				if positions[r0+t] != positions[r0]+int32(t) {
					return nil, fmt.Errorf("gpt: gated delta net layer %d: sequence %d's tokens are not at consecutive positions (%d after %d)", i, j, positions[r0+t], positions[r0+t-1])
				}
			}
			start[j] = positions[r0] == 0
			r0 += r.Tokens
		}
		if r0 != len(positions) {
			return nil, fmt.Errorf("gpt: gated delta net layer %d: sequences of %d tokens in a step of %d", i, r0, len(positions))
		}
	}
	return start, nil
}

// gdnRuns is layer index's runs for the convolution and the delta rule,
// the states of sequences starting at position 0 zeroed.
func (p *pass) gdnRuns(index int) (conv, rule []tensor.RecurrentRun) {
	runs := p.gdn.GDNRuns(index)
	conv, rule = make([]tensor.RecurrentRun, len(runs)), make([]tensor.RecurrentRun, len(runs))
	for i, r := range runs {
		if p.gdnStart[i] {
			clear(r.Conv)
			clear(r.Rule)
			for _, t := range []*tensor.Tensor{r.ConvDev, r.RuleDev} {
				if t != nil {
					tensor.Zero(t)
				}
			}
		}
		conv[i] = tensor.RecurrentRun{Tokens: r.Tokens, State: r.Conv, Dev: r.ConvDev}
		rule[i] = tensor.RecurrentRun{Tokens: r.Tokens, State: r.Rule, Dev: r.RuleDev}
	}
	return conv, rule
}
