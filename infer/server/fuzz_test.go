package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/infer"
)

// fuzzRoutes are the endpoints FuzzHandler sends its bodies to.
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/v1/completions"},
	{"POST", "/v1/chat/completions"},
	{"PUT", "/api"},
	{"GET", "/v1/models"},
}

// askedJSONObject reports whether a chat request body asks for
// response_format json_object (as the server reads it: keys match
// case-insensitively) and no stop strings (which may end an object early).
func askedJSONObject(body []byte) bool {
	var req struct {
		ResponseFormat struct{ Type string } `json:"response_format"`
		Stop           json.RawMessage
	}
	return json.Unmarshal(body, &req) == nil && req.ResponseFormat.Type == "json_object" && (len(req.Stop) == 0 || string(req.Stop) == "null")
}

const fuzzTemplate = `{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ 'SYSTEM: ' + message['content'] | trim + '\n' }}` +
	`{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\n' }}{% else %}{{ message['role'] | upper + ': ' + message['content'] + eos_token + '\n' }}{% endif %}` +
	`{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}`

// FuzzHandler sends arbitrary bodies to every endpoint through the real
// handler (Server.Handler: body reading, decoding, validation, admission,
// the engine's Runner over a tiny model, a Jinja chat template, streaming)
// and checks that no input crashes the server, gets a 5xx, leaves a
// malformed answer or leaves sequences or KV blocks behind.
//
// The default go test runs the seed corpus (below, and testdata/fuzz/
// FuzzHandler: inputs that once failed). Longer, outside go test's default
// run (issue 31 asks for ten minutes):
//
//	go test ./infer/server -run '^$' -fuzz FuzzHandler -fuzztime 10m -parallel 1
func FuzzHandler(f *testing.F) {
	for _, s := range []struct {
		route uint8
		body  string
	}{
		{0, `{"prompt": "Hello world", "max_tokens": 4, "temperature": 0}`},
		{0, `{"prompt": "Hello world", "max_tokens": 9223372036854775807}`},
		{0, `{"prompt": ["A", "BC"], "max_tokens": 3, "n": 2, "stream": true, "stream_options": {"include_usage": true}}`},
		{0, `{"prompt": [[1, 2, 3]], "max_tokens": 0, "echo": true, "logprobs": 2}`},
		{0, `{"prompt": "A", "max_tokens": 5, "stop": ["B", "C"], "seed": -1, "top_k": 3, "temperature": 5e-324}`},
		{0, `{"prompt": "A", "top_p": 0.5, "logprobs": 20, "stream": true, "max_tokens": 3, "store": false, "metadata": {"a": 1}}`},
		{1, `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2}`},
		{1, `{"messages": [{"role": "system", "content": [{"type": "text", "text": "S"}]}, {"role": "user", "content": "U"}], "stream": true, "max_completion_tokens": 4}`},
		{1, `{"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}, "max_tokens": 60, "n": 2, "temperature": 2, "seed": 5}`},
		{0, `{"prompt": "{", "response_format": {"type": "json_object"}, "max_tokens": 40, "stream": true, "stop": ["}"]}`},
		{1, `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9223372036854775807, "n": 3}`},
		{1, `{"messages": [{"role": "system", "content": " S "}, {"role": "assistant", "content": null}, {"role": "tool", "content": "{{ x }}"}], "max_tokens": 2}`},
		{2, `{"prompts": ["Hello"], "tokens_to_generate": 4, "logprobs": true, "top_k": 2, "random_seed": 3}`},
		{2, `{"prompts": ["A", "B"], "tokens_to_generate": 0, "logprobs": true, "add_BOS": true, "stop_on_eol": true}`},
		{2, `{"prompts": ["A"], "tokens_to_generate": 9223372036854775807, "temperature": 5e-324}`},
		{3, ``},
		{0, `{"prompt": "A"} trailing`},
		{0, `[]`},
	} {
		f.Add(s.route, []byte(s.body))
	}
	// A chat template with what templates use (loops, conditions, string
	// concatenation, filters, special tokens) renders the fuzzed messages.
	tpl, err := ParseChatTemplate(fuzzTemplate, "<s>", "</s>")
	if err != nil {
		f.Fatal(err)
	}
	// A byte tokenizer, which can spell JSON: json_object requests run.
	h := newHarnessWith(f, Config{MaxN: 4, MaxRequestBytes: 1 << 16, MaxWaitingSeqs: 64, ChatTemplate: tpl, Tokenizer: byteTok{}}, 96, infer.EngineConfig{}, nil)
	handler := h.srv.Handler()
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		req := httptest.NewRequest(r.method, r.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		res := rec.Result()
		out := rec.Body.Bytes()
		switch res.StatusCode {
		case 200, 400, 404, 405, 408, 413, 429:
		default:
			t.Fatalf("%s %s %q: status %d: %s", r.method, r.path, body, res.StatusCode, out)
		}
		if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
			for _, d := range sseData(t, out) {
				if d == "[DONE]" {
					continue
				}
				var ev map[string]any
				if err := json.Unmarshal([]byte(d), &ev); err != nil {
					t.Fatalf("%s %q: event %q: %v", r.path, body, d, err)
				}
				if e, ok := ev["error"]; ok {
					t.Fatalf("%s %q: error event %v", r.path, body, e)
				}
			}
		} else {
			var v map[string]any
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatalf("%s %q: status %d, answer %q is not a JSON object: %v", r.path, body, res.StatusCode, out, err)
			}
			if res.StatusCode != 200 {
				var e errorBody
				if json.Unmarshal(out, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
					t.Fatalf("%s %q: status %d without an OpenAI-shaped error: %s", r.path, body, res.StatusCode, out)
				}
			} else if r.path == "/v1/chat/completions" && askedJSONObject(body) {
				var c struct {
					Choices []struct {
						Message      struct{ Content string }
						FinishReason string `json:"finish_reason"`
					}
				}
				json.Unmarshal(out, &c)
				for _, ch := range c.Choices {
					if ch.FinishReason == "stop" && !isJSONObject(ch.Message.Content) {
						t.Fatalf("%q: json_object choice %q is not a JSON object", body, ch.Message.Content)
					}
				}
			}
		}
		// Nothing left behind (cancellations reach the engine between
		// steps).
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := h.runner.Stats()
			if st.KVBlocksUsed == 0 && st.Running+st.Waiting == 0 && h.srv.inflight.Load() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %q: left behind: %+v, %d in flight", r.path, body, st, h.srv.inflight.Load())
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// isJSONObject reports whether s is one JSON object by RFC 8259's grammar.
// Numbers are kept as text (UseNumber): 3e187250 is valid JSON that
// JavaScript reads as Infinity and Python as inf, though it overflows a
// Go float64 (the fuzzer found such a choice after 225,000 inputs).
func isJSONObject(s string) bool {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v map[string]any
	if d.Decode(&v) != nil || v == nil {
		return false
	}
	_, err := d.Token()
	return err == io.EOF
}
