package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/infer"
)

// lineWriter calls its function with each line written to it (a
// log.Logger writes one line per Write).
type lineWriter func(line string)

func (f lineWriter) Write(p []byte) (int, error) {
	f(string(p))
	return len(p), nil
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type errorBody struct {
	Error struct {
		Message string
		Type    string
		Param   *string
		Code    *string
	}
}

// checkError asserts a 400-class answer naming param, with want in its message.
func checkError(t *testing.T, what string, code int, body []byte, wantCode int, param, want string) {
	t.Helper()
	var e errorBody
	if code != wantCode || json.Unmarshal(body, &e) != nil || e.Error.Param == nil || *e.Error.Param != param || !strings.Contains(e.Error.Message, want) {
		t.Errorf("%s: %d %s; want %d naming %s with %q", what, code, body, wantCode, param, want)
	}
}

// TestHugeTokenCounts (issue 31, finding 1): a max_tokens near 2^63 on any
// endpoint wrapped prompt_len + max_tokens negative, passed the context
// check and panicked in the engine's goroutine (infer.newSequence:
// makeslice), killing the server. Each is now a 400 naming the field and
// its range, and the server goes on serving.
func TestHugeTokenCounts(t *testing.T) {
	h := newHarness(t, Config{})
	const huge = "9223372036854775807"
	for _, c := range []struct {
		method, path, body, param, want string
	}{
		{"POST", "/v1/completions", `{"prompt": "Hello world", "max_tokens": ` + huge + `}`, "max_tokens", "max_tokens: 9223372036854775807 is out of range: must be between 1 and 85 (this model's maximum context length is 96 tokens and the prompt has 11)"},
		{"POST", "/v1/completions", `{"prompt": "Hello world", "max_tokens": ` + huge + `, "stream": true}`, "max_tokens", "must be between 1 and 85"},
		{"POST", "/v1/completions", `{"prompt": "Hello world", "max_tokens": ` + huge + `, "echo": true, "logprobs": 1}`, "max_tokens", "must be between 0 and 85"},
		{"POST", "/v1/completions", `{"prompt": ["A", "Hello world"], "max_tokens": 90}`, "max_tokens", "must be between 1 and 85"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": ` + huge + `}`, "max_tokens", "max_tokens: 9223372036854775807 is out of range: must be between 1 and 77"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": ` + huge + `, "stream": true}`, "max_completion_tokens", "max_completion_tokens: 9223372036854775807 is out of range: must be between 1 and 77"},
		{"PUT", "/api", `{"prompts": ["Hello world"], "tokens_to_generate": ` + huge + `}`, "tokens_to_generate", "tokens_to_generate: 9223372036854775807 is out of range: must be between 1 and 85"},
		{"PUT", "/api", `{"prompts": ["Hello world"], "tokens_to_generate": ` + huge + `, "logprobs": true}`, "tokens_to_generate", "must be between 0 and 85"},
		{"PUT", "/api", `{"prompts": ["A"], "tokens_to_generate": -9223372036854775808}`, "tokens_to_generate", "must be at least 0"},
		{"POST", "/v1/completions", `{"prompt": "A", "n": ` + huge + `}`, "n", "n: 9223372036854775807 is out of range: must be between 1 and 16"},
		{"POST", "/v1/completions", `{"prompt": "A", "logprobs": ` + huge + `}`, "logprobs", "must be between 0 and 20"},
		{"POST", "/v1/completions", `{"prompt": "A", "best_of": -1}`, "best_of", "must be exactly 1"},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": ` + huge + `}`, "top_logprobs", "must be between 0 and 20"},
		{"POST", "/v1/completions", `{"prompt": [[1, -9223372036854775808]]}`, "prompt", "want a string"}, // not an int32: a type error
		{"POST", "/v1/completions", `{"prompt": "A", "stop_token_ids": [64]}`, "stop_token_ids[0]", "stop_token_ids[0]: 64 is out of range: must be between 0 and 63"},
		{"PUT", "/api", `{"prompts": ["A"], "stop_token": ` + huge + `}`, "stop_token", "must be between 0 and 63"},
	} {
		code, body := h.do(t, c.method, c.path, c.body)
		checkError(t, c.body, code, body, 400, c.param, c.want)
	}
	// The server is alive and its engine idle.
	if code, body := h.do(t, "POST", "/v1/completions", `{"prompt": "Hello world", "max_tokens": 85, "temperature": 0, "ignore_eos": true}`); code != 200 {
		t.Fatalf("after: %d %s", code, body)
	}
	if st := h.runner.Stats(); st.KVBlocksUsed != 0 || st.Running+st.Waiting != 0 {
		t.Fatalf("after: %+v", st)
	}
}

// TestSamplingFields (issue 31, finding 8): a temperature that is positive
// in float64 but 0 in float32 decoded garbage (an empty completion with
// finish_reason stop); now it is greedy. top_k -5 was accepted whenever
// temperature 0 made it moot; every sampling field is now checked.
func TestSamplingFields(t *testing.T) {
	h := newHarness(t, Config{})
	want := h.greedy(t, "HELLO", 12)
	for _, temp := range []string{"0", "5e-324", "1e-50", "7e-46"} {
		code, body := h.do(t, "POST", "/v1/completions", `{"prompt": "HELLO", "max_tokens": 12, "temperature": `+temp+`}`)
		var r struct{ Choices []struct{ Text string } }
		if code != 200 || json.Unmarshal(body, &r) != nil || len(r.Choices) != 1 || r.Choices[0].Text != want {
			t.Errorf("temperature %s: %d %s; want greedy %q", temp, code, body, want)
		}
	}
	code, body := h.do(t, "PUT", "/api", `{"prompts": ["HELLO"], "tokens_to_generate": 12, "temperature": 5e-324}`)
	var api struct{ Text []string }
	if code != 200 || json.Unmarshal(body, &api) != nil || len(api.Text) != 1 || api.Text[0] != "HELLO"+want {
		t.Errorf("/api temperature 5e-324: %d %s; want greedy %q", code, body, want)
	}
	for _, c := range []struct{ body, param, want string }{
		{`{"prompt": "A", "top_k": -5, "temperature": 0}`, "top_k", "top_k: -5 is out of range: must be at least -1 (-1 or 0: off, 1: greedy)"},
		{`{"prompt": "A", "top_k": -5}`, "top_k", "top_k: -5 is out of range"},
		{`{"prompt": "A", "top_p": 0, "temperature": 0}`, "top_p", "top_p: 0 is out of range"},
		{`{"prompt": "A", "top_p": 1.5}`, "top_p", "top_p: 1.5 is out of range"},
		{`{"prompt": "A", "temperature": -1e-300}`, "temperature", "temperature: -1e-300 is out of range"},
		{`{"prompt": "A", "seed": 1e30}`, "seed", "seed: want an integer"},
		{`{"prompt": "A", "n": 0, "temperature": 0}`, "n", "n: 0 is out of range"},
	} {
		code, body := h.do(t, "POST", "/v1/completions", c.body)
		checkError(t, c.body, code, body, 400, c.param, c.want)
	}
	code, body = h.do(t, "PUT", "/api", `{"prompts": ["A"], "top_k": -5}`)
	checkError(t, "/api top_k -5", code, body, 400, "top_k", "top_k: -5 is out of range: must be between 0 and 1000")
	// A negative seed is a seed (vLLM's too): accepted.
	if code, body := h.do(t, "POST", "/v1/completions", `{"prompt": "A", "max_tokens": 2, "seed": -9223372036854775808}`); code != 200 {
		t.Errorf("seed -2^63: %d %s", code, body)
	}
}

// TestUnknownFieldsAndAccessLog (issue 30, item 8): fields the server does
// not know (store, metadata, user, service_tier, ...) are accepted and
// ignored with one warning line, as vLLM does; fields that would change the
// output and are not implemented (response_format json_schema, tools,
// guided decoding) are refused naming the field, and so is json_object
// where the tokenizer cannot spell JSON; every request gets one access
// line.
func TestUnknownFieldsAndAccessLog(t *testing.T) {
	var logBuf syncBuffer
	h := newHarness(t, Config{Log: log.New(&logBuf, "", 0)})
	code, body := h.do(t, "POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi", "refusal": null}], "max_tokens": 3, "ignore_eos": true,
		"store": false, "metadata": {"k": "v"}, "user": "u1", "service_tier": "auto", "parallel_tool_calls": false, "response_format": {"type": "text"}}`)
	if code != 200 {
		t.Fatalf("unknown fields: %d %s", code, body)
	}
	code, body = h.do(t, "POST", "/v1/completions", `{"prompt": "A", "max_tokens": 2, "ignore_eos": true, "stream_options": {"include_usage": true, "x": 1}, "stream": true, "y\nPOST /forged": 1}`)
	if code != 200 {
		t.Fatalf("unknown nested field: %d %s", code, body)
	}
	for _, c := range []struct{ path, body, param, want string }{
		// The test tokenizer (' '..'^') cannot spell every JSON object.
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}}`, "response_format", "response_format: json_object: JSON output needs a token for every printable ASCII character; the tokenizer has none for '_'"},
		{"/v1/completions", `{"prompt": "A", "Response_Format": {"type": "json_object"}}`, "response_format", "needs a token for every printable ASCII character"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}`, "response_format", "json_schema is not supported"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "yaml"}}`, "response_format", `type "yaml"`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`, "tools", "is not supported"},
		{"/v1/completions", `{"prompt": "A", "guided_json": {}}`, "guided_json", "is not supported"},
		{"/v1/completions", `{"prompt": "A", "Guided_Regex": "a+"}`, "Guided_Regex", "is not supported"},
		{"/v1/completions", `{"prompt": "A", "repetition_penalty": 1.2}`, "repetition_penalty", "is not supported"},
	} {
		code, body := h.do(t, "POST", c.path, c.body)
		checkError(t, c.body, code, body, 400, c.param, c.want)
	}
	h.do(t, "GET", "/nowhere", "")
	out := logBuf.String()
	for _, want := range []string{
		"warning: POST \"/v1/chat/completions\": ignoring unknown fields messages[0].refusal, metadata, parallel_tool_calls, service_tier, store, user\n",
		"warning: POST \"/v1/completions\": ignoring unknown fields stream_options.x, \"y\\nPOST /forged\"\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	access := regexp.MustCompile(`(?m)^127\.0\.0\.1:\d+ "(\S+ \S+)" (\d+) \d+\.\d{3}s prompt_tokens=(\d+) completion_tokens=(\d+)$`).FindAllStringSubmatch(out, -1)
	if len(access) != 11 {
		t.Fatalf("%d access lines, want 11:\n%s", len(access), out)
	}
	if a := access[0]; a[1] != "POST /v1/chat/completions" || a[2] != "200" || a[3] == "0" || a[4] != "3" {
		t.Errorf("access line %q", a[0])
	}
	if a := access[1]; a[1] != "POST /v1/completions" || a[2] != "200" || a[3] != "1" || a[4] != "2" {
		t.Errorf("access line %q", a[0])
	}
	if a := access[10]; a[1] != "GET /nowhere" || a[2] != "404" {
		t.Errorf("access line %q", a[0])
	}
}

// TestQueueFull: beyond MaxNumSeqs running and MaxWaitingSeqs waiting a
// request is answered 429 queue_full at once; when the sequences end,
// requests are admitted again (here they end by cancellation).
func TestQueueFull(t *testing.T) {
	h := newHarnessWith(t, Config{MaxWaitingSeqs: 1}, 32768, infer.EngineConfig{MaxNumSeqs: 1}, nil)
	code, body := h.do(t, "POST", "/v1/completions", `{"prompt": "A", "max_tokens": 2, "n": 3}`)
	if code != 429 || !strings.Contains(string(body), `"code":"queue_full"`) {
		t.Fatalf("n=3 over a queue of 2: %d %s", code, body)
	}
	// A stream of two long sequences holds the queue while it runs: long
	// enough that the first cannot finish (freeing the queue) before the
	// next request arrives, even on a loaded machine (90 tokens could).
	resp, err := http.Post(h.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "A", "max_tokens": 32000, "n": 2, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first event: both submitted
		t.Fatal(err)
	}
	code, body = h.do(t, "POST", "/v1/completions", `{"prompt": "A", "max_tokens": 2}`)
	if code != 429 {
		t.Errorf("while the queue is full: %d %s", code, body)
	}
	resp.Body.Close() // cancels both sequences
	waitFor(t, func() bool {
		code, _ := h.do(t, "POST", "/v1/completions", `{"prompt": "A", "max_tokens": 2}`)
		return code == 200
	},
		func() string { return "no request admitted after the stream ended" })
}

// smallSendBuffer makes the server's socket buffers small, so that a client
// that stops reading blocks the server's writes after a few kilobytes.
type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestWriteTimeoutCutsOffNonReader: a streaming client that stops reading
// held its handler, blocked in a write, for as long as it kept the
// connection open. With WriteTimeout the blocked write fails and the
// connection is closed: what the client reads afterwards ends without
// [DONE]. The client reads nothing until the handler has ended (its access
// line is written), however long the stream takes to fill the buffers.
func TestWriteTimeoutCutsOffNonReader(t *testing.T) {
	ended := make(chan struct{})
	var once sync.Once
	access := lineWriter(func(line string) {
		if strings.Contains(line, `"POST /v1/completions"`) {
			once.Do(func() { close(ended) })
		}
	})
	h := newHarnessWith(t, Config{WriteTimeout: 300 * time.Millisecond, Log: log.New(access, "", 0)}, 96, infer.EngineConfig{},
		func(ln net.Listener) net.Listener { return smallSendBuffer{ln} })
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"prompt": "A", "max_tokens": 90, "n": 16, "logprobs": 5, "ignore_eos": true, "stream": true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The client reads nothing. Without WriteTimeout the handler stays
	// blocked in a write for as long as the connection is open; the minute
	// only bounds that hang.
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the handler of a stream whose client stopped reading was still running after a minute")
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	got, err := io.ReadAll(c)
	if bytes.Contains(got, []byte("data: [DONE]")) {
		t.Fatalf("the stream to a client that stopped reading went on to its end (%d bytes)", len(got))
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server kept the connection open: %v", err)
	}
	t.Logf("read %d bytes, then %v", len(got), err)
}

// TestBodyLimits: a body announced beyond MaxRequestBytes is answered 413
// at once, without reading it; a body that does not arrive within
// ReadTimeout is answered 408; both close the connection.
func TestBodyLimits(t *testing.T) {
	h := newHarnessWith(t, Config{MaxRequestBytes: 4096, ReadTimeout: 300 * time.Millisecond}, 96, infer.EngineConfig{}, nil)
	for _, c := range []struct {
		contentLength int
		send          string
		status        int
		code          string
		within        time.Duration
	}{
		{10 << 20, `{"prompt": "A"`, 413, "request_too_large", 200 * time.Millisecond},
		{100, `{"prompt": "A"`, 408, "request_timeout", 1200 * time.Millisecond},
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.contentLength, c.send)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("Content-Length %d: %v", c.contentLength, err)
		}
		body, _ := io.ReadAll(resp.Body)
		took := time.Since(start)
		conn.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(body), `"code":"`+c.code+`"`) || !resp.Close || took > c.within {
			t.Errorf("Content-Length %d: %d %s (close %v) after %v; want %d %s within %v", c.contentLength, resp.StatusCode, body, resp.Close, took, c.status, c.code, c.within)
		}
	}
}
