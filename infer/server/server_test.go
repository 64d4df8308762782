package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// charTok is a test tokenizer: ids 0..62 are the bytes ' '..'^', 63 is
// the end of document.
type charTok struct{}

func (charTok) Encode(text string) []int {
	ids := make([]int, 0, len(text))
	for _, b := range []byte(text) {
		if b < ' ' || b > '^' {
			b = '?'
		}
		ids = append(ids, int(b-' '))
	}
	return ids
}

func (charTok) Decode(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 63 {
			b = append(b, byte(id)+' ')
		}
	}
	return string(b)
}

func (charTok) VocabSize() int { return 64 }
func (charTok) EOD() int       { return 63 }

// byteTok is a test tokenizer that can spell JSON: ids 0..126 are the
// ASCII bytes (others encode as '?'), 127 is the end of document.
type byteTok struct{}

func (byteTok) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := range len(text) {
		if ids[i] = int(text[i]); text[i] >= 127 {
			ids[i] = '?'
		}
	}
	return ids
}

func (byteTok) Decode(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 127 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}

func (byteTok) VocabSize() int { return 128 }
func (byteTok) EOD() int       { return 127 }

type harness struct {
	url    string
	srv    *Server
	runner *infer.Runner
	model  *gpt.Model
}

// newHarness serves a small random Llama-style model (context 96) through
// httptest; cleanup stops the runner.
func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	return newHarnessContext(t, cfg, 96)
}

// newHarnessContext is newHarness with a context of positions tokens.
func newHarnessContext(t testing.TB, cfg Config, positions int) *harness {
	t.Helper()
	return newHarnessWith(t, cfg, positions, infer.EngineConfig{}, nil)
}

// newHarnessWith is newHarnessContext with the engine's configuration
// (block size 8 and the tokenizer set here), cfg.Tokenizer (nil: charTok;
// the model's vocabulary is its) and, unless nil, wrap around the test
// server's listener.
func newHarnessWith(t testing.TB, cfg Config, positions int, ec infer.EngineConfig, wrap func(net.Listener) net.Listener) *harness {
	t.Helper()
	if cfg.Tokenizer == nil {
		cfg.Tokenizer = charTok{}
	}
	mc := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 48,
		VocabSize: cfg.Tokenizer.VocabSize(), MaxPositionEmbeddings: positions, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3}
	m, err := gpt.New(mc, tensor.NewRNG(11))
	if err != nil {
		t.Fatal(err)
	}
	ec.BlockTokens, ec.Decoder = 8, cfg.Tokenizer
	e, err := infer.NewEngine(m, ec)
	if err != nil {
		t.Fatal(err)
	}
	r := infer.NewRunner(e)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	cfg.Runner = r
	if cfg.ModelName == "" {
		cfg.ModelName = "tiny"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	if wrap != nil {
		ts.Listener = wrap(ts.Listener)
	}
	ts.Start()
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
	return &harness{url: ts.URL, srv: s, runner: r, model: m}
}

func (h *harness) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// sseData returns the data fields of an event stream.
func sseData(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") {
			out = append(out, strings.TrimPrefix(l, "data: "))
		}
	}
	return out
}

// greedy returns infer.Generate's greedy text for prompt (gotron generate).
func (h *harness) greedy(t *testing.T, prompt string, n int) string {
	t.Helper()
	ids := charTok{}.Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	sm, _ := infer.NewSampler(infer.Sampling{TopK: 1})
	var out []int
	infer.Generate(context.Background(), h.model, p, n, 64, 63, sm, func(id int) error { out = append(out, id); return nil })
	if len(out) > 0 && out[len(out)-1] == 63 {
		out = out[:len(out)-1]
	}
	return charTok{}.Decode(out)
}

func TestCompletions(t *testing.T) {
	h := newHarness(t, Config{})
	want := h.greedy(t, "HELLO WORLD", 12)
	code, body := h.do(t, "POST", "/v1/completions", `{"model":"tiny","prompt":"HELLO WORLD","max_tokens":12,"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var resp struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage usage
	}
	json.Unmarshal(body, &resp)
	if resp.Object != "text_completion" || len(resp.Choices) != 1 || resp.Choices[0].Text != want || resp.Usage.PromptTokens != 11 {
		t.Fatalf("response %s; want text %q", body, want)
	}
	// Streamed: the same text in pieces, then [DONE].
	code, body = h.do(t, "POST", "/v1/completions", `{"prompt":"HELLO WORLD","max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`)
	data := sseData(t, body)
	if code != 200 || len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream %d: %s", code, body)
	}
	var text strings.Builder
	for _, d := range data[:len(data)-2] {
		var c struct{ Choices []struct{ Text string } }
		json.Unmarshal([]byte(d), &c)
		text.WriteString(c.Choices[0].Text)
	}
	if text.String() != want || !strings.Contains(data[len(data)-2], `"usage":{"prompt_tokens":11`) {
		t.Fatalf("streamed %q, want %q; last chunks %v", text.String(), want, data[len(data)-2:])
	}
	// n choices with a seed are reproducible; logprobs and echo.
	body1 := `{"prompt":"ABC","max_tokens":5,"n":3,"seed":4,"logprobs":2,"echo":true}`
	_, b1 := h.do(t, "POST", "/v1/completions", body1)
	_, b2 := h.do(t, "POST", "/v1/completions", body1)
	var r1, r2 struct {
		Choices []struct {
			Text     string
			Logprobs legacyLogprobs
		}
	}
	json.Unmarshal(b1, &r1)
	json.Unmarshal(b2, &r2)
	if len(r1.Choices) != 3 || r1.Choices[0].Text != r2.Choices[0].Text || !strings.HasPrefix(r1.Choices[0].Text, "ABC") {
		t.Fatalf("seeded n=3: %s / %s", b1, b2)
	}
	lp := r1.Choices[0].Logprobs
	if len(lp.Tokens) != 3+5 || lp.TokenLogprobs[0] != nil || lp.TokenLogprobs[1] == nil || len(lp.TopLogprobs[4]) != 2 {
		t.Fatalf("echo logprobs: %s", b1)
	}
}

func TestChatCompletions(t *testing.T) {
	h := newHarness(t, Config{})
	want := h.greedy(t, PlainTemplate([]Message{{"system", "BE BRIEF."}, {"user", "HI"}}, true), 10)
	msgs := `"messages":[{"role":"system","content":"BE BRIEF."},{"role":"user","content":[{"type":"text","text":"HI"}]}]`
	code, body := h.do(t, "POST", "/v1/chat/completions", `{"model":"tiny",`+msgs+`,"max_tokens":10,"temperature":0}`)
	var resp struct {
		Object  string
		Choices []struct {
			Message struct{ Role, Content string }
		}
	}
	json.Unmarshal(body, &resp)
	if code != 200 || resp.Object != "chat.completion" || resp.Choices[0].Message.Role != "assistant" || resp.Choices[0].Message.Content != want {
		t.Fatalf("%d %s; want content %q", code, body, want)
	}
	code, body = h.do(t, "POST", "/v1/chat/completions", `{`+msgs+`,"max_tokens":10,"temperature":0,"stream":true}`)
	data := sseData(t, body)
	var text strings.Builder
	for _, d := range data[:len(data)-1] {
		var c struct {
			Object  string
			Choices []struct{ Delta struct{ Content string } }
		}
		json.Unmarshal([]byte(d), &c)
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %s", d)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if code != 200 || text.String() != want || data[len(data)-1] != "[DONE]" {
		t.Fatalf("streamed %q, want %q: %s", text.String(), want, body)
	}
}

func TestChatTemplateJinja(t *testing.T) {
	tpl, err := ParseChatTemplate(`{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'].strip() + ' [/INST]' }}{% else %}{{ raise_exception('only user messages') }}{% endif %}{% endfor %}`, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render([]Message{{"user", " hi "}}, true)
	if err != nil || got != "<s>[INST] hi [/INST]" {
		t.Fatalf("%q %v", got, err)
	}
	if _, err := tpl.Render([]Message{{"system", "x"}}, true); err == nil || !strings.Contains(err.Error(), "only user messages") {
		t.Fatalf("raise_exception: %v", err)
	}
	// Served: the template's error is the request's (422).
	h := newHarness(t, Config{ChatTemplate: tpl})
	if code, body := h.do(t, "POST", "/v1/chat/completions", `{"messages":[{"role":"system","content":"X"}],"max_tokens":2}`); code != 400 || !strings.Contains(string(body), "only user messages") {
		t.Fatalf("%d %s", code, body)
	}
}

func TestErrors(t *testing.T) {
	h := newHarness(t, Config{MaxPromptTokens: 40, MaxRequestBytes: 4096})
	long := strings.Repeat("A", 41)
	cases := []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"POST", "/v1/completions", `{"prompt": "A",`, 400, "truncated"},
		{"POST", "/v1/completions", `{"prompt": "A"} x`, 400, "after the JSON"},
		{"POST", "/v1/completions", ``, 400, "empty request body"},
		{"POST", "/v1/completions", `{"prompt": "A", "max_tokens": "3"}`, 400, "max_tokens: want an integer"},
		{"POST", "/v1/completions", `{"prompt": 3}`, 400, "prompt: want a string"},
		{"POST", "/v1/completions", `{"prompt": "A", "n": 1.5}`, 400, `"message":"n: want an integer, got JSON number 1.5","type":"invalid_request_error","param":"n"`},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "seed": "1"}`, 400, `"param":"seed"`},
		{"POST", "/v1/completions", `[1, 2]`, 400, "request body: want an object, got JSON array"},
		{"POST", "/v1/completions", `{"model": "gpt-4", "prompt": "A"}`, 404, "model_not_found"},
		{"POST", "/v1/completions", `{"prompt": "A", "max_tokens": 0}`, 400, "max_tokens: 0 is out of range: must be at least 1 (0 only with echo and logprobs"},
		{"POST", "/v1/completions", `{"prompt": "A", "max_tokens": -2}`, 400, "max_tokens: -2 is out of range"},
		{"POST", "/v1/completions", `{"prompt": "A", "temperature": 3}`, 400, "temperature: 3 is out of range: must be between 0 and 2"},
		{"POST", "/v1/completions", `{"prompt": "A", "top_p": 0.5, "top_k": 5}`, 400, "Megatron"},
		{"POST", "/v1/completions", `{"prompt": "A", "n": 0}`, 400, `"message":"n: 0 is out of range: must be between 1 and 16 (--max-n)","type":"invalid_request_error","param":"n","code":"invalid_value"`},
		{"POST", "/v1/completions", `{"prompt": [[1, 2, 99]]}`, 400, "prompt[0][2]: 99 is out of range: must be between 0 and 63"},
		{"POST", "/v1/completions", `{"prompt": ""}`, 400, "empty"},
		{"POST", "/v1/completions", `{"prompt": "` + long + `"}`, 413, "--max-prompt-tokens"},
		{"POST", "/v1/completions", `{"prompt": "A", "max_tokens": 96}`, 400, "context_length_exceeded"},
		{"POST", "/v1/completions", `{"prompt": "` + strings.Repeat("A", 5000) + `"}`, 413, "request_too_large"},
		{"POST", "/v1/chat/completions", `{"messages": []}`, 400, "at least one"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "robot", "content": "x"}]}`, 400, "role"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": 5}]}`, 400, "content"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user"}]}`, 400, "messages[0].content: a user message needs content"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "text"}]}]}`, 400, `a text part needs \"text\"`},
		{"PUT", "/api", `{"prompts": "A"}`, 400, "prompts: want an array, got JSON string"},
		{"GET", "/v1/completions", ``, 405, "use POST"},
		{"GET", "/v2/nothing", ``, 404, "no route"},
		{"PUT", "/api", `{"prompts": ["A"], "max_len": 4}`, 400, "tokens_to_generate"},
		{"PUT", "/api", `{"prompts": ["A"], "top_k": 4, "top_p": 0.5}`, 400, "both top-k and top-p"},
		{"PUT", "/api", `{"prompts": ["A"], "tokens_to_generate": 0}`, 400, "logprobs should be True"},
	}
	for _, c := range cases {
		code, body := h.do(t, c.method, c.path, c.body)
		var e struct {
			Error struct{ Message, Type string }
		}
		if code != c.code || json.Unmarshal(body, &e) != nil || e.Error.Message == "" || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s %.60s: %d %s; want %d with %q", c.method, c.path, c.body, code, body, c.code, c.want)
		}
	}
	if st := h.runner.Stats(); st.KVBlocksUsed != 0 || st.Running+st.Waiting != 0 {
		t.Fatalf("after errors: %+v", st)
	}
}

func TestMegatronAPIAndMetrics(t *testing.T) {
	h := newHarness(t, Config{})
	code, body := h.do(t, "PUT", "/api", `{"prompts": ["HELLO", "AB"], "tokens_to_generate": 6, "top_k": 1, "logprobs": true}`)
	var resp struct {
		Text     []string
		Tokens   [][]int
		Segments [][]string
		Logprobs [][]float32
	}
	if code != 200 || json.Unmarshal(body, &resp) != nil || len(resp.Text) != 2 {
		t.Fatalf("%d %s", code, body)
	}
	if want := "HELLO" + h.greedy(t, "HELLO", 6); resp.Text[0] != want {
		t.Fatalf("text %q, want %q", resp.Text[0], want)
	}
	if len(resp.Logprobs[1]) != len(resp.Tokens[1])-1 || len(resp.Segments[0]) != len(resp.Tokens[0]) {
		t.Fatalf("shapes: %s", body)
	}
	// Scoring only: tokens_to_generate 0 returns the prompt's log-probabilities.
	code, body = h.do(t, "PUT", "/api", `{"prompts": ["HELLO"], "tokens_to_generate": 0, "logprobs": true}`)
	if code != 200 || json.Unmarshal(body, &resp) != nil || resp.Text[0] != "HELLO" || len(resp.Logprobs[0]) != 4 || resp.Logprobs[0][0] >= 0 {
		t.Fatalf("scoring: %d %s", code, body)
	}
	code, body = h.do(t, "GET", "/metrics", "")
	for _, want := range []string{`gotron_requests_total{endpoint="api",code="200"} 2`, "gotron_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
		"gotron_kv_blocks_used 0", "gotron_queue_depth 0", "gotron_generation_tokens_total"} {
		if code != 200 || !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if code, body := h.do(t, "GET", "/v1/models", ""); code != 200 || !strings.Contains(string(body), `"id":"tiny"`) {
		t.Errorf("models: %d %s", code, body)
	}
	if code, body := h.do(t, "GET", "/health", ""); code != 200 || !strings.Contains(string(body), "ok") {
		t.Errorf("health: %d %s", code, body)
	}
	h.srv.Drain()
	if code, _ := h.do(t, "GET", "/health", ""); code != 503 {
		t.Errorf("health while draining: %d", code)
	}
}

// TestDisconnectFreesBlocks: a streaming client that goes away cancels its
// sequence; the KV blocks come back.
func TestDisconnectFreesBlocks(t *testing.T) {
	h := newHarnessContext(t, Config{}, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/completions", strings.NewReader(`{"prompt":"ABCDEFGHIJ","max_tokens":4000,"ignore_eos":true,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // the first chunk arrived
		t.Fatal(err)
	}
	// The runner's Stats are taken before it delivers a step's events.
	if h.runner.Stats().KVBlocksUsed == 0 {
		t.Fatal("no blocks used while streaming")
	}
	cancel()
	resp.Body.Close()
	// The server learns of the disconnect asynchronously (its connection's
	// read fails), so wait for it, as long as the test may run.
	waitFor(t, func() bool { st := h.runner.Stats(); return st.KVBlocksUsed == 0 && st.Running+st.Waiting == 0 },
		func() string { return fmt.Sprintf("blocks not freed after disconnect: %+v", h.runner.Stats()) })
}

// waitFor polls cond until it holds, failing with msg() shortly before the
// test's deadline (go test -timeout), so that slow machines wait longer
// instead of failing.
func waitFor(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	for !cond() {
		if time.Until(deadline) < 5*time.Second {
			t.Fatal(msg())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoadChatTemplate: tokenizer_config.json's chat_template (a string or
// named templates) with its special tokens (strings or {"content"}), and
// chat_template.jinja first; none gives nil (the plain template).
func TestLoadChatTemplate(t *testing.T) {
	write := func(dir, name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	msgs := []Message{{"user", "hi"}}
	dir := t.TempDir()
	if tpl, err := LoadChatTemplate(dir); tpl != nil || err != nil {
		t.Fatalf("no files: %v %v", tpl, err)
	}
	write(dir, "tokenizer_config.json", `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
		"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]}`)
	tpl, err := LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tpl.Render(msgs, true); got != "<s>hi</s>" {
		t.Fatalf("named default template: %q", got)
	}
	write(dir, "chat_template.jinja", "J{{ messages | length }}{% if add_generation_prompt %}>{% endif %}")
	tpl, _ = LoadChatTemplate(dir)
	if got, _ := tpl.Render(msgs, true); got != "J1>" {
		t.Fatalf("chat_template.jinja: %q", got)
	}
	write(dir, "tokenizer_config.json", `{"chat_template": 5}`)
	os.Remove(filepath.Join(dir, "chat_template.jinja"))
	if _, err := LoadChatTemplate(dir); err == nil {
		t.Fatal("a numeric chat_template was accepted")
	}
	if got := PlainTemplate([]Message{{"system", "s"}, {"user", "u"}}, true); got != "System: s\nUser: u\nAssistant:" {
		t.Fatalf("plain template: %q", got)
	}
}
