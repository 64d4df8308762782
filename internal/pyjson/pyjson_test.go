package pyjson

import (
	"math"
	"strings"
	"testing"
)

// The wants are Python 3's json.dumps of the same values.
func TestFloat(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", 1: "1.0", -2.5: "-2.5", 0.1: "0.1", 1e-4: "0.0001", 1e-5: "1e-05", 1.5e-7: "1.5e-07",
		1e16: "1e+16", -2.3025850929940455: "-2.3025850929940455", 9999999999999998: "9999999999999998.0", 123456789.125: "123456789.125",
		math.NaN(): "NaN", math.Inf(1): "Infinity", math.Inf(-1): "-Infinity",
	} {
		if got := Float(f); got != want {
			t.Errorf("Float(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestWriteString(t *testing.T) {
	// json.dumps("a\"\\\n\t\x01\x7f é\u2028\U0001F600~")
	want := `"a\"\\\n\t\u0001\u007f \u00e9\u2028\ud83d\ude00~"`
	var b strings.Builder
	WriteString(&b, "a\"\\\n\t\x01\x7f é\u2028\U0001F600~")
	if b.String() != want {
		t.Errorf("WriteString = %s, want %s", b.String(), want)
	}
}
