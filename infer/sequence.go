package infer

import (
	"math"
	"slices"
	"strings"
)

// promptLogprobChunk bounds the prefill chunk of a sequence whose prompt
// log-probabilities are wanted: each of its tokens needs a logits row.
const promptLogprobChunk = 64

// sequence is one request's state inside the engine.
type sequence struct {
	id       SeqID
	req      Request
	tokens   []int32 // prompt, then generated tokens
	nPrompt  int
	computed int     // positions whose keys and values are in the pool
	table    []int32 // block table: block ids in position order
	keys     []uint64
	sampler  *Sampler
	// generated counts sampled tokens; admitted is set at the first
	// admission, emitted after the first event.
	generated         int
	admitted, emitted bool
	// Text: stream decodes, text holds the generated text, sent how much
	// of it was emitted (the rest may begin a stop string).
	stream   *TextStream
	text     string
	sent     int
	promptLP []float32 // PromptLogprobs: entry i is for prompt token i+1
	lpDone   int       // prompt positions whose logits were seen
}

func newSequence(id SeqID, r Request, dec Decoder) (*sequence, error) {
	sm, err := NewSampler(r.Sampling)
	if err != nil {
		return nil, err
	}
	s := &sequence{id: id, req: r, nPrompt: len(r.Prompt), sampler: sm}
	s.tokens = make([]int32, len(r.Prompt), len(r.Prompt)+r.MaxTokens)
	copy(s.tokens, r.Prompt)
	if dec != nil {
		ids := make([]int, len(r.Prompt))
		for i, t := range r.Prompt {
			ids[i] = int(t)
		}
		s.stream = NewTextStream(dec, ids)
	}
	if r.PromptLogprobs {
		s.promptLP = make([]float32, len(r.Prompt)-1)
	}
	return s, nil
}

// wantsPromptLogprobs reports whether prompt log-probabilities are pending.
func (s *sequence) wantsPromptLogprobs() bool {
	return s.req.PromptLogprobs && s.lpDone < s.nPrompt-1
}

// chunk is how many tokens s runs next within budget.
func (s *sequence) chunk(budget int) int {
	n := min(len(s.tokens)-s.computed, budget)
	if s.wantsPromptLogprobs() {
		n = min(n, promptLogprobChunk)
	}
	return n
}

// addPromptLogprobs records the log-probabilities of the prompt tokens
// following positions pos0, pos0+1, ... given their logits rows (V wide,
// the first vocab entries real).
func (s *sequence) addPromptLogprobs(pos0 int, rows []float32, V, vocab int) {
	for j := range len(rows) / V {
		pos := pos0 + j
		if pos+1 >= s.nPrompt {
			break
		}
		row := rows[j*V : j*V+vocab]
		s.promptLP[pos] = float32(float64(row[s.tokens[pos+1]]) - logSumExp(row))
		s.lpDone = max(s.lpDone, pos+1)
	}
}

// draw picks the next token from logits with the sequence's sampler and
// computes its log-probabilities, touching nothing else of the sequence:
// the draws of a step's sequences can run in parallel.
func (s *sequence) draw(logits []float32) Event {
	id := s.sampler.Sample(logits)
	ev := Event{Token: id}
	if s.req.Logprobs || s.req.TopLogprobs > 0 {
		lse := logSumExp(logits)
		ev.Logprob = float32(float64(logits[id]) - lse)
		if s.req.TopLogprobs > 0 {
			ev.TopLogprobs = topLogprobs(logits, s.req.TopLogprobs, lse)
		}
	}
	return ev
}

// take appends the token ev drew and returns ev, finished when a stop
// token, a stop string or MaxTokens ends the sequence.
func (s *sequence) take(ev Event) Event {
	id := ev.Token
	s.tokens = append(s.tokens, int32(id))
	s.generated++
	if slices.Contains(s.req.StopTokens, id) {
		ev.Text, ev.Finish = s.flush(), FinishStop
		return ev
	}
	if s.stream != nil {
		var stopped bool
		ev.Text, stopped = s.addText(s.stream.Add(id))
		if stopped {
			ev.Finish = FinishStop
			return ev
		}
	}
	if s.generated >= s.req.MaxTokens {
		ev.Text += s.flush()
		ev.Finish = FinishLength
	}
	return ev
}

// addText appends new generated text and returns what can be emitted: up
// to the first stop string (then stopped is true), else all but a tail
// that may begin one.
func (s *sequence) addText(t string) (out string, stopped bool) {
	s.text += t
	if len(s.req.Stop) == 0 {
		return s.flush(), false
	}
	pending := s.text[s.sent:]
	first := -1
	for _, st := range s.req.Stop {
		if i := strings.Index(pending, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		out = pending[:first]
		s.text = s.text[:s.sent+first]
		s.sent = len(s.text)
		return out, true
	}
	hold := 0
	for _, st := range s.req.Stop {
		for k := min(len(st)-1, len(pending)); k > hold; k-- {
			if strings.HasSuffix(pending, st[:k]) {
				hold = k
				break
			}
		}
	}
	out = pending[:len(pending)-hold]
	s.sent += len(out)
	return out, false
}

// flush returns the text not yet emitted.
func (s *sequence) flush() string {
	out := s.text[s.sent:]
	s.sent = len(s.text)
	return out
}

// logSumExp is log Σ exp(x), in float64.
func logSumExp(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(sum)
}

// topLogprobs returns the k largest logits' tokens, most likely first
// (ties: lower id first), with their log-probabilities.
func topLogprobs(x []float32, k int, lse float64) []TokenLogprob {
	k = min(k, len(x))
	top := make([]TokenLogprob, 0, k+1)
	for id, v := range x {
		if len(top) == k && v <= top[k-1].Logprob {
			continue
		}
		i := len(top)
		for i > 0 && top[i-1].Logprob < v {
			i--
		}
		top = slices.Insert(top, i, TokenLogprob{Token: id, Logprob: v})
		if len(top) > k {
			top = top[:k]
		}
	}
	for i := range top {
		top[i].Logprob = float32(float64(top[i].Logprob) - lse)
	}
	return top
}
