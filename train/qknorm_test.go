package train

import (
	"fmt"
	"testing"

	"github.com/gotron/gotron/parallel/ddp"
)

// TestQKLayerNormTensorParallel: --qk-layernorm (with --apply-layernorm-1p,
// so the norms' γ moves from 0) under tensor parallelism, with and without
// sequence parallelism (RMSNorm, GQA), reproduces the single-process run. Each TP rank
// normalises only its heads, so the q/k norm gradients are partial sums that
// must be all-reduced over the TP group (Megatron's finalize_model_grads):
// without that the replicated norm weights drift apart and this fails.
func TestQKLayerNormTensorParallel(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		if name != "llama" {
			// With LayerNorm the key norm's bias adds q·β to every score of a
			// query, which the softmax cancels: its gradient is exactly zero
			// and Adam turns float32 noise (different sums under TP) into
			// ±lr steps, so only the RMSNorm model compares parameters.
			continue
		}
		m.QKLayerNorm, m.LayerNorm1P = true, true
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 2
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		for _, sp := range []bool{false, true} {
			checkSameRun(t, fmt.Sprintf("%s qk-layernorm TP=2 SP=%v", name, sp), ref, runTP(t, cfg, 2, 1, sp, ddp.Config{}, train, valid))
		}
	}
}
