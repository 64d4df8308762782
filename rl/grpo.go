// Package rl is Megatron's RL training step (train_rl.py, megatron/rl):
// GRPO's group-relative advantages and clipped policy loss, the countdown
// environment's reward, and the rollout collection the train loop runs
// before an iteration (Collector, collect.go) with gotron's own inference
// engine on the current weights.
//
// The math follows megatron/rl/rl_utils.py at Megatron d98e8a6
// (calculate_grpo_advantages, calculate_grpo_loss) and train_rl.py's
// loss_func; rl/testdata/grpo_golden.json holds the numbers Megatron's own
// functions give (tools/golden/grpo.py runs them).
package rl

import (
	"errors"
	"fmt"
	"math"
)

// Advantages is Megatron's calculate_grpo_advantages: rewards and numTurns
// have one row per group, one entry per rollout; a rollout's advantage is
// its reward less its group's mean, over the group's standard deviation
// (population, over the rollouts with turns) plus 1e-4. Zero-turn rollouts
// (placeholders for failed episodes) are left out of the statistics and get
// 0. The result is flat, group-major. Every group must have the same size.
func Advantages(rewards [][]float64, numTurns [][]int) ([]float64, error) {
	if len(rewards) != len(numTurns) {
		return nil, fmt.Errorf("rl: %d groups of rewards but %d of turns", len(rewards), len(numTurns))
	}
	var out []float64
	for g, rs := range rewards {
		if len(rs) != len(numTurns[g]) || len(rs) != len(rewards[0]) {
			return nil, fmt.Errorf("rl: group %d has %d rewards and %d turn counts, want %d of each (every group the same size)", g, len(rs), len(numTurns[g]), len(rewards[0]))
		}
		// numpy's sums over a row of a group's size are sequential.
		var sum float64
		count := 0
		for i, r := range rs {
			if numTurns[g][i] > 0 {
				sum += r
				count++
			}
		}
		count = max(count, 1)
		mean := sum / float64(count)
		var sq float64
		for i, r := range rs {
			if numTurns[g][i] > 0 {
				sq += (r - mean) * (r - mean)
			}
		}
		std := math.Sqrt(sq / float64(count))
		for i, r := range rs {
			a := (r - mean) / (1e-4 + std)
			if numTurns[g][i] <= 0 {
				a = 0
			}
			out = append(out, a)
		}
	}
	return out, nil
}

// LossConfig is GRPO's loss: --grpo-clamp-eps-lower/-upper, --grpo-kl-beta,
// --grpo-entropy-term-weight and the importance-sampling correction with
// inference log-probabilities (--rl-inference-logprobs-is-correction,
// --rl-importance-sampling-truncation-coef).
type LossConfig struct {
	ClampEpsLower, ClampEpsUpper float64
	KLBeta                       float64
	EntropyWeight                float64
	// ISCorrection weighs each token by exp(old − inference) log-probability,
	// at most ISTruncation when that is set (> 0).
	ISCorrection bool
	ISTruncation float64
}

// Validate rejects what makes the loss meaningless.
func (c LossConfig) Validate() error {
	for _, v := range []struct {
		name string
		v    float64
	}{{"--grpo-clamp-eps-lower", c.ClampEpsLower}, {"--grpo-clamp-eps-upper", c.ClampEpsUpper},
		{"--grpo-kl-beta", c.KLBeta}, {"--grpo-entropy-term-weight", c.EntropyWeight},
		{"--rl-importance-sampling-truncation-coef", c.ISTruncation}} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) {
			return fmt.Errorf("rl: %s=%g: want a finite number", v.name, v.v)
		}
	}
	if c.ClampEpsLower < 0 || c.ClampEpsUpper < 0 {
		return fmt.Errorf("rl: --grpo-clamp-eps-lower=%g, --grpo-clamp-eps-upper=%g: want >= 0", c.ClampEpsLower, c.ClampEpsUpper)
	}
	if c.ISTruncation < 0 {
		return fmt.Errorf("rl: --rl-importance-sampling-truncation-coef=%g: want > 0", c.ISTruncation)
	}
	return nil
}

// Token is one token's inputs to the loss: the current policy's
// log-probability (Current), the policy's at rollout time (Old, π_old), the
// reference model's (Ref), the inference engine's (Inference, read with
// ISCorrection) and the rollout's advantage.
type Token struct {
	Current, Old, Ref, Inference, Advantage float64
}

// TokenLoss is calculate_grpo_loss for one token:
//
//	−w·min(r·A, clamp(r, 1−εl, 1+εu)·A) + β·(e^(ref−cur) − (ref−cur) − 1) − λ·(−e^cur·cur)
//
// with r = e^(cur−old) and w the importance weight (1 without correction).
// It returns the loss and its derivative by the current log-probability as
// torch's autograd gives it (min's tie and clamp's bounds pass the gradient
// to the ratio), and the ratio, KL and entropy terms Megatron logs.
func (c LossConfig) TokenLoss(t Token) (loss, grad, ratio, kl, entropy float64) {
	ratio = math.Exp(t.Current - t.Old)
	clamped := math.Min(math.Max(ratio, 1-c.ClampEpsLower), 1+c.ClampEpsUpper)
	w := 1.0
	if c.ISCorrection {
		w = math.Exp(t.Old - t.Inference)
		if c.ISTruncation > 0 {
			w = math.Min(w, c.ISTruncation)
		}
	}
	a := t.Advantage
	surrogate, dSurrogate := ratio*a, ratio*a // d(r·A)/dcur = r·A
	if clamped*a < ratio*a {
		// torch.min takes the clamped branch, whose gradient is zero
		// outside the clamp (inside it the two are equal: a tie).
		surrogate, dSurrogate = clamped*a, 0
	}
	refDiff := t.Ref - t.Current
	kl = math.Exp(refDiff) - refDiff - 1
	p := math.Exp(t.Current)
	entropy = -p * t.Current
	loss = -w*surrogate + c.KLBeta*kl - c.EntropyWeight*entropy
	grad = -w*dSurrogate + c.KLBeta*(1-math.Exp(refDiff)) + c.EntropyWeight*p*(t.Current+1)
	return loss, grad, ratio, kl, entropy
}

// Stats are the sums over loss tokens train_rl.loss_func reports
// (rl/kl_term, rl/pi_over_pi_old, rl/entropy_term per token: divide by Tokens).
type Stats struct {
	Loss, KL, Ratio, Entropy float64
	Tokens                   float64
}

// MicroBatchLoss is train_rl.loss_func over one micro-batch: the sum of the
// masked per-token losses, the micro-batch's token count (Σ mask, or 1 when
// it has none: Megatron's guard against an empty bin) and, in grads, each
// token's d(loss sum)/d(current log-probability) (zero where masked).
// tokens, mask and grads have the same length.
func (c LossConfig) MicroBatchLoss(tokens []Token, mask []float64, grads []float64) (Stats, error) {
	if len(tokens) != len(mask) || len(grads) != len(mask) {
		return Stats{}, errors.New("rl: MicroBatchLoss: tokens, mask and grads differ in length")
	}
	var s Stats
	for i, t := range tokens {
		grads[i] = 0
		if mask[i] == 0 {
			continue
		}
		loss, g, r, kl, ent := c.TokenLoss(t)
		s.Loss += mask[i] * loss
		s.KL += mask[i] * kl
		s.Ratio += mask[i] * r
		s.Entropy += mask[i] * ent
		s.Tokens += mask[i]
		grads[i] = mask[i] * g
	}
	if s.Tokens == 0 {
		s.Tokens = 1
	}
	return s, nil
}
