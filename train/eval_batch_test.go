package train

import (
	"context"
	"math"
	"testing"

	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// TestEvalBatchSizes: --eval-global-batch-size and --eval-micro-batch-size
// set the evaluation's batches, as Megatron's evaluate: 2 evaluation
// batches of 6 samples (in forwards of 3) give the mean loss over
// validation samples 0..11, computed here independently (float64
// log-softmax of the trained model's logits, over every label, as Megatron
// divides the summed loss by the token count); without them the batches are
// the training's (samples 0..15). Over 2 data-parallel ranks the loss is
// the same; sizes Megatron refuses are refused.
func TestEvalBatchSizes(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.TrainIters, cfg.EvalInterval, cfg.EvalIters = 3, 100, 2 // one evaluation, after training

	// independent is the token mean of the loss over validation samples
	// [0, n) with tr's model.
	independent := func(tr *Trainer, n int) float64 {
		t.Helper()
		bt, err := makeBatch(valid, 0, n, cfg.SeqLength, cfg.Model.VocabSize)
		if err != nil {
			t.Fatal(err)
		}
		tp := tensor.NewNoGradTape(nil)
		logits := tensor.ToHost(tr.Model.Forward(tp, bt, nil, false)).Float32s()
		labels := bt.Labels.Int32s()
		v := cfg.Model.VocabSize
		var sum float64
		for i, label := range labels {
			row := logits[i*v : (i+1)*v]
			hi := math.Inf(-1)
			for _, x := range row {
				hi = math.Max(hi, float64(x))
			}
			var z float64
			for _, x := range row {
				z += math.Exp(float64(x) - hi)
			}
			sum += hi + math.Log(z) - float64(row[label])
		}
		return sum / float64(len(labels))
	}
	run := func(c Config) (*Trainer, Result) {
		t.Helper()
		tr, err := New(c, train, valid)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return tr, res
	}

	c := cfg
	c.EvalGlobalBatchSize, c.EvalMicroBatchSize = 6, 3
	tr, res := run(c)
	if want := independent(tr, 12); !relClose(res.ValidLoss, want, 1e-5) {
		t.Fatalf("validation loss with --eval-global-batch-size 6 --eval-micro-batch-size 3: %.9g, independent over samples 0..11: %.9g", res.ValidLoss, want)
	}
	if tr.ConsumedValid != 12 {
		t.Fatalf("consumed validation samples %d, want 2 batches of 6", tr.ConsumedValid)
	}
	tr0, res0 := run(cfg)
	if want := independent(tr0, 16); !relClose(res0.ValidLoss, want, 1e-5) {
		t.Fatalf("validation loss with the training batch sizes: %.9g, independent over samples 0..15: %.9g", res0.ValidLoss, want)
	}
	if relClose(res0.ValidLoss, res.ValidLoss, 1e-7) {
		t.Fatalf("validation loss %.9g both with and without the evaluation batch sizes", res.ValidLoss)
	}

	runs := runDP(t, c, 2, ddp.Config{}, train, valid)
	for r, g := range runs {
		if !relClose(g.res.ValidLoss, res.ValidLoss, 1e-5) {
			t.Fatalf("DP=2 rank %d: validation loss %.9g, one process %.9g", r, g.res.ValidLoss, res.ValidLoss)
		}
	}

	for _, bad := range []struct{ gbs, mbs int }{{5, 3}, {6, 4}, {-1, 0}} {
		c := cfg
		c.EvalGlobalBatchSize, c.EvalMicroBatchSize = bad.gbs, bad.mbs
		if _, err := New(c, train, valid); err == nil {
			t.Errorf("--eval-global-batch-size %d --eval-micro-batch-size %d: accepted", bad.gbs, bad.mbs)
		}
	}
}

// TestEvalRunsInTrainingPrecision: under --bf16 the validation loss is the
// loss of bf16-rounded products (Megatron evaluates its bf16 model), not of
// float32 ones: it equals a forward on a MatmulBF16 tape and differs from a
// float32 one.
func TestEvalRunsInTrainingPrecision(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.TrainIters, cfg.EvalInterval, cfg.EvalIters = 3, 100, 1
	cfg.BF16 = true
	tr, err := New(cfg, train, valid)
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bt, err := makeBatch(valid, 0, cfg.GlobalBatchSize, cfg.SeqLength, cfg.Model.VocabSize)
	if err != nil {
		t.Fatal(err)
	}
	loss := func(p tensor.MatmulPrecision) float64 {
		tp := tensor.NewNoGradTape(nil)
		tp.SetMatmulPrecision(p)
		return float64(tensor.ToHost(tr.Model.Loss(tp, tr.Model.Forward(tp, bt, nil, false), bt)).Float32s()[0])
	}
	bf16, fp32 := loss(tensor.MatmulBF16), loss(tensor.MatmulFP32)
	if relClose(bf16, fp32, 1e-6) {
		t.Fatalf("bf16 and float32 products give the same loss %.9g: the test cannot tell them apart", bf16)
	}
	if !relClose(res.ValidLoss, bf16, 1e-6) {
		t.Fatalf("--bf16 validation loss %.9g; with bf16 products %.9g, float32 products %.9g", res.ValidLoss, bf16, fp32)
	}
}
