package rl

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// golden is rl/testdata/grpo_golden.json, the numbers Megatron's own
// calculate_grpo_advantages, selective_log_softmax, calculate_grpo_loss,
// train_rl.loss_func and countdown.compute_score give (tools/golden/grpo.py).
type golden struct {
	Advantages struct {
		Rewards  [][]float64 `json:"rewards"`
		NumTurns [][]int     `json:"num_turns"`
		Want     []float64   `json:"want"`
	} `json:"advantages"`
	Loss struct {
		Shape            []int     `json:"shape"`
		MicroBatches     int       `json:"micro_batches"`
		ClampEpsLower    float64   `json:"clamp_eps_lower"`
		ClampEpsUpper    float64   `json:"clamp_eps_upper"`
		KLBeta           float64   `json:"kl_beta"`
		EntropyWeight    float64   `json:"entropy_weight"`
		ISTruncation     float64   `json:"is_truncation_coef"`
		Logits           []float64 `json:"logits"`
		Tokens           []int32   `json:"tokens"`
		Old, Ref, Inf    []float64
		Mask             []float64 `json:"mask"`
		Adv              []float64 `json:"advantages"`
		WantCurrent      []float64 `json:"want_current"`
		WantLoss         []float64 `json:"want_loss"`
		WantKL           []float64 `json:"want_kl"`
		WantRatio        []float64 `json:"want_ratio"`
		WantEntropy      []float64 `json:"want_entropy"`
		WantPlainLoss    []float64 `json:"want_plain_loss"`
		WantObjective    float64   `json:"want_objective"`
		WantTotalTokens  float64   `json:"want_total_tokens"`
		WantDLogits      []float64 `json:"want_dlogits"`
		InferenceLogprob []float64 `json:"inference"`
	} `json:"loss"`
	Countdown []struct {
		Target    int64     `json:"target"`
		Nums      []int64   `json:"nums"`
		Responses []string  `json:"responses"`
		Want      []float64 `json:"want"`
	} `json:"countdown"`
	Prompt struct {
		Target int64   `json:"target"`
		Nums   []int64 `json:"nums"`
		Want   string  `json:"want"`
	} `json:"prompt"`
}

func loadGolden(t *testing.T) *golden {
	t.Helper()
	b, err := os.ReadFile("testdata/grpo_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Loss struct{ Old, Ref []float64 } `json:"loss"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	g.Loss.Old, g.Loss.Ref, g.Loss.Inf = raw.Loss.Old, raw.Loss.Ref, g.Loss.InferenceLogprob
	return &g
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*(1+math.Abs(b)) }

func TestAdvantagesMatchMegatron(t *testing.T) {
	g := loadGolden(t)
	got, err := Advantages(g.Advantages.Rewards, g.Advantages.NumTurns)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(g.Advantages.Want) {
		t.Fatalf("%d advantages, want %d", len(got), len(g.Advantages.Want))
	}
	for i, w := range g.Advantages.Want {
		// numpy's float64 steps, the same order: the same bits, even the
		// -1.4e-13 of a group of equal rewards.
		if got[i] != w {
			t.Errorf("advantage %d = %.17g, Megatron %.17g", i, got[i], w)
		}
	}
	if _, err := Advantages([][]float64{{1, 2}, {3}}, [][]int{{1, 1}, {1}}); err == nil {
		t.Error("groups of different sizes: no error")
	}
}

// TestGRPOLossMatchesMegatron checks the per-token loss, its terms and the
// per-token objective (two micro-batches, loss sums over the global batch's
// tokens) against Megatron's functions in float64, and the gradient of the
// objective with respect to the logits, through tensor.TokenLogProbs, in
// float32.
func TestGRPOLossMatchesMegatron(t *testing.T) {
	g := loadGolden(t)
	L := g.Loss
	cfg := LossConfig{ClampEpsLower: L.ClampEpsLower, ClampEpsUpper: L.ClampEpsUpper, KLBeta: L.KLBeta,
		EntropyWeight: L.EntropyWeight, ISCorrection: true, ISTruncation: L.ISTruncation}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	B, S, V := L.Shape[0], L.Shape[1], L.Shape[2]
	T := S - 1
	tokens := make([]Token, B*T)
	for i := range tokens {
		tokens[i] = Token{Current: L.WantCurrent[i], Old: L.Old[i], Ref: L.Ref[i], Inference: L.Inf[i], Advantage: L.Adv[i/T]}
		loss, _, r, kl, ent := cfg.TokenLoss(tokens[i])
		for _, c := range []struct {
			name      string
			got, want float64
		}{{"loss", loss, L.WantLoss[i]}, {"ratio", r, L.WantRatio[i]}, {"kl", kl, L.WantKL[i]}, {"entropy", ent, L.WantEntropy[i]}} {
			if !near(c.got, c.want, 1e-12) {
				t.Errorf("token %d %s = %.15g, Megatron %.15g", i, c.name, c.got, c.want)
			}
		}
		plain := cfg
		plain.ISCorrection = false
		if pl, _, _, _, _ := plain.TokenLoss(tokens[i]); !near(pl, L.WantPlainLoss[i], 1e-12) {
			t.Errorf("token %d loss without IS correction = %.15g, Megatron %.15g", i, pl, L.WantPlainLoss[i])
		}
	}
	// The objective: micro-batches of B/M rows, their loss sums over the
	// global batch's tokens (Megatron's --calculate-per-token-loss).
	M := L.MicroBatches
	rows := B / M
	grads := make([]float64, B*T)
	var sum, total float64
	for m := range M {
		lo, hi := m*rows*T, (m+1)*rows*T
		s, err := cfg.MicroBatchLoss(tokens[lo:hi], L.Mask[lo:hi], grads[lo:hi])
		if err != nil {
			t.Fatal(err)
		}
		sum += s.Loss
		total += s.Tokens
	}
	// loss_func sums in float32 (output_tensor.float()): 1e-6.
	if total != L.WantTotalTokens || !near(sum/total, L.WantObjective, 1e-6) {
		t.Fatalf("objective %.15g over %g tokens, Megatron %.15g over %g", sum/total, total, L.WantObjective, L.WantTotalTokens)
	}

	// The gradient by the logits: TokenLogProbs over positions 0..S-2
	// (labels the next token), backward from d objective / d logprob.
	logits32 := make([]float32, B*T*V)
	targets := make([]int32, B*T)
	for b := range B {
		for s := range T {
			for v := range V {
				logits32[(b*T+s)*V+v] = float32(L.Logits[(b*S+s)*V+v])
			}
			targets[b*T+s] = L.Tokens[b*S+s+1]
		}
	}
	logits := tensor.FromFloat32(logits32, B*T, V)
	logits.SetRequiresGrad(true)
	tp := tensor.NewTape()
	lp := tp.TokenLogProbs(logits, tensor.FromInt32(targets, B*T))
	for i, v := range lp.Float32s() {
		if !near(float64(v), L.WantCurrent[i], 2e-6) {
			t.Fatalf("logprob %d = %g, Megatron's selective_log_softmax %g", i, v, L.WantCurrent[i])
		}
	}
	g32 := make([]float32, B*T)
	for i, gr := range grads {
		g32[i] = float32(gr / total)
	}
	if err := tp.BackwardFrom([]*tensor.Tensor{lp}, []*tensor.Tensor{tensor.FromFloat32(g32, B*T)}); err != nil {
		t.Fatal(err)
	}
	got := logits.Grad.Float32s()
	var maxErr float64
	for b := range B {
		for s := range S {
			for v := range V {
				want := L.WantDLogits[(b*S+s)*V+v]
				g := 0.0
				if s < T {
					g = float64(got[(b*T+s)*V+v])
				}
				maxErr = math.Max(maxErr, math.Abs(g-want))
				if math.Abs(g-want) > 1e-6+1e-4*math.Abs(want) {
					t.Fatalf("d objective / d logits[%d,%d,%d] = %.8g, Megatron (autograd) %.8g", b, s, v, g, want)
				}
			}
		}
	}
	t.Logf("objective %.9f over %g tokens; max |dlogits − Megatron's| = %.2g", sum/total, total, maxErr)
}

func TestCountdownMatchesMegatron(t *testing.T) {
	g := loadGolden(t)
	for _, c := range g.Countdown {
		task := Countdown{Target: c.Target, Nums: c.Nums}
		for i, r := range c.Responses {
			if got := task.Score(r); got != c.Want[i] {
				t.Errorf("target %d nums %v: score(%q) = %g, Megatron's compute_score %g", c.Target, c.Nums, r, got, c.Want[i])
			}
		}
	}
	p := Countdown{Target: g.Prompt.Target, Nums: g.Prompt.Nums}.Prompt()
	if p != g.Prompt.Want {
		t.Errorf("prompt\n%q\nMegatron's make_prefix\n%q", p, g.Prompt.Want)
	}
}

// TestEvalPython covers what the golden's responses do not: Python's
// literal, division and power rules.
func TestEvalPython(t *testing.T) {
	for _, c := range []struct {
		eq   string
		want float64
		ok   bool
	}{
		{"1 +\x0b2", 0, false}, {"1 +\r2", 0, false}, {"(1 +\r2)", 3, true}, {"1 +\x0c2", 3, true},
		{"00+1", 1, true}, {"1 .5", 0, false}, {"1. + .5", 1.5, true}, {"2**-1", 0.5, true},
		{"-2**2", -4, true}, {"(0-8)**(1/3)", 0, false}, {"7//-2", -4, true}, {"7.0//2", 3, true},
		{"1/3*3", 1, true}, {"(2)(3)", 0, false}, {"1/0", 0, false}, {"2**3**2", 512, true},
		{"(1-2)**1001", -1, true}, {"-7//2", -4, true}, {"-7//-2", 3, true}, {"7//2", 3, true}, {"9**9**9", 0, false}, {"1**(9**9**9)", 0, false}, {"1.2.3", 0, false}, {"", 0, false},
	} {
		v, ok := evalPython(c.eq)
		if ok != c.ok || ok && v.float() != c.want {
			t.Errorf("evalPython(%q) = %v, %v; want %g, %v", c.eq, v.float(), ok, c.want, c.ok)
		}
	}
}
