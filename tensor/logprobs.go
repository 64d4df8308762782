package tensor

// TokenLogProbs returns each row's log-probability of its target, the
// log-softmax of logits (n, v) gathered at int32 targets (n): (n) values,
// Megatron's selective_log_softmax (the per-token log-probabilities RL
// losses are written over). It runs the fused cross-entropy kernels: the
// values are minus the per-token losses, and backward scales each row's
// softmax-minus-one-hot by minus the row's incoming gradient, without
// another (n, v) buffer.
func (tp *Tape) TokenLogProbs(logits, targets *Tensor) *Tensor {
	logits = tp.Contiguous(logits)
	n, v := rowsCols(logits)
	cfg := CrossEntropyConfig{N: n, V: v, IgnoreIndex: -1}
	targets = targets.Contiguous()
	losses, lse := tp.empty(logits.dev, n), tp.empty(logits.dev, n)
	be := backendFor(logits, targets)
	be.CrossEntropyForward(losses, lse, logits, targets, cfg)
	out := tp.empty(logits.dev, n)
	be.Scale(out, -1, losses)
	if tp.recording(logits) {
		tp.record("token_logprobs", func(tp *Tape) {
			w := tp.empty(logits.dev, n)
			be.Scale(w, -1, tp.grad(out)) // d logprob = −d loss
			tmp := tp.empty(logits.dev, logits.shape...)
			be.CrossEntropyBackward(tmp, logits, lse, targets, w, cfg)
			tp.addGrad(logits, tmp)
		}, out)
	}
	return out
}
