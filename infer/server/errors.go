package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
)

// apiError is an OpenAI-shaped error: {"error": {"message", "type",
// "param", "code"}} with an HTTP status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func errorf(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	return e
}

// badRequest (400): malformed JSON, wrong types.
func badRequest(param, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "invalid_request_error", "", param, format, args...)
}

// invalidValue (400, code invalid_value): well-formed JSON with a value
// out of range or an option not supported (OpenAI and vLLM answer 400).
func invalidValue(param, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "invalid_request_error", "invalid_value", param, format, args...)
}

// checkRange is the check of every integer a request carries (counts,
// lengths, token ids), before any arithmetic is done with it: a 400 that
// names the field, the value and the range its meaning allows
// (checked.RangeError's message), why in parentheses.
func checkRange(param string, v, lo, hi int, why string) *apiError {
	if err := checked.RangeWhy(param, int64(v), int64(lo), int64(hi), why); err != nil {
		return invalidValue(param, "%v", err)
	}
	return nil
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// decodeBody reads the request's body (readBody) and decodes one JSON
// object from it into v, rejecting trailing data. Fields that v does not
// have are accepted and ignored, as vLLM does, with one warning line in
// the log naming them — except the ones in unsupportedFields that would
// change the output, which are refused unless they hold their neutral
// value.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, e := s.readBody(w, r)
	if e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(v)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			return badRequest("", "request body: data after the JSON object")
		}
		var unknown []string
		unknownFields(body, reflect.TypeOf(v), "", &unknown)
		var ignored []string
		for _, f := range unknown {
			// encoding/json matches keys case-insensitively: so does this.
			if u, ok := unsupportedFields[strings.ToLower(f)]; ok {
				if e := u.check(f, topLevel(body, f)); e != nil {
					return e
				}
				continue
			}
			ignored = append(ignored, logName(f))
		}
		if len(ignored) > 0 {
			more := ""
			if len(ignored) > 20 {
				ignored, more = ignored[:20], fmt.Sprintf(" and %d more", len(ignored)-20)
			}
			s.logf("warning: %s %q: ignoring unknown fields %s%s", r.Method, r.URL.Path, strings.Join(ignored, ", "), more)
		}
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return badRequest("", "request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		field := jsonPath(typ.Field, reflect.TypeOf(v))
		if field == "" {
			return badRequest("", "request body: want %s, got JSON %s", jsonType(typ.Type.String()), typ.Value)
		}
		return badRequest(field, "%s: want %s, got JSON %s", field, jsonType(typ.Type.String()), typ.Value)
	case err == io.EOF:
		return badRequest("", "empty request body: want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "request body is truncated JSON")
	}
	var api *apiError
	if errors.As(err, &api) { // from a custom UnmarshalJSON
		return api
	}
	return badRequest("", "request body: %v", err)
}

// logName is a field name as the log shows it: quoted (Go syntax, ASCII)
// unless it is plain, so that a client's key cannot forge log lines.
func logName(f string) string {
	for _, c := range f {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_-.[]", c)) {
			return strconv.QuoteToASCII(f)
		}
	}
	if len(f) > 64 {
		return strconv.QuoteToASCII(f[:64]) + "..."
	}
	return f
}

// readBody reads the whole request body, at most MaxRequestBytes (413
// beyond: at once when Content-Length says so) within ReadTimeout (408
// after it, and the connection is closed: a client that announces a body
// and sends it a byte at a time does not hold a connection for longer).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	limit := s.cfg.MaxRequestBytes
	tooLarge := func() *apiError {
		w.Header().Set("Connection", "close")
		return errorf(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "", "request body exceeds %d bytes (--max-request-bytes)", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	// The body is read: the read deadline set for it (serveHTTP) must not
	// end the connection's background read of a long streamed answer.
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	var maxErr *http.MaxBytesError
	var netErr net.Error
	switch {
	case err == nil:
		return b, nil
	case errors.As(err, &maxErr):
		return nil, tooLarge()
	case errors.As(err, &netErr) && netErr.Timeout():
		w.Header().Set("Connection", "close")
		return nil, errorf(http.StatusRequestTimeout, "invalid_request_error", "request_timeout", "", "the request body took longer than %v to arrive (--read-timeout)", s.cfg.ReadTimeout)
	}
	return nil, badRequest("", "reading the request body: %v", err)
}

// jsonPath is a json.UnmarshalTypeError's field path as the client wrote
// it: encoding/json names the Go type of an embedded struct in the path
// ("samplingParams.n"), which the JSON does not have.
func jsonPath(field string, t reflect.Type) string {
	embedded := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			if f := t.Field(i); f.Anonymous {
				embedded[f.Name] = true
				walk(f.Type)
			}
		}
	}
	walk(t)
	var parts []string
	for _, p := range strings.Split(field, ".") {
		if p != "" && !embedded[p] {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ".")
}

// jsonType names a Go type the way a JSON user thinks of it.
func jsonType(goType string) string {
	goType = strings.TrimLeft(goType, "*")
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "struct"):
		return "an object"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "string"):
		return "a string"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	}
	return "an object"
}

// engineError maps an error from Runner.Submit.
func engineError(err error, param string) *apiError {
	switch {
	case errors.Is(err, infer.ErrContextLength):
		return errorf(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", param, "%s", strings.TrimPrefix(err.Error(), "infer: "))
	case errors.Is(err, infer.ErrBadRequest):
		return invalidValue(param, "%s", strings.TrimPrefix(err.Error(), "infer: bad request: "))
	case errors.Is(err, infer.ErrClosed):
		return errorf(http.StatusServiceUnavailable, "server_error", "shutting_down", "", "the server is shutting down")
	}
	return errorf(http.StatusInternalServerError, "server_error", "", "", "%v", err)
}
