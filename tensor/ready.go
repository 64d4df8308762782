package tensor

import (
	"fmt"
	"slices"
)

// SetGradReadyHook makes the tape report, during each Backward or
// BackwardFrom, the parameters (leaf tensors that require gradients) whose
// Grad will receive nothing more in that pass: data-parallel training starts
// a bucket's gradient reduction as soon as its last gradient is final, while
// backward goes on (Megatron's backward hooks with --overlap-grad-reduce).
//
// The tape learns when each parameter's gradient is final from one pass and
// applies it to the following passes over the same recorded graph (the same
// steps by name in the same order, as every micro-batch of a fixed-shape model
// records): the first pass, and any pass whose graph differs from the last
// one, reports every parameter at its end. A pass in which a parameter's
// gradient changes after it was reported returns an error instead of a wrong
// gradient. Parameters are reported in the order their gradients became
// final. fn runs on the goroutine calling Backward; nil removes the hook.
func (tp *Tape) SetGradReadyHook(fn func(ready []*Tensor)) {
	if fn == nil {
		tp.ready = nil
		return
	}
	tp.ready = &readyTracker{hook: fn, last: map[*Tensor]int{}, reported: map[*Tensor]bool{}}
}

// readyTracker follows, for one backward pass, which step last adds into
// each parameter's Grad, and keeps the previous pass's answer as the plan.
type readyTracker struct {
	hook func([]*Tensor)
	cur  int // index of the step whose backward is running

	// This pass.
	last     map[*Tensor]int // leaf → lowest step index that added to its Grad
	order    []*Tensor       // leaves in order of first contribution
	reported map[*Tensor]bool
	planned  bool // this pass follows a plan
	err      error

	// The plan learned from the previous pass.
	planNames []string          // step names of the pass the plan was learned from
	planAt    map[int][]*Tensor // step index → leaves final after that step
}

// begin starts a pass over steps.
func (r *readyTracker) begin(steps []step) {
	clear(r.last)
	clear(r.reported)
	r.order = r.order[:0]
	r.err = nil
	r.planned = r.planAt != nil && len(steps) == len(r.planNames)
	for i := 0; r.planned && i < len(steps); i++ {
		r.planned = steps[i].name == r.planNames[i]
	}
	if !r.planned {
		r.planNames = r.planNames[:0]
		for _, s := range steps {
			r.planNames = append(r.planNames, s.name)
		}
		r.planAt = nil
	}
}

// note records that the running step adds into leaf's gradient.
func (r *readyTracker) note(leaf *Tensor) {
	if _, seen := r.last[leaf]; !seen {
		r.order = append(r.order, leaf)
	}
	r.last[leaf] = r.cur
	if r.reported[leaf] && r.err == nil {
		r.err = fmt.Errorf("tensor: the gradient of %s changed after it was reported final (the recorded graph differs from the one the gradient-ready plan was learned from)", leaf.Name)
	}
}

// after reports the leaves the plan says are final after step i.
func (r *readyTracker) after(i int) {
	if !r.planned {
		return
	}
	if ls := r.planAt[i]; len(ls) > 0 {
		for _, l := range ls {
			r.reported[l] = true
		}
		r.hook(ls)
	}
}

// end reports what the plan did not (every leaf on an unplanned pass), learns
// the plan for the next pass, and returns the pass's error.
func (r *readyTracker) end() error {
	var rest []*Tensor
	for _, l := range r.order {
		if !r.reported[l] {
			rest = append(rest, l)
		}
	}
	// Order of finality: the leaf whose last contribution came from the
	// highest step index was final first.
	slices.SortStableFunc(rest, func(a, b *Tensor) int { return r.last[b] - r.last[a] })
	if len(rest) > 0 {
		r.hook(rest)
	}
	if r.err != nil {
		r.planAt = nil
		return r.err
	}
	plan := map[int][]*Tensor{}
	for _, l := range r.order {
		plan[r.last[l]] = append(plan[r.last[l]], l)
	}
	r.planAt = plan
	return nil
}
