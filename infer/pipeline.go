package infer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Pipeline-parallel serving: the model's layers are cut into stages
// (gpt.SplitStages, training's split), one per pipeline rank, each with
// its own Engine whose KV pool caches its stage's layers. The engines step
// in lockstep (Lockstep and Follow over every rank of the job), so every
// rank schedules the same batch from the same replicated state. Per step
// the first stage embeds the batch's tokens — decode tokens and prefill
// chunks alike — and runs its layers; each stage sends its hidden states
// to the next over the pipeline group; the last stage computes the logits,
// draws the tokens and broadcasts what it drew (with the log-probabilities
// asked for) to the pipeline's other stages, so every rank applies the same
// tokens to its sequences. Tensor parallelism works inside each stage: the
// stage's ranks hold slices of its layers (gpt.Parallelize before the
// split) and each tensor-parallel rank has its own pipeline group.

// PipelineStage places an Engine on one stage of a pipeline-parallel model
// (NewPipelineEngine).
type PipelineStage struct {
	// Stage is this rank's part of the model: gpt.SplitStages's stage of
	// one chunk (interleaved virtual stages do not decode).
	Stage *gpt.Stage
	// Group is the pipeline's stages, group rank r holding stage r (in a
	// tensor-parallel layout, the stages of this rank's tensor-parallel
	// rank). Its Send and Recv carry the hidden states from stage to
	// stage; its Broadcast, rooted at the last stage, the drawn tokens.
	Group comm.ProcessGroup
	// Ctx governs the transfers (nil: context.Background).
	Ctx context.Context
}

// pipeline is an Engine's stage of a pipeline-parallel model.
type pipeline struct {
	PipelineStage
	ctx         context.Context
	first, last bool
	hidden      []float32 // the host copy of the hidden states sent or received
	ints        []int32   // the step's drawn ids, packed for the broadcast
	floats      []float32 // the step's log-probabilities, packed for the broadcast
}

// NewPipelineEngine is NewEngine for one stage of a pipeline-parallel
// model. Its steps communicate with the other stages' engines, so the
// engines run under a Lockstep over every rank (Follow on the ranks but
// the first), which also runs their warm-up.
func NewPipelineEngine(ps PipelineStage, cfg EngineConfig) (*Engine, error) {
	st := ps.Stage
	switch {
	case st == nil || ps.Group == nil:
		return nil, errors.New("infer: pipeline stage without its stage or group")
	case st.Chunk != 0:
		return nil, fmt.Errorf("infer: pipeline rank %d's model chunk %d: interleaved virtual pipeline stages do not decode, not built in gotron (one chunk per pipeline rank)", st.Rank, st.Chunk)
	case ps.Group.Rank() != st.Rank:
		return nil, fmt.Errorf("infer: pipeline stage %d on rank %d of its pipeline group: want the stage's own rank", st.Rank, ps.Group.Rank())
	case st.IsLast() != (st.Rank == ps.Group.Size()-1):
		return nil, fmt.Errorf("infer: pipeline stage %d of a group of %d stages: the split's last stage and the group's disagree", st.Rank, ps.Group.Size())
	}
	p := &pipeline{PipelineStage: ps, ctx: ps.Ctx, first: st.IsFirst(), last: st.IsLast()}
	if p.ctx == nil {
		p.ctx = context.Background()
	}
	return newEngine(st.DecodeModel(), cfg, p)
}

// agreeBlocks returns the fewest KV blocks any stage's budget holds
// (blocks is this stage's; math.MaxInt for a stage without attention
// layers): the stages' schedulers must count the same blocks, and the
// stages' layers may cache different bytes a block (a hybrid model's
// stages hold different numbers of attention layers).
func (p *pipeline) agreeBlocks(blocks int) (int, error) {
	v := []int64{int64(blocks)}
	if err := p.Group.AllReduce(p.ctx, comm.Int64s(v), comm.Min); err != nil {
		return 0, fmt.Errorf("infer: pipeline stage %d: agree on the KV blocks with the other stages: %w", p.Stage.Rank, err)
	}
	return int(v[0]), nil
}

// forward runs the step's tokens through this stage: it receives the
// previous stage's hidden states (but on the first), runs its layers and
// sends them on (but on the last, which returns the logits of rows).
func (p *pipeline) forward(e *Engine, rows []int) (*tensor.Tensor, error) {
	n, h := len(e.tokens), e.m.Config.HiddenSize
	prev, next := p.Stage.Rank-1, p.Stage.Rank+1
	var in *tensor.Tensor
	if !p.first {
		p.hidden = slices.Grow(p.hidden[:0], n*h)[:n*h]
		if err := p.Group.Recv(p.ctx, comm.Float32s(p.hidden), prev); err != nil {
			return nil, fmt.Errorf("pipeline stage %d: receive the hidden states of stage %d: %w", p.Stage.Rank, prev, err)
		}
		in = tensor.FromFloat32(p.hidden, n, h).ToDevice(e.m.Device())
	}
	out, err := p.Stage.DecodeBatch(&e.bufs, in, e.tokens, e.positions, e.att, rows, e.linears())
	if err != nil || p.last {
		return out, err
	}
	host := tensor.ToHost(out).Float32s()
	if err := p.Group.Send(p.ctx, comm.Float32s(host[:n*h]), next); err != nil {
		return nil, fmt.Errorf("pipeline stage %d: send the hidden states to stage %d: %w", p.Stage.Rank, next, err)
	}
	return nil, nil
}

// warmUp is Engine.warmUp on the stage, alone: its first layer (and the
// embedding or the head where it has them) over a dummy input.
func (p *pipeline) warmUp(e *Engine, tokens, positions []int32, rows []int) error {
	st := *p.Stage // shares the weights
	st.Layers = st.Layers[:min(1, len(st.Layers))]
	var in *tensor.Tensor
	if !p.first {
		in = tensor.ZerosOn(e.m.Device(), len(tokens), e.m.Config.HiddenSize)
	}
	// A gated delta net layer runs the tokens as sequences with scratch
	// states, as Engine.warmUp's.
	var att discardAttention
	view := st.DecodeModel()
	for i := 0; i < len(tokens) && view.GDNStateBytes() > 0; i += e.maxPos {
		att.runs = append(att.runs, gpt.GDNRun{Tokens: min(e.maxPos, len(tokens)-i)})
		att.states = append(att.states, view.NewGDNState())
	}
	_, err := st.DecodeBatch(&e.bufs, in, tokens, positions, att, rows, e.linears())
	return err
}

// promptRows is one planned sequence's prompt log-probabilities this
// step: positions [pos0, pos0+m) of its prompt.
type promptRows struct {
	s       *sequence
	pos0, m int
}

// shareResults gives every stage what the last one drew this step: the
// tokens and log-probabilities of e.drawIdx (into e.draws) and the prompt
// log-probabilities of e.prompts. The other stages know from their own
// replicated state how many of each there are, and lay them out alike.
func (p *pipeline) shareResults(e *Engine) error {
	if !p.last {
		for j, i := range e.drawIdx {
			e.draws[i] = Event{}
			if k := e.drawSpec[j].TopLogprobs; k > 0 {
				e.draws[i].TopLogprobs = make([]TokenLogprob, min(k, e.cfg.VocabSize))
			}
		}
		for _, r := range e.prompts {
			if r.s.promptTop != nil {
				k := min(r.s.req.TopLogprobs, e.cfg.VocabSize)
				for j := range r.m {
					r.s.promptTop[r.pos0+j] = make([]TokenLogprob, k)
				}
			}
		}
	}
	// visit walks the results in their packed order.
	visit := func(id func(*int), lp func(*float32)) {
		for _, i := range e.drawIdx {
			ev := &e.draws[i]
			id(&ev.Token)
			lp(&ev.Logprob)
			for t := range ev.TopLogprobs {
				id(&ev.TopLogprobs[t].Token)
				lp(&ev.TopLogprobs[t].Logprob)
			}
		}
		for _, r := range e.prompts {
			for j := range r.m {
				lp(&r.s.promptLP[r.pos0+j])
				if r.s.promptTop != nil {
					for t := range r.s.promptTop[r.pos0+j] {
						id(&r.s.promptTop[r.pos0+j][t].Token)
						lp(&r.s.promptTop[r.pos0+j][t].Logprob)
					}
				}
			}
		}
	}
	p.ints, p.floats = p.ints[:0], p.floats[:0]
	if p.last {
		visit(func(v *int) { p.ints = append(p.ints, int32(*v)) }, func(v *float32) { p.floats = append(p.floats, *v) })
	} else {
		var ni, nf int
		visit(func(*int) { ni++ }, func(*float32) { nf++ })
		p.ints, p.floats = slices.Grow(p.ints, ni)[:ni], slices.Grow(p.floats, nf)[:nf]
	}
	root := p.Group.Size() - 1
	for _, b := range []comm.Buffer{comm.Int32s(p.ints), comm.Float32s(p.floats)} {
		if b.Len() == 0 {
			continue
		}
		if err := p.Group.Broadcast(p.ctx, b, root); err != nil {
			return fmt.Errorf("pipeline stage %d: the tokens drawn by the last stage (%d): %w", p.Stage.Rank, root, err)
		}
	}
	if p.last {
		return nil
	}
	var ni, nf int
	vocab := int32(e.cfg.VocabSize)
	var bad error
	visit(func(v *int) {
		if t := p.ints[ni]; t < 0 || t >= vocab {
			bad = fmt.Errorf("pipeline stage %d: the last stage drew token %d: want 0..%d", p.Stage.Rank, t, vocab-1)
		}
		*v = int(p.ints[ni])
		ni++
	}, func(v *float32) { *v = p.floats[nf]; nf++ })
	for _, r := range e.prompts {
		r.s.lpDone = max(r.s.lpDone, r.pos0+r.m)
	}
	return bad
}
