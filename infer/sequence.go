package infer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
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
	computed int           // positions whose keys and values are in the pool
	table    []int32       // block table: block ids in position order
	state    *gpt.GDNState // gated delta net layers' state while running (nil: none)
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
	// promptTop: PromptTopLogprobs, entry i for prompt token i+1.
	promptTop [][]TokenLogprob
	json      *jsonObject // JSONObject: the object generated so far
	lpDone    int         // prompt positions whose logits were seen
}

// newSequence returns r's state; its tokens may not exceed limit (the
// engine's context).
func newSequence(id SeqID, r Request, dec Decoder, limit int) (*sequence, error) {
	sm, err := NewSampler(r.Sampling)
	if err != nil {
		return nil, err
	}
	// Engine.Validate bounds the length by the context; checked again here,
	// where a wrapped or huge sum would make the allocation below panic.
	n, ok := checked.AddInt(len(r.Prompt), r.MaxTokens)
	if !ok || r.MaxTokens < 0 || n > limit {
		return nil, fmt.Errorf("%w: %d prompt tokens + %d new tokens: want at most %d in all", ErrContextLength, len(r.Prompt), r.MaxTokens, limit)
	}
	s := &sequence{id: id, req: r, nPrompt: len(r.Prompt), sampler: sm}
	s.tokens = make([]int32, len(r.Prompt), n)
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
		if r.PromptTopLogprobs && r.TopLogprobs > 0 {
			s.promptTop = make([][]TokenLogprob, len(r.Prompt)-1)
		}
	}
	if r.JSONObject {
		s.json = &jsonObject{}
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
// following positions pos0, pos0+1, ... given their logits rows (rows, V)
// on the model's device, the first vocab entries of a row real.
func (s *sequence) addPromptLogprobs(pos0 int, rows *tensor.Tensor, vocab int) {
	m := min(rows.Dim(0), s.nPrompt-1-pos0) // the rows followed by a prompt token
	if m <= 0 {
		return
	}
	var view *tensor.Tape
	rows = view.Narrow(rows, 0, 0, m)
	dev := rows.Device()
	out := tensor.FromFloat32(s.promptLP[pos0:pos0+m], m)
	targets := tensor.FromInt32(s.tokens[pos0+1:pos0+1+m], m).ToDevice(dev)
	if dev == tensor.CPU {
		tensor.TokenLogprobs(out, rows, targets, vocab)
	} else { // computed where the logits are, read back
		d := tensor.NewOn(dev, tensor.Float32, m)
		tensor.TokenLogprobs(d, rows, targets, vocab)
		tensor.Copy(out, d)
	}
	if s.promptTop != nil {
		s.addPromptTop(pos0, rows, vocab)
	}
	s.lpDone = max(s.lpDone, pos0+m)
}

// addPromptTop records the most likely tokens of rows (the prompt
// positions from pos0) with the arithmetic of the generated tokens' top
// log-probabilities: one greedy tensor.SampleTokens draw per row.
func (s *sequence) addPromptTop(pos0 int, rows *tensor.Tensor, vocab int) {
	m, k := rows.Dim(0), min(s.req.TopLogprobs, vocab)
	draws := make([]tensor.TokenSampling, m)
	for j := range draws {
		draws[j] = tensor.TokenSampling{Row: j, Temperature: 1, TopK: 1, TopLogprobs: k}
	}
	out := tensor.SampledTokens{IDs: tensor.FromInt32(make([]int32, m), m), Logprobs: tensor.FromFloat32(make([]float32, m), m),
		TopIDs: tensor.FromInt32(make([]int32, m*k), m, k), TopLogprobs: tensor.FromFloat32(make([]float32, m*k), m, k)}
	sampleOn(rows.Device(), out, rows, vocab, draws)
	ids, lps := out.TopIDs.Int32s(), out.TopLogprobs.Float32s()
	for j := range m {
		top := make([]TokenLogprob, k)
		for t := range top {
			top[t] = TokenLogprob{Token: int(ids[j*k+t]), Logprob: lps[j*k+t]}
		}
		s.promptTop[pos0+j] = top
	}
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
	if s.json != nil && s.json.done {
		ev.Text += s.flush()
		ev.Finish = FinishStop
		return ev
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
