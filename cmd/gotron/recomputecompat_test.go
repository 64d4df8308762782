package main

import (
	"strings"
	"testing"
)

// TestTrainRecomputeNumLayersWithoutGranularity: Megatron checks
// --recompute-num-layers only under a --recompute-granularity, so a config
// passing it alone (gpt3_mcore_reruns_resume_check_grads) runs without
// recomputation; gotron says so. Under selective granularity it is
// refused, as Megatron's TransformerConfig does.
func TestTrainRecomputeNumLayersWithoutGranularity(t *testing.T) {
	_, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--eval-iters", "0", "--recompute-num-layers", "1")...)
	if code != 0 || !strings.Contains(errs, "--recompute-method/--recompute-num-layers without --recompute-granularity: nothing is recomputed, as in Megatron") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--recompute-granularity", "selective", "--recompute-num-layers", "1")...)
	if code == 0 || !strings.Contains(errs, "--recompute-granularity full") {
		t.Fatalf("selective with --recompute-num-layers: exit %d: %s", code, errs)
	}
}

// TestTrainStragglerMinmaxCountAlone: Megatron builds its straggler
// detector only with --log-straggler, so --straggler-minmax-count alone
// (the GRPO configs) changes nothing: accepted with a line saying so;
// --log-straggler itself is refused naming the detector.
func TestTrainStragglerMinmaxCountAlone(t *testing.T) {
	_, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--eval-iters", "0", "--straggler-minmax-count", "16")...)
	if code != 0 || !strings.Contains(errs, "the detector runs only with --log-straggler (not built in gotron), so without it the count does nothing, as in Megatron") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--log-straggler")...)
	if code == 0 || !strings.Contains(errs, "straggler detector") {
		t.Fatalf("--log-straggler: exit %d: %s", code, errs)
	}
}
