package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// unknownFields appends to out the keys of the JSON object raw, and of the
// objects nested in it, that no field of t (a struct, or a pointer to one)
// takes, as paths ("metadata", "messages[0].tool_calls"). Keys match
// fields as encoding/json matches them (the tag name, else the field name,
// case-insensitively); fields decoded by hand (json.RawMessage) are not
// looked into.
func unknownFields(raw []byte, t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				for name, f := range fields {
					if strings.EqualFold(name, k) {
						ft, ok = f, true
						break
					}
				}
			}
			p := k
			if path != "" {
				p = path + "." + k
			}
			if !ok {
				*out = append(*out, p)
				continue
			}
			if ft != reflect.TypeOf(json.RawMessage(nil)) {
				unknownFields(obj[k], ft, p, out)
			}
		}
	case reflect.Slice, reflect.Array:
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			return
		}
		for i, el := range list {
			unknownFields(el, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

// jsonFields maps the JSON names of t's fields (embedded structs' fields
// promoted) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// topLevel returns the value of key in the JSON object body.
func topLevel(body []byte, key string) json.RawMessage {
	var obj map[string]json.RawMessage
	json.Unmarshal(body, &obj)
	return obj[key]
}

// unsupported is an OpenAI or vLLM request field that gotron does not
// implement and whose value would change the output: ignoring it would
// answer something else than what was asked, so it is refused unless it
// holds a value that asks for nothing (neutral).
type unsupported struct {
	neutral []string // JSON values (compact) that ask for nothing; null always does
	why     string
}

func (u unsupported) check(field string, v json.RawMessage) *apiError {
	var b bytes.Buffer
	if json.Compact(&b, v) == nil {
		v = b.Bytes()
	}
	if string(v) == "null" {
		return nil
	}
	for _, n := range u.neutral {
		if string(v) == n {
			return nil
		}
	}
	return invalidValue(field, "%s: %s is not supported: %s", field, truncate(string(v), 80), u.why)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

const noGrammar = "gotron serve constrains output only to a JSON object (response_format json_object), and ignoring it would return text that does not follow it"

// unsupportedFields are the top-level fields refused unless neutral
// (OpenAI's and vLLM's names). Other unknown fields (store, metadata,
// user, service_tier, ...) only concern bookkeeping and are ignored with a
// warning.
var unsupportedFields = map[string]unsupported{
	"guided_json":        {nil, noGrammar},
	"guided_regex":       {nil, noGrammar},
	"guided_choice":      {nil, noGrammar},
	"guided_grammar":     {nil, noGrammar},
	"structured_outputs": {nil, noGrammar},
	"tools":              {[]string{`[]`}, "gotron serve has no tool calling"},
	"functions":          {[]string{`[]`}, "gotron serve has no tool calling"},
	"tool_choice":        {[]string{`"none"`, `"auto"`}, "gotron serve has no tool calling"},
	"function_call":      {[]string{`"none"`, `"auto"`}, "gotron serve has no tool calling"},
	"min_tokens":         {[]string{`0`}, "min_tokens is not implemented"},
	"repetition_penalty": {[]string{`1`, `1.0`}, "repetition_penalty is not implemented (only 1)"},
	"min_p":              {[]string{`0`, `0.0`}, "min_p is not implemented (only 0)"},
	"prompt_logprobs":    {nil, "use echo with logprobs on /v1/completions"},
	"modalities":         {[]string{`["text"]`}, "gotron serve generates text only"},
	"audio":              {nil, "gotron serve generates text only"},
	"web_search_options": {nil, "gotron serve has no web search"},
}

// exchange is what a handler reports about its request for the access log.
type exchange struct {
	status                         int // the outcome, when a stream's differs from its HTTP status (0: the HTTP status)
	promptTokens, completionTokens int
}

type exchangeKey struct{}

// exchangeOf returns the request's exchange (a throwaway one outside
// serveHTTP).
func exchangeOf(ctx context.Context) *exchange {
	if x, ok := ctx.Value(exchangeKey{}).(*exchange); ok {
		return x
	}
	return &exchange{}
}

// statusWriter records the status written, and holds every write to
// WriteTimeout: a client that stops reading is cut off rather than holding
// its handler (and its sequence) forever.
type statusWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	status  int
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) deadline() {
	if w.timeout > 0 {
		w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.deadline()
	return w.ResponseWriter.Write(b)
}

// FlushError is what http.ResponseController.Flush calls: a stream learns
// from its error that the client is gone.
func (w *statusWriter) FlushError() error {
	w.deadline()
	return w.rc.Flush()
}

func (w *statusWriter) Flush() { w.FlushError() }

// serveHTTP wraps every route: it bounds the body's arrival (ReadTimeout)
// and each write (WriteTimeout), and writes the access line.
func (s *Server) serveHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rc := http.NewResponseController(w)
		// A deadline left by the previous request on this connection
		// must not fail this one's writes (a 100 Continue included).
		rc.SetWriteDeadline(time.Time{})
		if s.cfg.ReadTimeout > 0 && r.ContentLength != 0 {
			rc.SetReadDeadline(start.Add(s.cfg.ReadTimeout)) // cleared by readBody
		}
		sw := &statusWriter{ResponseWriter: w, rc: rc, timeout: s.cfg.WriteTimeout}
		x := &exchange{}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
		if s.cfg.Log == nil {
			return
		}
		status := sw.status
		if x.status != 0 {
			status = x.status
		}
		if status == 0 {
			status = http.StatusOK
		}
		s.logf("%s %q %d %.3fs prompt_tokens=%d completion_tokens=%d", r.RemoteAddr, r.Method+" "+r.URL.RequestURI(), status,
			time.Since(start).Seconds(), x.promptTokens, x.completionTokens)
	})
}

// logf writes one line to the log, if there is one.
func (s *Server) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		s.cfg.Log.Printf(format, args...)
	}
}

// LimitConnections returns a listener that holds at most max connections
// open (max > 0). A connection beyond them is answered 503 with an
// OpenAI-shaped error (code too_many_connections, Retry-After: 1) once its
// request headers arrive (within a second), and closed; while as many
// connections as max are already being answered so, more are closed at
// once. Unlike a listener that stops accepting, no client is left waiting
// without an answer.
func LimitConnections(ln net.Listener, max int) net.Listener {
	return &connLimiter{Listener: ln, max: int64(max)}
}

type connLimiter struct {
	net.Listener
	max      int64
	open     atomic.Int64
	refusing atomic.Int64
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		if l.refusing.Add(1) > l.max {
			l.refusing.Add(-1)
			c.Close()
			continue
		}
		go func() {
			defer l.refusing.Add(-1)
			refuseConn(c, l.max)
		}()
	}
}

// refuseConn answers c's request 503 and closes it.
func refuseConn(c net.Conn, max int64) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	br := bufio.NewReader(c)
	if _, err := http.ReadRequest(br); err != nil {
		return
	}
	var body bytes.Buffer
	json.NewEncoder(&body).Encode(struct {
		Error *apiError `json:"error"`
	}{errorf(http.StatusServiceUnavailable, "server_error", "too_many_connections", "", "the server holds its limit of %d connections (--max-connections); retry later", max)})
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", body.Len(), body.Bytes())
	// Half-close and drain what the client still sends (its body), so that
	// closing does not reset the connection before it reads the answer.
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(br, 1<<20))
}

type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
