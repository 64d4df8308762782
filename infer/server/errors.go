package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/gotron/gotron/infer"
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

// badRequest (400): malformed JSON, unknown fields, wrong types.
func badRequest(param, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "invalid_request_error", "", param, format, args...)
}

// invalidValue (422): well-formed JSON with a value out of range.
func invalidValue(param, format string, args ...any) *apiError {
	return errorf(http.StatusUnprocessableEntity, "invalid_request_error", "invalid_value", param, format, args...)
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// decodeBody reads one JSON object into v, rejecting unknown fields,
// trailing data and bodies beyond limit bytes.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) *apiError {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			return badRequest("", "request body: data after the JSON object")
		}
		return nil
	}
	var maxErr *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &maxErr):
		return errorf(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "", "request body exceeds %d bytes (--max-request-bytes)", maxErr.Limit)
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
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(f, "unknown field %q", f)
	}
	var api *apiError
	if errors.As(err, &api) { // from a custom UnmarshalJSON
		return api
	}
	return badRequest("", "request body: %v", err)
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
