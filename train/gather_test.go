package train

import (
	"fmt"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/parallel/tp"
)

// Test helpers: the whole model, gathered from the ranks that hold its
// parts, to compare parallel layouts with one process.

// gatherWhole all-gathers a parameter-shaped buffer (the parameter, or one
// of its optimizer buffers) over the TP group and returns the whole tensor.
func (t *Trainer) gatherWhole(name string, shape []int, local []float32) ([]float32, error) {
	if t.stepper.region == nil || t.stepper.replicated(name) {
		return local, nil
	}
	size := t.stepper.region.Size()
	all := make([]float32, size*len(local))
	if err := t.stepper.par.TP.AllGather(t.stepper.cctx, comm.Float32s(all), comm.Float32s(local), nil); err != nil {
		return nil, fmt.Errorf("train: gather %s over the tensor-parallel group: %w", name, err)
	}
	full := t.stepper.fullShape(name, shape)
	whole := make([]float32, len(all))
	for r := range size {
		tp.Merge(whole, all[r*len(local):(r+1)*len(local)], full, t.stepper.plan(name), r, size)
	}
	return whole, nil
}

// wholeParams returns every parameter as a whole-shape safetensors tensor
// (gathered over TP).
func (t *Trainer) wholeParams() (map[string]safetensors.Tensor, error) {
	out := map[string]safetensors.Tensor{}
	for _, p := range t.Model.Params() {
		w, err := t.gatherWhole(p.Name, p.Shape(), hostValues(p))
		if err != nil {
			return nil, err
		}
		st, err := safetensors.FromFloat32(safetensors.F32, t.stepper.fullShape(p.Name, p.Shape()), w)
		if err != nil {
			return nil, err
		}
		out[p.Name] = st
	}
	return out, nil
}

// gatherPipeline brings every pipeline rank's stages into pipeline rank
// 0's whole model. Every rank of the pipeline group takes part.
func (t *Trainer) gatherPipeline() error {
	g := t.stepper.par.PP
	if g.Rank() != 0 {
		for _, p := range ownedParams(t.stepper.stages) {
			if err := g.Send(t.stepper.cctx, comm.Float32s(hostValues(p)), 0); err != nil {
				return fmt.Errorf("send %s to pipeline rank 0: %w", p.Name, err)
			}
		}
		return nil
	}
	for r := 1; r < g.Size(); r++ {
		// Rank 0 holds the whole model: the stages of rank r are views of
		// the tensors to receive into.
		stages, err := t.stepper.arch.SplitStages(t.stepper.model, t.cfg.pipelineSplit(), r)
		if err != nil {
			return err
		}
		for _, p := range ownedParams(stages) {
			if err := staged(p, func(v []float32) error { return g.Recv(t.stepper.cctx, comm.Float32s(v), r) }); err != nil {
				return fmt.Errorf("receive %s from pipeline rank %d: %w", p.Name, r, err)
			}
		}
	}
	return nil
}
