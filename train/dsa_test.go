package train

import (
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
)

// dsaModel is a small MLA model with DeepSeek sparse attention: top-4 of
// 16 keys, the dense indexer loss with a large coefficient (so that the
// indexer's parameters move), ReLU scores and the Hadamard rotation.
func dsaModel() gpt.Config {
	m := mlaModels()["mla-qlora"]
	m.DisableBiasLinear = true
	m.DSA = gpt.DSAConfig{Enabled: true, IndexerHeads: 4, IndexerHeadDim: 8, TopK: 4, LossCoeff: 0.5}
	return m
}

// TestDSAParallelMatchesSingleProcess: DeepSeek sparse attention under
// tensor parallelism with and without sequence parallelism (the indexer
// whole on every rank over the gathered sequence, its loss's target summed
// over the ranks' heads, its gradients not summed over TP), under
// pipeline parallelism and in the DSA config's layout (TP=2 PP=2 SP)
// reproduces the single-process run: the lm loss at each of 10
// iterations, the logged indexer loss, the validation loss and the
// gathered parameters (the indexer's, trained by its loss alone, among
// them) within 1e-5.
func TestDSAParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dsaModel())
	cfg.MicroBatchSize = 2
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	if len(ref.res.MoELosses) == 0 || !(ref.res.MoELosses[0][gpt.IndexerLossName] > 0) {
		t.Fatalf("single process: logged losses %v, want a positive %q", ref.res.MoELosses, gpt.IndexerLossName)
	}
	check := func(label string, got []dpRun) {
		t.Helper()
		checkSameRun(t, label, ref, got)
		for r, g := range got {
			for i, m := range g.res.MoELosses {
				if want := ref.res.MoELosses[i][gpt.IndexerLossName]; !relClose(m[gpt.IndexerLossName], want, 1e-5) {
					t.Fatalf("%s rank %d iteration %d: indexer loss %.9g, single process %.9g", label, r, i+1, m[gpt.IndexerLossName], want)
				}
			}
		}
	}
	for _, sp := range []bool{false, true} {
		label := "dsa TP=2 SP=false"
		if sp {
			label = "dsa TP=2 SP=true"
		}
		check(label, runTP(t, cfg, 2, 1, sp, ddp.Config{}, train, valid))
	}
	for _, l := range []ppLayout{{tp: 1, pp: 2, dp: 1}, {tp: 2, pp: 2, dp: 1, sp: true}} {
		l.split.PP = l.pp
		check("dsa "+l.String(), runPP(t, cfg, l, train, valid))
	}
	check("dsa DP=2", runDP(t, cfg, 2, ddp.Config{}, train, valid))
}

// TestDSACheckpointResume: a DSA run saved at iteration 5 under TP=2 with
// SP resumes at TP=2 with SP and at one process with the losses of the
// uninterrupted run (the indexer's parameters and their optimizer state
// are in the checkpoint under Megatron's names).
func TestDSACheckpointResume(t *testing.T) {
	cfg := dpConfig(dsaModel())
	cfg.MicroBatchSize = 2
	checkTPSPResume(t, "DSA", cfg)
}
