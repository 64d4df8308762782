package infer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// jsonComplete runs text through a fresh automaton: whether every byte was
// accepted, and whether the object is closed at the end.
func jsonComplete(text string) (prefix, done bool) {
	var j jsonObject
	for i := range len(text) {
		if !j.feed(text[i]) {
			return false, false
		}
	}
	return true, j.done
}

// isJSONObject is the reference: encoding/json's validity, an object at the
// top, nothing after it.
func isJSONObject(text string) bool {
	t := strings.TrimLeft(text, " \t\r\n")
	return json.Valid([]byte(text)) && strings.HasPrefix(t, "{") && strings.HasSuffix(text, "}") && depthOK(text)
}

func depthOK(text string) bool {
	d, inStr, esc := 0, false, false
	for i := range len(text) {
		c := text[i]
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case !inStr && (c == '{' || c == '['):
			if d++; d > jsonMaxDepth {
				return false
			}
		case !inStr && (c == '}' || c == ']'):
			d--
		}
	}
	return true
}

// TestJSONObjectAutomaton: the automaton accepts every prefix of valid JSON
// objects and is done exactly at their end; on random texts (valid objects
// mutated byte by byte) it agrees with encoding/json: a text it accepts
// and closes is a valid object, and a valid object is accepted and closed.
func TestJSONObjectAutomaton(t *testing.T) {
	valid := []string{
		`{}`, ` {"a":1}`, "{\n\t\"k\" : [1, -2.5e+3, 0, 0.0, 1E5, true, false, null, \"s\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"] }",
		`{"a":{"b":{"c":[[],[{}]]}},"d":""}`, `{"€":"ünïcødé 😀"}`, `{"n":-0.5}`, `{"x":[0,1e-7]}`,
	}
	for _, v := range valid {
		if !isJSONObject(v) {
			t.Fatalf("reference rejects %q", v)
		}
		var j jsonObject
		for i := range len(v) {
			if j.done {
				t.Fatalf("%q: done before byte %d", v, i)
			}
			if !j.feed(v[i]) {
				t.Fatalf("%q: byte %d (%q) refused", v, i, v[i])
			}
		}
		if !j.done {
			t.Errorf("%q: not done at the end", v)
		}
	}
	for _, bad := range []string{`[]`, `{"a"}`, `{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":tru}x`, `{,}`, `{"a":1,}`, `{"a":[1,]}`, "{\"a\":\"\x01\"}", `{"a":"\x"}`, `{"a":"\u12G4"}`, `{} `, `{}}`, `{"a":1]`, `"s"`, `1`} {
		if p, d := jsonComplete(bad); p && d {
			t.Errorf("%q accepted as a whole object", bad)
		}
	}
	if p, _ := jsonComplete(strings.Repeat("[", 1) + "x"); p {
		t.Error("top-level array accepted")
	}
	deep := strings.Repeat(`{"a":`, jsonMaxDepth+1)
	if p, _ := jsonComplete(deep); p {
		t.Errorf("nesting beyond %d accepted", jsonMaxDepth)
	}
	// Random mutations against the reference.
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("{}[]\":,. -+0123456789eEtrufalsn\\/bu\tabcdefABC\x01")
	agree, objects := 0, 0
	for range 200000 {
		b := []byte(valid[rng.IntN(len(valid))])
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(b) + 1)
			switch rng.IntN(3) {
			case 0: // insert
				b = append(b[:i], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[i:]...)...)
			case 1: // delete
				if i < len(b) {
					b = append(b[:i], b[i+1:]...)
				}
			case 2: // replace
				if i < len(b) {
					b[i] = alphabet[rng.IntN(len(alphabet))]
				}
			}
		}
		text := string(b)
		p, d := jsonComplete(text)
		want := isJSONObject(text)
		if (p && d) != want {
			t.Fatalf("%q: automaton accepts %v, done %v; encoding/json: object %v", text, p, d, want)
		}
		// A text the automaton refuses has no valid completion: neither
		// it nor any text starting with it is an object.
		if !p && want {
			t.Fatalf("%q refused but valid", text)
		}
		agree++
		if want {
			objects++
		}
	}
	t.Logf("%d mutated texts agree with encoding/json (%d of them objects)", agree, objects)
}

// jsonTestDecoder: ids 0..94 are the printable ASCII characters, 95.. are
// longer JSON-ish pieces, the last id decodes to nothing (an end token).
type jsonTestDecoder struct{}

var jsonTestPieces = []string{`{"`, `":`, `", "`, `"}`, `true`, `null`, `, `, `[1, `, `]}`, `\u00e9`, `12`, `.5e-3`, `"a\"b`, "{\n  "}

func (jsonTestDecoder) Decode(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id < 95:
			b.WriteByte(byte(0x20 + id))
		case id-95 < len(jsonTestPieces):
			b.WriteString(jsonTestPieces[id-95])
		}
	}
	return b.String()
}

// TestEngineJSONObject: with Request.JSONObject every sequence's text is a
// prefix of a JSON object, and a sequence that finishes with "stop" is a
// whole one (encoding/json agrees), whatever is sampled; stop tokens cannot
// end an open object. A tokenizer that cannot spell JSON is refused.
func TestEngineJSONObject(t *testing.T) {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 128, MaxPositionEmbeddings: 512,
		Activation: gpt.GELUTanh, InitMethodStd: 0.3}
	m, err := gpt.New(cfg, tensor.NewRNG(5))
	if err != nil {
		t.Fatal(err)
	}
	e := mustEngine(t, m, EngineConfig{BlockTokens: 8, Decoder: jsonTestDecoder{}})
	end := 95 + len(jsonTestPieces) // decodes to ""
	ids := map[SeqID]bool{}
	for seed := range 12 {
		s := Sampling{Temperature: 2, Seed: uint64(seed)}
		if seed == 0 {
			s = Sampling{TopK: 1}
		}
		id, err := e.Add(Request{Prompt: testPrompt(4, seed, 95), MaxTokens: 400, Sampling: s, StopTokens: []int{end}, JSONObject: true})
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	out, fin := drain(t, e)
	stopped := 0
	for id := range ids {
		text := jsonTestDecoder{}.Decode(out[id])
		p, d := jsonComplete(text)
		switch fin[id] {
		case FinishStop:
			if stopped++; stopped == 1 {
				t.Logf("e.g. %q", text)
			}
			if !d || !isJSONObject(text) {
				t.Errorf("seq %d finished %q: not a JSON object", id, text)
			}
		case FinishLength:
			if !p || d {
				t.Errorf("seq %d (length) %q is not an open JSON object's prefix", id, text)
			}
		default:
			t.Errorf("seq %d: finish %q", id, fin[id])
		}
	}
	t.Logf("%d of %d sequences closed their object within 400 tokens", stopped, len(ids))
	if stopped == 0 {
		t.Error("no sequence closed its object")
	}
	checkNoLeak(t, e)
	// Tokenizers that cannot spell every JSON text, or have none, are refused.
	if _, err := mustEngine(t, m, EngineConfig{BlockTokens: 8, Decoder: spaceDecoder{}}).Add(Request{Prompt: []int32{1}, MaxTokens: 2, JSONObject: true}); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "printable ASCII") {
		t.Errorf("a tokenizer without '{': %v", err)
	}
	if _, err := mustEngine(t, m, EngineConfig{BlockTokens: 8}).Add(Request{Prompt: []int32{1}, MaxTokens: 2, JSONObject: true}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("no tokenizer: %v", err)
	}
}
