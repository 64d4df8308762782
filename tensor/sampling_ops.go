package tensor

import "fmt"

// TokenSampling is one draw of SampleTokens: the logits row it reads, the
// rules that shape the distribution (Megatron's: temperature, then top-k
// or top-p), the uniform number that picks the token, and the
// log-probabilities wanted with it.
type TokenSampling struct {
	// Row is the logits row drawn from.
	Row int
	// Temperature divides the logits (> 0).
	Temperature float64
	// TopK keeps the k largest logits (0: off; 1: greedy argmax). It takes
	// precedence over TopP.
	TopK int
	// TopP keeps the smallest run of most probable tokens whose mass
	// reaches p (a token is dropped when the mass before it already
	// exceeds p·Σ, so the first always stays); 0: off.
	TopP float64
	// U, in (0, 1], picks the token: the first kept token, most probable
	// first (all tokens in id order without top-k or top-p), at which
	// U·Σp falls below the running sum. Greedy draws ignore it.
	U float32
	// Logprob asks for the drawn token's log-probability: the
	// log-softmax of the raw logits (before temperature) over the row's
	// vocabulary.
	Logprob bool
	// TopLogprobs asks for this many most likely tokens (by raw logit;
	// ties: lower id first) with their log-probabilities.
	TopLogprobs int
}

// SampledTokens receives SampleTokens' results, row i for draw i.
type SampledTokens struct {
	// IDs (draws) int32: the drawn tokens.
	IDs *Tensor
	// Logprobs (draws) float32: the drawn token's log-probability, for the
	// draws that ask (others are left as they are); nil when none asks.
	Logprobs *Tensor
	// TopIDs and TopLogprobs (draws, k) int32 and float32, k at least
	// every draw's TopLogprobs: a draw's first min(TopLogprobs, vocab)
	// entries, most likely first; nil when no draw asks.
	TopIDs, TopLogprobs *Tensor
}

// SampleTokens draws one token for each of draws from the first vocab
// columns of its row of logits (rows, V) and writes the results into out,
// whose tensors the caller reads back: the sampled ids are the only values
// a decode step must bring to the host. The arithmetic is float64 from the
// float32 logits, in a fixed order, so a draw is a function of the logits
// and U alone.
func SampleTokens(out SampledTokens, logits *Tensor, vocab int, draws []TokenSampling) {
	mustF32("SampleTokens", logits)
	if logits.NDim() != 2 || vocab < 1 || vocab > logits.Dim(1) {
		panic(fmt.Sprintf("tensor: SampleTokens: logits %v for a vocabulary of %d: want (rows, V ≥ vocab ≥ 1)", logits.shape, vocab))
	}
	n := len(draws)
	if out.IDs == nil || out.IDs.dtype != Int32 || !SameShape(out.IDs.shape, []int{n}) {
		panic(fmt.Sprintf("tensor: SampleTokens: ids %v for %d draws: want int32 (%d)", out.IDs, n, n))
	}
	topK := 0
	for i, d := range draws {
		switch {
		case d.Row < 0 || d.Row >= logits.Dim(0):
			panic(fmt.Sprintf("tensor: SampleTokens: draw %d reads row %d of %d", i, d.Row, logits.Dim(0)))
		case !(d.Temperature > 0) || d.TopK < 0 || !(d.TopP >= 0 && d.TopP <= 1) || d.TopLogprobs < 0:
			panic(fmt.Sprintf("tensor: SampleTokens: draw %d: temperature %g, top-k %d, top-p %g, top logprobs %d", i, d.Temperature, d.TopK, d.TopP, d.TopLogprobs))
		case d.Logprob && (out.Logprobs == nil || out.Logprobs.dtype != Float32 || !SameShape(out.Logprobs.shape, []int{n})):
			panic(fmt.Sprintf("tensor: SampleTokens: draw %d asks for its logprob; logprobs %v, want float32 (%d)", i, out.Logprobs, n))
		}
		topK = max(topK, d.TopLogprobs)
	}
	if topK > 0 {
		ti, tl := out.TopIDs, out.TopLogprobs
		if ti == nil || tl == nil || ti.dtype != Int32 || tl.dtype != Float32 || ti.NDim() != 2 || !SameShape(ti.shape, tl.shape) || ti.Dim(0) != n || ti.Dim(1) < topK {
			panic(fmt.Sprintf("tensor: SampleTokens: top logprobs %v and %v: want int32 and float32 (%d, ≥ %d)", ti, tl, n, topK))
		}
		mustContiguous("SampleTokens", ti, tl)
	}
	mustContiguous("SampleTokens", logits, out.IDs)
	if out.Logprobs != nil {
		mustContiguous("SampleTokens", out.Logprobs)
	}
	backendFor(logits).SampleTokens(out, logits, vocab, draws)
}

// TokenLogprobs sets out[i] (float32, n) to the log-probability of token
// targets[i] (int32, n) under row i of logits (n, V) restricted to its
// first vocab columns: the log-softmax in float64, rounded once.
func TokenLogprobs(out, logits, targets *Tensor, vocab int) {
	mustF32("TokenLogprobs", out, logits)
	if logits.NDim() != 2 || vocab < 1 || vocab > logits.Dim(1) {
		panic(fmt.Sprintf("tensor: TokenLogprobs: logits %v for a vocabulary of %d: want (rows, V ≥ vocab ≥ 1)", logits.shape, vocab))
	}
	n := logits.Dim(0)
	if targets.dtype != Int32 || !SameShape(targets.shape, []int{n}) || !SameShape(out.shape, []int{n}) {
		panic(fmt.Sprintf("tensor: TokenLogprobs: targets %v and out %v for %d rows: want int32 and float32 (%d)", targets, out, n, n))
	}
	mustContiguous("TokenLogprobs", out, logits, targets)
	backendFor(out, logits, targets).TokenLogprobs(out, logits, targets, vocab)
}
