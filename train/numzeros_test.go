package train

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestLogNumZerosInGrad: --log-num-zeros-in-grad prints Megatron's
// "num zeros: N |" after the grad norm, N being the zero elements of the
// last iteration's gradients counted independently here (an untied
// embedding with tokens the batch does not use has zero rows); without the
// flag the field is absent.
func TestLogNumZerosInGrad(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalIters, cfg.ClipGrad = 4, 0, 0
	cfg.Model.UntieEmbeddingsAndOutputWeights = true
	cfg.LogNumZerosInGrad = true
	var out bytes.Buffer
	cfg.Out = &out
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, g := range tr.stepper.opt.Groups() {
		for _, p := range g.Params {
			for _, v := range p.Grad.Float32s() {
				if v == 0 {
					want++
				}
			}
		}
	}
	if want < int64(cfg.Model.HiddenSize) {
		t.Fatalf("only %d zero gradient elements: the test needs an unused embedding row", want)
	}
	field := fmt.Sprintf("| grad norm: %s | num zeros: %d |", pyFixed(tr.stepper.lastGradNorm, 3), want)
	if !strings.Contains(out.String(), field) {
		t.Errorf("log line lacks %q:\n%s", field, out.String())
	}

	cfg.LogNumZerosInGrad = false
	out.Reset()
	tr, err = New(cfg, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "num zeros") {
		t.Errorf("num zeros printed without LogNumZerosInGrad:\n%s", out.String())
	}
}
