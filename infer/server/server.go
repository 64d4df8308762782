// Package server serves an infer.Runner over HTTP: the OpenAI-compatible
// API (POST /v1/completions and /v1/chat/completions, streamed as
// server-sent events; GET /v1/models), Megatron's text-generation API (PUT
// /api), GET /health and Prometheus GET /metrics. Requests are validated
// into infer.Requests, so bad input gets an OpenAI-shaped JSON error (400,
// 404, 405, 408, 413, 429) and never reaches the engine; a client that
// disconnects, or stops reading, cancels its sequences. Every integer of a
// request is range-checked (internal/checked) before arithmetic.
//
// The package owns no goroutine: the caller runs the Runner and an
// http.Server with Handler, over a listener that LimitConnections may
// bound (gotron serve does all three).
package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/tokenizer"
)

// Config configures a Server. Runner and Tokenizer are required; every
// other field's zero value is usable.
type Config struct {
	// Runner runs the engine; the caller starts its Run.
	Runner *infer.Runner
	// Tokenizer encodes prompts and decodes output; its EOD (and EOS,
	// when it has one) end generation unless a request sets ignore_eos.
	Tokenizer tokenizer.Tokenizer
	// ModelName is the id /v1/models lists and requests must name; ""
	// means "gotron". A request without "model" gets this one.
	ModelName string
	// ChatTemplate renders chat messages; nil means PlainTemplate.
	ChatTemplate *ChatTemplate
	// MaxRequestBytes bounds request bodies (413 beyond); 0 means 1 MiB.
	MaxRequestBytes int64
	// MaxPromptTokens bounds prompts (413 beyond); 0 means the engine's
	// context (Engine.MaxTokens).
	MaxPromptTokens int
	// MaxN bounds "n" and the prompts of one request; 0 means 16.
	MaxN int
	// MaxWaitingSeqs bounds the sequences submitted beyond what the
	// engine runs at once (EngineConfig.MaxNumSeqs): a request that would
	// queue more gets 429 (code queue_full, Retry-After: 1). 0: no bound.
	MaxWaitingSeqs int
	// ReadTimeout bounds the arrival of a request's body, from the end of
	// its headers (which the http.Server's ReadHeaderTimeout bounds): a
	// client still sending after it gets 408 and its connection is closed.
	// 0: no bound. (http.Server.ReadTimeout would do it too, but its
	// deadline also ends the connection's background read, which cancels a
	// long streamed answer.)
	ReadTimeout time.Duration
	// WriteTimeout bounds each write of an answer (a whole JSON answer, one
	// streamed event): a client that stops reading is cut off and its
	// sequences cancelled. 0: no bound. (http.Server.WriteTimeout would
	// bound the whole answer, a long stream's too.)
	WriteTimeout time.Duration
	// Log receives one access line per request (client, method and path,
	// status, duration, prompt and completion tokens) and warnings (fields
	// ignored); nil: no log.
	Log *log.Logger
	// Now is the clock for "created" and the latency metrics; nil means
	// time.Now.
	Now func() time.Time
}

// Server is the HTTP API over one model. Safe for concurrent use.
type Server struct {
	cfg      Config
	eod      []int // stop tokens
	maxCtx   int   // engine context: prompt + new tokens
	maxSeqs  int64 // sequences admitted at once: MaxNumSeqs + MaxWaitingSeqs (0: no bound)
	inflight atomic.Int64
	metrics  *metrics
	draining atomic.Bool

	mu  sync.Mutex // protects rng
	rng *rand.Rand
	ids atomic.Uint64
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Runner == nil:
		return nil, fmt.Errorf("server: Config.Runner is nil")
	case cfg.Tokenizer == nil:
		return nil, fmt.Errorf("server: Config.Tokenizer is nil")
	case cfg.MaxRequestBytes < 0, cfg.MaxPromptTokens < 0, cfg.MaxN < 0, cfg.MaxWaitingSeqs < 0, cfg.ReadTimeout < 0, cfg.WriteTimeout < 0:
		return nil, fmt.Errorf("server: negative limit in %+v", cfg)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "gotron"
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = 1 << 20
	}
	maxCtx := cfg.Runner.Engine().MaxTokens()
	if cfg.MaxPromptTokens == 0 || cfg.MaxPromptTokens > maxCtx {
		cfg.MaxPromptTokens = maxCtx
	}
	if cfg.MaxN == 0 {
		cfg.MaxN = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, maxCtx: maxCtx, metrics: newMetrics(), rng: rand.New(rand.NewPCG(uint64(cfg.Now().UnixNano()), 0x9e3779b97f4a7c15))}
	if cfg.MaxWaitingSeqs > 0 {
		s.maxSeqs = int64(cfg.Runner.Engine().Config().MaxNumSeqs + cfg.MaxWaitingSeqs)
	}
	s.eod = []int{cfg.Tokenizer.EOD()}
	if sp, ok := cfg.Tokenizer.(tokenizer.Specials); ok {
		if id, ok := sp.EOS(); ok && id != s.eod[0] {
			s.eod = append(s.eod, id)
		}
	}
	return s, nil
}

// Handler returns the routes. Unknown paths get a JSON 404, wrong methods
// a JSON 405.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(path, method string, h func(http.ResponseWriter, *http.Request)) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
				w.Header().Set("Allow", method)
				writeError(w, errorf(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "", "%s %s: use %s", r.Method, path, method))
				return
			}
			h(w, r)
		})
	}
	route("/v1/completions", http.MethodPost, s.counted("completions", s.completionsStatus))
	route("/v1/chat/completions", http.MethodPost, s.counted("chat_completions", s.chatStatus))
	route("/v1/models", http.MethodGet, s.models)
	route("/api", http.MethodPut, s.counted("api", s.megatronStatus))
	route("/health", http.MethodGet, s.health)
	route("/v1/health", http.MethodGet, s.health)
	route("/metrics", http.MethodGet, s.metricsHandler)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(http.StatusNotFound, "invalid_request_error", "not_found", "", "no route %s %s", r.Method, r.URL.Path))
	})
	return s.serveHTTP(mux)
}

// counted is the handler of a generating endpoint: serve answers the
// request (started at the server clock's now) and returns the status it
// wrote, which the metrics count under name and the exchange log records.
func (s *Server) counted(name string, serve func(http.ResponseWriter, *http.Request, time.Time) int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		status := serve(w, r, s.cfg.Now())
		s.metrics.request(name, status)
		exchangeOf(r.Context()).status = status
	}
}

// ModelName is the model id the API serves.
func (s *Server) ModelName() string { return s.cfg.ModelName }

// Drain marks the server as shutting down: /health answers 503 so load
// balancers stop sending; requests in flight go on.
func (s *Server) Drain() { s.draining.Store(true) }

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"status":"draining"}`)
		return
	}
	fmt.Fprintln(w, `{"status":"ok"}`)
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": s.cfg.ModelName, "object": "model", "created": s.cfg.Now().Unix(), "owned_by": "gotron",
		"max_model_len": s.maxCtx,
	}}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// checkModel accepts "" (the served model) and the served name.
func (s *Server) checkModel(name string) *apiError {
	if name == "" || name == s.cfg.ModelName {
		return nil
	}
	return errorf(http.StatusNotFound, "invalid_request_error", "model_not_found", "model", "the model %q does not exist: this server serves %q", name, s.cfg.ModelName)
}

// newID returns a request id with prefix ("cmpl", "chatcmpl").
func (s *Server) newID(prefix string) string {
	s.mu.Lock()
	r := s.rng.Uint64()
	s.mu.Unlock()
	return fmt.Sprintf("%s-%016x%04x", prefix, r, s.ids.Add(1)&0xffff)
}

// samplingParams are the OpenAI sampling fields.
type samplingParams struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        *int     `json:"top_k"` // vLLM's extension; -1 or 0: off
	Seed        *int64   `json:"seed"`
	N           *int     `json:"n"`
	// Accepted at their neutral values only.
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	IgnoreEOS        bool               `json:"ignore_eos"`     // vLLM's extension
	StopTokenIDs     []int              `json:"stop_token_ids"` // vLLM's extension
	ResponseFormat   json.RawMessage    `json:"response_format"`
}

// jsonObject reads response_format: absent, null or {"type": "text"} is
// free text; {"type": "json_object"} is one JSON object, which the engine
// enforces token by token (infer.Request.JSONObject); json_schema is
// refused, as its schema would not be enforced.
func (s *Server) jsonObject(p *samplingParams) (bool, *apiError) {
	if len(p.ResponseFormat) == 0 || string(p.ResponseFormat) == "null" {
		return false, nil
	}
	var rf struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(p.ResponseFormat, &rf); err != nil {
		return false, badRequest("response_format", "response_format: want an object with a \"type\"")
	}
	switch rf.Type {
	case "text":
		return false, nil
	case "json_object":
		if err := s.cfg.Runner.Engine().CheckJSONOutput(); err != nil {
			return false, invalidValue("response_format", "response_format: json_object: %v", err)
		}
		return true, nil
	case "json_schema":
		return false, invalidValue("response_format", "response_format: json_schema is not supported: gotron serve constrains output to a JSON object (json_object) but does not enforce a schema, and ignoring it would return JSON that does not follow it")
	}
	return false, invalidValue("response_format", "response_format: type %q: want text, json_object (or json_schema, not supported)", rf.Type)
}

// sampling maps the OpenAI fields to Megatron's rules: temperature 0 is
// greedy (top-k 1), and so is a positive temperature that is 0 in float32
// (infer.IsGreedyTemperature); top_p 1 is off; top_k with top_p < 1 is an
// error, as in Megatron. Every field is checked whether or not greedy
// decoding makes it moot. Choice i of n gets seed+i (a random seed when
// none is set).
func (s *Server) sampling(p *samplingParams) ([]infer.Sampling, *apiError) {
	n := 1
	if p.N != nil {
		n = *p.N
	}
	if e := checkRange("n", n, 1, s.cfg.MaxN, "--max-n"); e != nil {
		return nil, e
	}
	for name, v := range map[string]*float64{"presence_penalty": p.PresencePenalty, "frequency_penalty": p.FrequencyPenalty} {
		if v != nil && *v != 0 {
			return nil, invalidValue(name, "%s=%g: only 0 is supported", name, *v)
		}
	}
	if len(p.LogitBias) > 0 {
		return nil, invalidValue("logit_bias", "logit_bias is not supported")
	}
	temp := 1.0
	if p.Temperature != nil {
		temp = *p.Temperature
	}
	if !(temp >= 0 && temp <= 2) {
		return nil, invalidValue("temperature", "temperature: %g is out of range: must be between 0 and 2", temp)
	}
	topP := 1.0
	if p.TopP != nil {
		topP = *p.TopP
	}
	if !(topP > 0 && topP <= 1) {
		return nil, invalidValue("top_p", "top_p: %g is out of range: must be > 0 and <= 1", topP)
	}
	topK := -1
	if p.TopK != nil {
		topK = *p.TopK
	}
	if e := checkRange("top_k", topK, -1, math.MaxInt, "-1 or 0: off, 1: greedy"); e != nil {
		return nil, e
	}
	var base infer.Sampling
	switch {
	case temp == 0 || infer.IsGreedyTemperature(temp):
		base.TopK = 1
	case topK > 1 && topP < 1:
		return nil, invalidValue("top_k", "top_k and top_p < 1 cannot both be set (Megatron's rule)")
	default:
		base.Temperature = temp
		if topP < 1 {
			base.TopP = topP
		}
		if topK > 0 {
			base.TopK = topK
		}
	}
	var seed uint64
	if p.Seed != nil {
		seed = uint64(*p.Seed)
	} else {
		s.mu.Lock()
		seed = s.rng.Uint64()
		s.mu.Unlock()
	}
	out := make([]infer.Sampling, n)
	for i := range out {
		out[i] = base
		out[i].Seed = seed + uint64(i)
	}
	return out, nil
}

// stopTokens returns the ids that end generation: the tokenizer's end of
// document (and EOS) unless ignoreEOS, and extra (stop_token_ids), each
// checked against the vocabulary.
func (s *Server) stopTokens(ignoreEOS bool, extra []int) ([]int, *apiError) {
	if e := checkRange("stop_token_ids", len(extra), 0, 16, "its length"); e != nil {
		return nil, e
	}
	var out []int
	if !ignoreEOS {
		out = append(out, s.eod...)
	}
	vocab := s.cfg.Tokenizer.VocabSize()
	for i, id := range extra {
		if e := checkRange(fmt.Sprintf("stop_token_ids[%d]", i), id, 0, vocab-1, "the vocabulary"); e != nil {
			return nil, e
		}
		out = append(out, id)
	}
	return out, nil
}

// stopStrings parses "stop": null, a string or an array of strings.
func stopStrings(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		raw = json.RawMessage(`[` + string(raw) + `]`)
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("stop", "stop: want a string or an array of strings")
	}
	if len(list) > 16 {
		return nil, invalidValue("stop", "%d stop strings: want at most 16", len(list))
	}
	for _, st := range list {
		if st == "" {
			return nil, invalidValue("stop", "empty stop string")
		}
	}
	return list, nil
}

// encode tokenizes text into engine ids.
func (s *Server) encode(text string) []int32 {
	ids := s.cfg.Tokenizer.Encode(text)
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// checkPrompt bounds a prompt's length (413 beyond --max-prompt-tokens) and
// the new tokens asked for, param's maxTokens: at least least and at most
// what the context leaves after the prompt (400, context_length_exceeded
// beyond). Both are checked before their sum is made.
func (s *Server) checkPrompt(promptParam string, n int, param string, maxTokens, least int) *apiError {
	if n > s.cfg.MaxPromptTokens {
		return errorf(http.StatusRequestEntityTooLarge, "invalid_request_error", "prompt_too_long", promptParam, "prompt of %d tokens exceeds the limit of %d (--max-prompt-tokens)", n, s.cfg.MaxPromptTokens)
	}
	if maxTokens < least {
		return checkRange(param, maxTokens, least, math.MaxInt, "")
	}
	room := s.maxCtx - n // both within the context: no overflow
	why := fmt.Sprintf("this model's maximum context length is %d tokens and the prompt has %d", s.maxCtx, n)
	if room < least {
		return errorf(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", promptParam, "%s: no room for %d new tokens", why, least)
	}
	if e := checkRange(param, maxTokens, least, room, why); e != nil {
		e.Code = ptr("context_length_exceeded")
		return e
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// choiceEvent is one event of choice i.
type choiceEvent struct {
	i   int
	ev  infer.Event
	err error
	at  time.Time
}

// submit starts one sequence per request and merges their events into one
// channel (one forwarding goroutine per sequence, ending with it or ctx).
// On error every sequence already started is cancelled.
//
// With MaxWaitingSeqs set, a request whose sequences would exceed the
// engine's batch and that queue gets 429.
func (s *Server) submit(ctx context.Context, reqs []infer.Request) (<-chan choiceEvent, *apiError) {
	n := int64(len(reqs))
	if now := s.inflight.Add(n); s.maxSeqs > 0 && now > s.maxSeqs {
		s.inflight.Add(-n)
		return nil, errorf(http.StatusTooManyRequests, "rate_limit_error", "queue_full", "",
			"the server's queue is full: %d sequences running or waiting (--max-num-seqs + --max-waiting-seqs); retry later", s.maxSeqs)
	}
	streams := make([]*infer.Stream, len(reqs))
	for i, r := range reqs {
		st, err := s.cfg.Runner.Submit(ctx, r)
		if err != nil {
			for _, prev := range streams[:i] {
				prev.Cancel()
			}
			s.inflight.Add(-n)
			return nil, engineError(err, "")
		}
		streams[i] = st
	}
	ch := make(chan choiceEvent, 4*len(reqs))
	for i, st := range streams {
		go func() {
			defer s.inflight.Add(-1)
			for {
				ev, err := st.Next(ctx)
				if err != nil && ctx.Err() != nil {
					return // the handler is gone
				}
				if ev.Finish == infer.FinishAbort {
					// Why: ErrClosed (shutdown) or a failed step, the
					// stream's error after its final event.
					if _, why := st.Next(ctx); why != nil && why != io.EOF {
						err = why
					} else {
						err = infer.ErrClosed
					}
				}
				select {
				case ch <- choiceEvent{i: i, ev: ev, err: err, at: s.cfg.Now()}:
				case <-ctx.Done():
					return
				}
				if err != nil || ev.Finish != "" {
					return
				}
			}
		}()
	}
	return ch, nil
}

// choiceState accumulates one choice's output.
type choiceState struct {
	text       strings.Builder
	tokens     []int
	logprobs   []float32
	top        [][]infer.TokenLogprob
	promptLP   []float32
	finish     infer.FinishReason
	completion int
	last       time.Time
	done       bool
}

// observe records an event's latency metrics (the first token of a request
// is its time to first token; later ones are inter-token gaps).
func (s *Server) observe(start time.Time, first *bool, c *choiceState, ce choiceEvent) {
	if ce.ev.Token < 0 {
		return
	}
	if !*first {
		*first = true
		s.metrics.ttft.observe(ce.at.Sub(start).Seconds())
	} else if !c.last.IsZero() {
		s.metrics.itl.observe(ce.at.Sub(c.last).Seconds())
	}
	c.last = ce.at
	s.metrics.generationTokens.Add(1)
}

// add folds an event into the choice.
func (c *choiceState) add(ev infer.Event) {
	c.text.WriteString(ev.Text)
	if ev.PromptLogprobs != nil {
		c.promptLP = ev.PromptLogprobs
	}
	if ev.Token >= 0 {
		c.tokens = append(c.tokens, ev.Token)
		c.logprobs = append(c.logprobs, ev.Logprob)
		c.top = append(c.top, ev.TopLogprobs)
	}
	c.completion = ev.CompletionTokens
	if ev.Finish != "" {
		c.finish, c.done = ev.Finish, true
	}
}
