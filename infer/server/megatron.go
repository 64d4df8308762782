package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/tokenizer"
)

// megatronRequest is PUT /api's body: Megatron's text generation server
// (megatron/core/inference/text_generation_server/), keys and defaults as
// there.
type megatronRequest struct {
	Prompts                  []string `json:"prompts"`
	TokensToGenerate         *int     `json:"tokens_to_generate"`
	Logprobs                 bool     `json:"logprobs"`
	Temperature              *float64 `json:"temperature"`
	TopK                     *int     `json:"top_k"`
	TopP                     *float64 `json:"top_p"`
	TopPDecay                *float64 `json:"top_p_decay"`
	TopPBound                *float64 `json:"top_p_bound"`
	AddBOS                   bool     `json:"add_BOS"`
	StopOnDoubleEOL          bool     `json:"stop_on_double_eol"`
	StopOnEOL                bool     `json:"stop_on_eol"`
	PreventNewlineAfterColon bool     `json:"prevent_newline_after_colon"`
	RandomSeed               *int64   `json:"random_seed"`
	StopToken                *int     `json:"stop_token"`
	LengthPenalty            *float64 `json:"length_penalty"`
	NoLog                    bool     `json:"no_log"`
	// Legacy keys Megatron rejects.
	MaxLen    json.RawMessage `json:"max_len"`
	Sentences json.RawMessage `json:"sentences"`
	BeamWidth json.RawMessage `json:"beam_width"`
}

// megatronParams applies Megatron's checks; every failure is a 400, as there.
func (s *Server) megatronParams(q *megatronRequest) (n int, samp infer.Sampling, e *apiError) {
	bad := func(param, format string, args ...any) *apiError { return badRequest(param, format, args...) }
	switch {
	case q.MaxLen != nil:
		return 0, samp, bad("max_len", "max_len is no longer used. Replace with tokens_to_generate")
	case q.Sentences != nil:
		return 0, samp, bad("sentences", "sentences is no longer used. Replace with prompts")
	case q.BeamWidth != nil:
		return 0, samp, bad("beam_width", "beam search is not supported")
	case len(q.Prompts) == 0:
		return 0, samp, bad("prompts", "prompts argument required")
	case len(q.Prompts) > 128:
		return 0, samp, bad("prompts", "Maximum number of prompts is 128")
	case q.PreventNewlineAfterColon:
		return 0, samp, bad("prevent_newline_after_colon", "prevent_newline_after_colon is not supported")
	case q.TopPDecay != nil && *q.TopPDecay != 0, q.TopPBound != nil && *q.TopPBound != 0:
		return 0, samp, bad("top_p_decay", "top_p_decay and top_p_bound are not supported")
	}
	n = 64
	if q.TokensToGenerate != nil {
		n = *q.TokensToGenerate
	}
	if e := checkRange("tokens_to_generate", n, 0, math.MaxInt, "Megatron's bound"); e != nil {
		return 0, samp, e
	}
	if n == 0 && !q.Logprobs {
		return 0, samp, bad("tokens_to_generate", "tokens_to_generate=0 implies logprobs should be True")
	}
	samp.Temperature = 1
	if q.Temperature != nil {
		if t := *q.Temperature; !(t > 0 && t <= 100) {
			return 0, samp, bad("temperature", "temperature must be a positive number less than or equal to 100.0")
		}
		// A temperature that is 0 in float32 samples greedily (infer).
		samp.Temperature = *q.Temperature
	}
	if q.TopK != nil {
		if e := checkRange("top_k", *q.TopK, 0, 1000, "Megatron's bound"); e != nil {
			return 0, samp, e
		}
		samp.TopK = *q.TopK
	}
	if q.TopP != nil {
		if p := *q.TopP; p < 0 || p > 1 {
			return 0, samp, bad("top_p", "top_p must be a positive float less than or equal to 1.0")
		}
		samp.TopP = *q.TopP
	}
	if samp.TopP > 0 && samp.TopK > 0 {
		return 0, samp, bad("top_p", "cannot set both top-k and top-p samplings.")
	}
	if q.RandomSeed != nil {
		if err := checked.NonNegative("random_seed", *q.RandomSeed); err != nil {
			return 0, samp, bad("random_seed", "%v (Megatron's bound)", err)
		}
		samp.Seed = uint64(*q.RandomSeed)
	} else {
		s.mu.Lock()
		samp.Seed = s.rng.Uint64()
		s.mu.Unlock()
	}
	return n, samp, nil
}

func (s *Server) megatronStatus(w http.ResponseWriter, r *http.Request, start time.Time) int {
	var q megatronRequest
	fail := func(e *apiError) int { writeError(w, e); return e.Status }
	if e := s.decodeBody(w, r, &q); e != nil {
		return fail(e)
	}
	n, samp, e := s.megatronParams(&q)
	if e != nil {
		return fail(e)
	}
	stopTokens := s.eod
	if q.StopToken != nil {
		if e := checkRange("stop_token", *q.StopToken, 0, s.cfg.Tokenizer.VocabSize()-1, "the vocabulary"); e != nil {
			return fail(e)
		}
		stopTokens = []int{*q.StopToken}
	}
	var stop []string
	switch {
	case q.StopOnDoubleEOL:
		stop = []string{"\n\n"}
	case q.StopOnEOL:
		stop = []string{"\n"}
	}
	prompts := make([][]int32, len(q.Prompts))
	reqs := make([]infer.Request, len(q.Prompts))
	total := 0
	for i, text := range q.Prompts {
		p := s.encode(text)
		if q.AddBOS {
			bos := s.cfg.Tokenizer.EOD()
			if sp, ok := s.cfg.Tokenizer.(tokenizer.Specials); ok {
				if id, ok := sp.BOS(); ok {
					bos = id
				}
			}
			p = append([]int32{int32(bos)}, p...)
		}
		if len(p) == 0 {
			return fail(badRequest("prompts", "prompt %d is empty (set add_BOS to start from BOS)", i))
		}
		least := 1
		if q.Logprobs {
			least = 0
		}
		if e := s.checkPrompt("prompts", len(p), "tokens_to_generate", n, least); e != nil {
			return fail(e)
		}
		total += len(p)
		prompts[i] = p
		reqs[i] = infer.Request{Prompt: p, MaxTokens: n, Sampling: samp, StopTokens: stopTokens, Stop: stop,
			Logprobs: q.Logprobs, PromptLogprobs: q.Logprobs}
	}
	s.metrics.promptTokens.Add(int64(total))
	x := exchangeOf(r.Context())
	x.promptTokens = total
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, e := s.submit(ctx, reqs)
	if e != nil {
		return fail(e)
	}
	states, e := s.gather(ctx, ch, len(reqs), start)
	if e != nil {
		return fail(e)
	}
	out := map[string]any{}
	texts, segments, tokens := make([]string, len(reqs)), make([][]string, len(reqs)), make([][]int, len(reqs))
	var logprobs [][]float32
	for i, st := range states {
		x.completionTokens += st.completion
		ids := append(toInts(prompts[i]), st.tokens...)
		texts[i] = s.cfg.Tokenizer.Decode(toInts(prompts[i])) + st.text.String()
		tokens[i] = ids
		segments[i] = make([]string, len(ids))
		for j, id := range ids {
			segments[i][j] = s.tokenText(id)
		}
		if q.Logprobs {
			logprobs = append(logprobs, append(append([]float32{}, st.promptLP...), st.logprobs...))
		}
	}
	out["text"], out["segments"], out["tokens"] = texts, segments, tokens
	if q.Logprobs {
		out["logprobs"] = logprobs
	}
	writeJSON(w, out)
	return http.StatusOK
}
