package gpt

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// gdnDecodeModel is the golden config with room for 24 positions and
// weights large enough that the logits differ clearly between tokens.
func gdnDecodeModel(t *testing.T) *Model {
	t.Helper()
	c := gdnGoldenConfig()
	c.MaxPositionEmbeddings, c.InitMethodStd = 24, 0.3
	m, err := New(c, tensor.NewRNG(5))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// logSoftmax of one logits row, in float64.
func logSoftmax(row []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	var z float64
	for _, v := range row {
		z += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(row))
	for i, v := range row {
		out[i] = float64(v) - mx - math.Log(z)
	}
	return out
}

func argmax32(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// TestGDNDecodeMatchesFullForward: a hybrid model (gated delta nets at
// layers 0 and 2, gated attention at 1 and 3) decoded incrementally — a
// prefill of 2 tokens (fewer than the convolution's window), then 3, then
// token by token, the recurrent state carried between calls — picks at
// every step the token a full forward over the sequence so far (the
// training path, no state) argmaxes, with log-probabilities within 1e-4 (relative to 1; ~1e-5 seen): float32 rounding of
// the attention layers' and GEMMs' other shapes.
func TestGDNDecodeMatchesFullForward(t *testing.T) {
	m := gdnDecodeModel(t)
	V := m.Config.VocabSize
	kv := m.NewKVCache(24)
	seq := []int32{3, 17, 40, 5, 9}
	if _, err := m.Decode(kv, seq[:2]); err != nil {
		t.Fatal(err)
	}
	last, err := m.Decode(kv, seq[2:])
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for step := 0; len(seq) < 24; step++ {
		full := m.Forward(nil, Batch{Tokens: tensor.FromInt32(append([]int32(nil), seq...), 1, len(seq))}, nil, false).Float32s()
		want := full[(len(seq)-1)*V:]
		if g, w := argmax32(last), argmax32(want); g != w {
			t.Fatalf("step %d: decode picks %d, full forward %d", step, g, w)
		}
		lg, lw := logSoftmax(last), logSoftmax(want)
		for i := range lw {
			worst = math.Max(worst, math.Abs(lg[i]-lw[i])/math.Max(1, math.Abs(lw[i])))
		}
		next := int32(argmax32(last))
		seq = append(seq, next)
		if len(seq) == 24 {
			break
		}
		if last, err = m.Decode(kv, []int32{next}); err != nil {
			t.Fatal(err)
		}
	}
	if worst > 1e-4 {
		t.Fatalf("log-probabilities differ by up to %.3g (relative), want <= 1e-4", worst)
	}
	t.Logf("largest log-probability difference %.3g over %d steps", worst, 24-5)
	// a restart at position 0 zeroes the state: the same prompt again
	// gives the first call's logits
	kv.Len = 0
	again, err := m.Decode(kv, seq[:5])
	if err != nil {
		t.Fatal(err)
	}
	kv2 := m.NewKVCache(24)
	first, err := m.Decode(kv2, seq[:5])
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if again[i] != first[i] {
			t.Fatalf("logit %d after a restart %v, fresh %v: the old state leaked", i, again[i], first[i])
		}
	}
}

// gdnOnly is an Attender without GDNStates.
type gdnOnly struct{}

func (gdnOnly) Attend(layer int, q, k, v, out *tensor.Tensor) {}

// badRuns gives runs that do not cover the step.
type badRuns struct {
	gdnOnly
	runs []GDNRun
}

func (b badRuns) GDNRuns(int) []GDNRun { return b.runs }

// TestGDNDecodeBadAttender: an Attender that keeps no gated delta net
// state, or gives runs that do not fit the step, is an error.
func TestGDNDecodeBadAttender(t *testing.T) {
	m := gdnDecodeModel(t)
	conv, rule := m.GDNStateSize()
	if c := m.Config.GDN; conv != 3*(2*8+24) || rule != 4*4*6 || m.GDNStateBytes() != int64(4*2*(conv+rule)) {
		t.Fatalf("state sizes %d, %d (%d bytes) for %+v", conv, rule, m.GDNStateBytes(), c)
	}
	tok, pos := []int32{1, 2, 3}, []int32{0, 1, 2}
	if _, err := m.DecodeBatch(nil, tok, pos, gdnOnly{}, []int{2}, nil); err == nil || !strings.Contains(err.Error(), "GDNStates") {
		t.Fatalf("no GDNStates: %v", err)
	}
	ok := func(n int) GDNRun { return GDNRun{Tokens: n, Conv: make([]float32, conv), Rule: make([]float32, rule)} }
	for _, c := range []struct {
		runs []GDNRun
		pos  []int32
		want string
	}{
		{[]GDNRun{ok(2)}, pos, "sequences of 2 tokens in a step of 3"},
		{[]GDNRun{ok(4)}, pos, "sequence 0 of 4 tokens"},
		{[]GDNRun{{Tokens: 3, Conv: make([]float32, 1), Rule: make([]float32, rule)}}, pos, "want 120 and 96"},
		{[]GDNRun{ok(3)}, []int32{0, 2, 3}, "not at consecutive positions"},
		// a state half on the device, half in host memory
		{[]GDNRun{{Tokens: 3, ConvDev: tensor.ZerosOn(tensor.Sim, conv), Rule: make([]float32, rule)}}, pos, "partly on the device"},
		{[]GDNRun{{Tokens: 3, ConvDev: tensor.ZerosOn(tensor.Sim, conv), RuleDev: tensor.ZerosOn(tensor.Sim, 1)}}, pos, "want 120 and 96"},
	} {
		if _, err := m.DecodeBatch(nil, tok, c.pos, badRuns{runs: c.runs}, []int{2}, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("runs %v: %v, want an error containing %q", c.runs, err, c.want)
		}
	}
}
