package main

import (
	"fmt"
	"io"
	"math"

	"github.com/gotron/gotron/model/gpt"
)

// warnNonFinite prints one warning per parameter of m that holds NaN or
// ±Inf values, naming the tensor and the source, and returns how many
// tensors it warned about. Such weights import, convert and score without
// an error (every output they touch is NaN), so the user must hear of them.
func warnNonFinite(w io.Writer, source string, m *gpt.Model) int {
	bad := 0
	for _, p := range m.Params() {
		var nan, inf int
		for _, v := range p.Float32s() {
			switch {
			case v != v:
				nan++
			case math.IsInf(float64(v), 0):
				inf++
			}
		}
		if nan+inf > 0 {
			fmt.Fprintf(w, "warning: %s: tensor %s has %d NaN and %d infinite values (of %d)\n", source, p.Name, nan, inf, p.Numel())
			bad++
		}
	}
	return bad
}
