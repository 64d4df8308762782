package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/gotron/gotron/infer"
)

// completionRequest is POST /v1/completions' body.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Logprobs      *int            `json:"logprobs"`
	Echo          bool            `json:"echo"`
	Stop          json.RawMessage `json:"stop"`
	BestOf        *int            `json:"best_of"`
	Suffix        *string         `json:"suffix"`
	samplingParams
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// usage is OpenAI's token counts.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// parsePrompts reads "prompt": a string, an array of strings, an array of
// token ids or an array of arrays of ids.
func (s *Server) parsePrompts(raw json.RawMessage) ([][]int32, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]int32{s.encode(one)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		out := make([][]int32, len(texts))
		for i, t := range texts {
			out[i] = s.encode(t)
		}
		return s.checkPromptList(out)
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		return s.checkPromptList([][]int32{ids})
	}
	var idLists [][]int32
	if json.Unmarshal(raw, &idLists) == nil {
		return s.checkPromptList(idLists)
	}
	return nil, badRequest("prompt", "prompt: want a string, an array of strings, an array of token ids or an array of arrays of token ids")
}

func (s *Server) checkPromptList(ps [][]int32) ([][]int32, *apiError) {
	if len(ps) == 0 || len(ps) > s.cfg.MaxN {
		return nil, invalidValue("prompt", "%d prompts: want 1..%d", len(ps), s.cfg.MaxN)
	}
	vocab := s.cfg.Tokenizer.VocabSize()
	for i, p := range ps {
		for j, id := range p {
			if id < 0 || int(id) >= vocab {
				return nil, checkRange(fmt.Sprintf("prompt[%d][%d]", i, j), int(id), 0, vocab-1, "a token id of the vocabulary")
			}
		}
	}
	return ps, nil
}

func (s *Server) completionsStatus(w http.ResponseWriter, r *http.Request, start time.Time) int {
	var req completionRequest
	fail := func(e *apiError) int { writeError(w, e); return e.Status }
	if e := s.decodeBody(w, r, &req); e != nil {
		return fail(e)
	}
	if e := s.checkModel(req.Model); e != nil {
		return fail(e)
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return fail(invalidValue("suffix", "suffix is not supported"))
	}
	if req.BestOf != nil {
		if e := checkRange("best_of", *req.BestOf, 1, 1, "one candidate per choice: best_of > 1 is not supported"); e != nil {
			return fail(e)
		}
	}
	prompts, e := s.parsePrompts(req.Prompt)
	if e != nil {
		return fail(e)
	}
	samp, e := s.sampling(&req.samplingParams)
	if e != nil {
		return fail(e)
	}
	if len(prompts)*len(samp) > s.cfg.MaxN {
		return fail(invalidValue("n", "%d prompts × n=%d choices: want at most %d", len(prompts), len(samp), s.cfg.MaxN))
	}
	stop, e := stopStrings(req.Stop)
	if e != nil {
		return fail(e)
	}
	stopIDs, e := s.stopTokens(req.IgnoreEOS, req.StopTokenIDs)
	if e != nil {
		return fail(e)
	}
	jsonObj, e := s.jsonObject(&req.samplingParams)
	if e != nil {
		return fail(e)
	}
	maxTokens := 16
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	topLP := -1
	if req.Logprobs != nil {
		topLP = *req.Logprobs
		if e := checkRange("logprobs", topLP, 0, 20, "OpenAI's bound"); e != nil {
			return fail(e)
		}
	}
	least := 1
	if req.Echo && topLP >= 0 {
		least = 0
	}
	if e := checkRange("max_tokens", maxTokens, least, math.MaxInt, "0 only with echo and logprobs, to score the prompt"); e != nil {
		return fail(e)
	}
	var reqs []infer.Request
	promptTokens := 0
	for pi, p := range prompts {
		if len(p) == 0 {
			return fail(invalidValue("prompt", "prompt %d is empty", pi))
		}
		if e := s.checkPrompt("prompt", len(p), "max_tokens", maxTokens, least); e != nil {
			return fail(e)
		}
		promptTokens += len(p)
		for _, sm := range samp {
			reqs = append(reqs, s.inferRequest(p, maxTokens, sm, stop, stopIDs, topLP, req.Echo && topLP >= 0, jsonObj))
		}
	}
	s.metrics.promptTokens.Add(int64(promptTokens))
	x := exchangeOf(r.Context())
	x.promptTokens = promptTokens
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, e := s.submit(ctx, reqs)
	if e != nil {
		return fail(e)
	}
	c := &completion{s: s, req: &req, prompts: prompts, perPrompt: len(samp), id: s.newID("cmpl"), created: s.cfg.Now().Unix(), topLP: topLP}
	if req.Stream {
		return s.streamCompletion(ctx, w, ch, len(reqs), start, c, x)
	}
	states, e := s.gather(ctx, ch, len(reqs), start)
	if e != nil {
		return fail(e)
	}
	out := map[string]any{"id": c.id, "object": "text_completion", "created": c.created, "model": s.cfg.ModelName}
	choices := make([]map[string]any, len(states))
	u := usage{PromptTokens: promptTokens}
	for i, st := range states {
		choices[i] = c.choice(i, st.text.String(), st, 0, len(st.tokens), true)
		choices[i]["finish_reason"] = string(st.finish)
		u.CompletionTokens += st.completion
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	x.completionTokens = u.CompletionTokens
	out["choices"], out["usage"] = choices, u
	writeJSON(w, out)
	return http.StatusOK
}

// inferRequest builds one engine request; topLP < 0 means no logprobs.
func (s *Server) inferRequest(prompt []int32, maxTokens int, sm infer.Sampling, stop []string, stopIDs []int, topLP int, promptLP, jsonObject bool) infer.Request {
	return infer.Request{Prompt: prompt, MaxTokens: maxTokens, Sampling: sm, Stop: stop, StopTokens: stopIDs,
		Logprobs: topLP >= 0, TopLogprobs: max(topLP, 0), PromptLogprobs: promptLP, JSONObject: jsonObject}
}

// gather reads every choice to its end (non-streamed responses).
func (s *Server) gather(ctx context.Context, ch <-chan choiceEvent, n int, start time.Time) ([]*choiceState, *apiError) {
	states := make([]*choiceState, n)
	for i := range states {
		states[i] = &choiceState{}
	}
	first := false
	for left := n; left > 0; {
		var ce choiceEvent
		select {
		case ce = <-ch:
		case <-ctx.Done():
			return nil, errorf(499, "client_closed", "", "", "client closed the request")
		}
		if ce.err != nil {
			return nil, engineError(ce.err, "")
		}
		st := states[ce.i]
		s.observe(start, &first, st, ce)
		st.add(ce.ev)
		if ce.ev.Finish == infer.FinishAbort {
			return nil, engineError(infer.ErrClosed, "")
		}
		if st.done {
			left--
		}
	}
	s.metrics.e2e.observe(s.cfg.Now().Sub(start).Seconds())
	return states, nil
}

// completion formats /v1/completions choices.
type completion struct {
	s         *Server
	req       *completionRequest
	prompts   [][]int32
	perPrompt int
	id        string
	created   int64
	topLP     int
}

// choice returns choice i with text and, when asked, the logprobs of its
// tokens [from, to) (and, with echo on the first chunk, the prompt's).
func (c *completion) choice(i int, text string, st *choiceState, from, to int, first bool) map[string]any {
	ch := map[string]any{"index": i, "text": text, "logprobs": nil, "finish_reason": nil}
	prompt := c.prompts[i/c.perPrompt]
	if c.req.Echo && first {
		ch["text"] = c.s.cfg.Tokenizer.Decode(toInts(prompt)) + text
	}
	if c.topLP < 0 {
		return ch
	}
	lp := legacyLogprobs{Tokens: []string{}, TokenLogprobs: []*float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	off := 0
	if c.req.Echo && first && st.promptLP != nil {
		for j, id := range prompt {
			var v *float32
			if j > 0 {
				x := st.promptLP[j-1]
				v = &x
			}
			lp.add(c.s.tokenText(int(id)), v, nil, &off, c.s)
		}
	}
	for j := from; j < to; j++ {
		v := st.logprobs[j]
		lp.add(c.s.tokenText(st.tokens[j]), &v, st.top[j], &off, c.s)
	}
	ch["logprobs"] = lp
	return ch
}

// legacyLogprobs is the completions API's logprobs object.
type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (l *legacyLogprobs) add(tok string, v *float32, top []infer.TokenLogprob, off *int, s *Server) {
	l.Tokens = append(l.Tokens, tok)
	l.TokenLogprobs = append(l.TokenLogprobs, v)
	var m map[string]float32
	if top != nil {
		m = map[string]float32{}
		for _, t := range top {
			m[s.tokenText(t.Token)] = t.Logprob
		}
	}
	l.TopLogprobs = append(l.TopLogprobs, m)
	l.TextOffset = append(l.TextOffset, *off)
	*off += len(tok)
}

func (s *Server) tokenText(id int) string { return s.cfg.Tokenizer.Decode([]int{id}) }

func toInts(p []int32) []int {
	out := make([]int, len(p))
	for i, v := range p {
		out[i] = int(v)
	}
	return out
}

// sse writes server-sent events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w)}
}

// send writes one "data:" event and flushes it.
func (e *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e *sse) done() error {
	if _, err := fmt.Fprint(e.w, "data: [DONE]\n\n"); err != nil {
		return err
	}
	return e.rc.Flush()
}

// sseError sends an error event (the openai clients raise it as an API
// error) instead of [DONE].
// next is the stream's next engine event, or the status the stream ends
// with: 499 when the client went away, the engine's error (sent to the
// client as the stream's last event) when it failed or aborted.
func (e *sse) next(ctx context.Context, ch <-chan choiceEvent) (choiceEvent, int) {
	var ce choiceEvent
	select {
	case ce = <-ch:
	case <-ctx.Done():
		return ce, 499
	}
	if ce.err != nil || ce.ev.Finish == infer.FinishAbort {
		a := engineError(infer.ErrClosed, "")
		if ce.err != nil {
			a = engineError(ce.err, "")
		}
		e.sseError(a)
		return ce, a.Status
	}
	return ce, 0
}

func (e *sse) sseError(a *apiError) {
	e.send(struct {
		Error *apiError `json:"error"`
	}{a})
}

func (s *Server) streamCompletion(ctx context.Context, w http.ResponseWriter, ch <-chan choiceEvent, n int, start time.Time, c *completion, x *exchange) int {
	out := startSSE(w)
	states := make([]*choiceState, n)
	for i := range states {
		states[i] = &choiceState{}
	}
	first, sent := false, make([]bool, n)
	var u usage
	defer func() { x.completionTokens = u.CompletionTokens }()
	for _, p := range c.prompts {
		u.PromptTokens += len(p)
	}
	for left := n; left > 0; {
		ce, status := out.next(ctx, ch)
		if status != 0 {
			return status
		}
		st := states[ce.i]
		s.observe(start, &first, st, ce)
		from := len(st.tokens)
		st.add(ce.ev)
		if ce.ev.Text == "" && ce.ev.Finish == "" && c.topLP < 0 && !(c.req.Echo && !sent[ce.i]) {
			continue // nothing to say yet (text held back)
		}
		chunk := c.choice(ce.i, ce.ev.Text, st, from, len(st.tokens), !sent[ce.i])
		sent[ce.i] = true
		if ce.ev.Finish != "" {
			chunk["finish_reason"] = string(ce.ev.Finish)
			u.CompletionTokens += st.completion
			left--
		}
		if out.send(map[string]any{"id": c.id, "object": "text_completion", "created": c.created, "model": s.cfg.ModelName, "choices": []any{chunk}}) != nil {
			return 499 // the client is gone; ctx ends and cancels the rest
		}
	}
	s.metrics.e2e.observe(s.cfg.Now().Sub(start).Seconds())
	if c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		out.send(map[string]any{"id": c.id, "object": "text_completion", "created": c.created, "model": s.cfg.ModelName, "choices": []any{}, "usage": u})
	}
	out.done()
	return http.StatusOK
}

// chatRequest is POST /v1/chat/completions' body.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Stop                json.RawMessage `json:"stop"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	samplingParams
}

// chatMessage takes content as a string or an array of text parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

// text returns the message's text. Content may be missing or null only in
// an assistant message (OpenAI's rule: one that made tool calls).
func (m chatMessage) text(i int) (string, *apiError) {
	param := fmt.Sprintf("messages[%d].content", i)
	if len(m.Content) == 0 || string(m.Content) == "null" {
		if m.Role != "assistant" {
			return "", badRequest(param, "%s: a %s message needs content", param, m.Role)
		}
		return "", nil
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", badRequest(param, "%s: want a string or an array of content parts", param)
	}
	var b strings.Builder
	for j, p := range parts {
		switch {
		case p.Type != "text":
			return "", invalidValue(param, "%s: content part of type %q is not supported (text only)", param, p.Type)
		case p.Text == nil:
			return "", badRequest(param, "%s[%d]: a text part needs \"text\"", param, j)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

func (s *Server) chatStatus(w http.ResponseWriter, r *http.Request, start time.Time) int {
	var req chatRequest
	fail := func(e *apiError) int { writeError(w, e); return e.Status }
	if e := s.decodeBody(w, r, &req); e != nil {
		return fail(e)
	}
	if e := s.checkModel(req.Model); e != nil {
		return fail(e)
	}
	if len(req.Messages) == 0 {
		return fail(invalidValue("messages", "messages: want at least one message"))
	}
	msgs := make([]Message, len(req.Messages))
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "user", "assistant", "developer", "tool":
		default:
			return fail(invalidValue(fmt.Sprintf("messages[%d].role", i), "role %q: want system, developer, user, assistant or tool", m.Role))
		}
		text, e := m.text(i)
		if e != nil {
			return fail(e)
		}
		msgs[i] = Message{Role: m.Role, Content: text}
	}
	promptText, err := s.cfg.ChatTemplate.Render(msgs, true)
	if err != nil {
		return fail(invalidValue("messages", "%v", err))
	}
	prompt := s.encode(promptText)
	if len(prompt) == 0 {
		return fail(invalidValue("messages", "the chat template rendered an empty prompt"))
	}
	samp, e := s.sampling(&req.samplingParams)
	if e != nil {
		return fail(e)
	}
	stop, e := stopStrings(req.Stop)
	if e != nil {
		return fail(e)
	}
	stopIDs, e := s.stopTokens(req.IgnoreEOS, req.StopTokenIDs)
	if e != nil {
		return fail(e)
	}
	jsonObj, e := s.jsonObject(&req.samplingParams)
	if e != nil {
		return fail(e)
	}
	// OpenAI's default is what the context leaves; max_completion_tokens
	// replaces the older max_tokens.
	param, maxTokens := "max_tokens", max(s.maxCtx-len(prompt), 1)
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if req.MaxCompletionTokens != nil {
		param, maxTokens = "max_completion_tokens", *req.MaxCompletionTokens
	}
	if e := s.checkPrompt("messages", len(prompt), param, maxTokens, 1); e != nil {
		return fail(e)
	}
	topLP := -1
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return fail(invalidValue("top_logprobs", "top_logprobs needs logprobs: true"))
		}
		if e := checkRange("top_logprobs", *req.TopLogprobs, 0, 20, "OpenAI's bound"); e != nil {
			return fail(e)
		}
		topLP = *req.TopLogprobs
	} else if req.Logprobs {
		topLP = 0
	}
	reqs := make([]infer.Request, len(samp))
	for i, sm := range samp {
		reqs[i] = s.inferRequest(prompt, maxTokens, sm, stop, stopIDs, topLP, false, jsonObj)
	}
	s.metrics.promptTokens.Add(int64(len(prompt)))
	x := exchangeOf(r.Context())
	x.promptTokens = len(prompt)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, e := s.submit(ctx, reqs)
	if e != nil {
		return fail(e)
	}
	c := &chat{s: s, req: &req, id: s.newID("chatcmpl"), created: s.cfg.Now().Unix(), topLP: topLP}
	if req.Stream {
		return s.streamChat(ctx, w, ch, len(reqs), start, c, len(prompt), x)
	}
	states, e := s.gather(ctx, ch, len(reqs), start)
	if e != nil {
		return fail(e)
	}
	u := usage{PromptTokens: len(prompt)}
	choices := make([]map[string]any, len(states))
	for i, st := range states {
		choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": st.text.String()},
			"logprobs": c.logprobs(st, 0, len(st.tokens)), "finish_reason": string(st.finish)}
		u.CompletionTokens += st.completion
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	x.completionTokens = u.CompletionTokens
	writeJSON(w, map[string]any{"id": c.id, "object": "chat.completion", "created": c.created, "model": s.cfg.ModelName, "choices": choices, "usage": u})
	return http.StatusOK
}

// chat formats /v1/chat/completions output.
type chat struct {
	s       *Server
	req     *chatRequest
	id      string
	created int64
	topLP   int
}

type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float32       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs,omitempty"`
}

// logprobs returns the chat logprobs object of tokens [from, to), or nil.
func (c *chat) logprobs(st *choiceState, from, to int) any {
	if c.topLP < 0 {
		return nil
	}
	entry := func(id int, lp float32) chatLogprob {
		t := c.s.tokenText(id)
		b := make([]int, len(t))
		for i := range len(t) {
			b[i] = int(t[i])
		}
		return chatLogprob{Token: t, Logprob: lp, Bytes: b}
	}
	content := []chatLogprob{}
	for j := from; j < to; j++ {
		e := entry(st.tokens[j], st.logprobs[j])
		e.TopLogprobs = []chatLogprob{}
		for _, t := range st.top[j] {
			e.TopLogprobs = append(e.TopLogprobs, entry(t.Token, t.Logprob))
		}
		content = append(content, e)
	}
	return map[string]any{"content": content}
}

func (s *Server) streamChat(ctx context.Context, w http.ResponseWriter, ch <-chan choiceEvent, n int, start time.Time, c *chat, promptTokens int, x *exchange) int {
	out := startSSE(w)
	chunk := func(choices []any) map[string]any {
		return map[string]any{"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": s.cfg.ModelName, "choices": choices}
	}
	// Each choice opens with the assistant role.
	for i := range n {
		if out.send(chunk([]any{map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}})) != nil {
			return 499
		}
	}
	states := make([]*choiceState, n)
	for i := range states {
		states[i] = &choiceState{}
	}
	first := false
	u := usage{PromptTokens: promptTokens}
	defer func() { x.completionTokens = u.CompletionTokens }()
	for left := n; left > 0; {
		ce, status := out.next(ctx, ch)
		if status != 0 {
			return status
		}
		st := states[ce.i]
		s.observe(start, &first, st, ce)
		from := len(st.tokens)
		st.add(ce.ev)
		if ce.ev.Text == "" && ce.ev.Finish == "" && c.topLP < 0 {
			continue
		}
		delta := map[string]any{}
		if ce.ev.Text != "" {
			delta["content"] = ce.ev.Text
		}
		var fin any
		if ce.ev.Finish != "" {
			fin = string(ce.ev.Finish)
			u.CompletionTokens += st.completion
			left--
		}
		if out.send(chunk([]any{map[string]any{"index": ce.i, "delta": delta, "logprobs": c.logprobs(st, from, len(st.tokens)), "finish_reason": fin}})) != nil {
			return 499
		}
	}
	s.metrics.e2e.observe(s.cfg.Now().Sub(start).Seconds())
	if c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		c := chunk([]any{})
		c["usage"] = u
		out.send(c)
	}
	out.done()
	return http.StatusOK
}
