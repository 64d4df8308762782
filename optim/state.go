package optim

import (
	"fmt"
	"sort"

	"github.com/gotron/gotron/tensor"
)

// Optimizer updates parameters from their gradients using each Group's LR
// and WD. Implementations: *AdamW, *SGD. Not safe for concurrent use; Step
// itself splits the work over the backend's threads (tensor.AdamW, tensor.SGD).
type Optimizer interface {
	// Step applies one update to every parameter, reading Grad and writing
	// Data and the optimizer's own state.
	Step()
	// Groups returns the optimizer's param groups. The slice aliases the
	// optimizer's own, so Scheduler.Apply(opt.Groups()) sets the LR and WD
	// the next Step uses.
	Groups() []Group
	// State returns a copy of the optimizer state for a checkpoint.
	State() State
	// LoadState restores a State saved by the same kind of optimizer over
	// parameters with the same names and sizes.
	LoadState(State) error
}

// State is an optimizer's checkpointable state: a step count and named
// float32 buffers, one per (state kind, parameter), keyed
// "<kind>/<param name>" (e.g. "exp_avg/decoder.final_layernorm.weight").
type State struct {
	// Kind is the optimizer ("adamw", "sgd"); LoadState rejects another kind.
	Kind string
	// Steps is the number of updates applied (Megatron/Apex group "step").
	Steps int64
	// Buffers maps "<kind>/<param name>" to a copy of that buffer.
	Buffers map[string][]float32
}

// BufferNames returns the keys of s.Buffers, sorted, for deterministic
// serialisation.
func (s State) BufferNames() []string {
	names := make([]string, 0, len(s.Buffers))
	for k := range s.Buffers {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// StateViewer is implemented by optimizers that can show their state
// without copying it (a synchronous checkpoint writes it as it is).
type StateViewer interface {
	// StateView is State whose buffers alias the optimizer's own: valid
	// until the next Step or LoadState, and not to be modified.
	StateView() State
}

// viewBuffers is saveBuffers without the copies where the buffers are host
// memory; device buffers are copied to the host (tensor.ToHost), the only
// way to read them.
func viewBuffers(out map[string][]float32, kind string, f *flat, bufs []*tensor.Tensor) {
	for i, p := range f.params {
		out[stateKey(kind, p.Name)] = tensor.ToHost(bufs[i]).Float32s()
	}
}

// stateKey is the Buffers key of one per-parameter buffer.
func stateKey(kind, param string) string { return kind + "/" + param }

// saveBuffers copies each per-param buffer bufs[i] (for f.params[i]) into out
// under stateKey(kind, name): a host copy, from any device.
func saveBuffers(out map[string][]float32, kind string, f *flat, bufs []*tensor.Tensor) {
	for i, p := range f.params {
		if bufs[i].Device() == tensor.CPU {
			out[stateKey(kind, p.Name)] = append([]float32(nil), bufs[i].Float32s()...)
		} else {
			out[stateKey(kind, p.Name)] = tensor.ToHost(bufs[i]).Float32s() // a fresh copy already
		}
	}
}

// loadBuffers copies s's buffers of kind into bufs (one per f.params[i], on
// any device: tensor.Copy from the host). checkBuffers has checked them.
func loadBuffers(s State, kind string, f *flat, bufs []*tensor.Tensor) {
	for i, p := range f.params {
		b := s.Buffers[stateKey(kind, p.Name)]
		tensor.Copy(bufs[i], tensor.FromFloat32(b, len(b)))
	}
}

// checkBuffers verifies that s holds exactly one buffer of the right length
// for each (kind, param) pair and nothing else; errors name the offending key.
func checkBuffers(who string, s State, f *flat, kinds []string) error {
	want := 0
	for _, kind := range kinds {
		for _, p := range f.params {
			k := stateKey(kind, p.Name)
			b, ok := s.Buffers[k]
			if !ok {
				return fmt.Errorf("optim: %s: load state: missing buffer %q", who, k)
			}
			if len(b) != p.Data.Numel() {
				return fmt.Errorf("optim: %s: load state: buffer %q has %d values, parameter %q (shape %v) has %d",
					who, k, len(b), p.Name, p.Data.Shape(), p.Data.Numel())
			}
			want++
		}
	}
	if len(s.Buffers) != want {
		for _, k := range s.BufferNames() {
			known := false
			for _, kind := range kinds {
				for _, p := range f.params {
					if k == stateKey(kind, p.Name) {
						known = true
					}
				}
			}
			if !known {
				return fmt.Errorf("optim: %s: load state: buffer %q matches no parameter of this optimizer", who, k)
			}
		}
	}
	return nil
}
