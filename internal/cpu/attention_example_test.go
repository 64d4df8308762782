package cpu_test

import (
	"fmt"

	"github.com/gotron/gotron/internal/cpu"
)

// A causal attention forward and backward over one head of three tokens.
// Gradients accumulate, so they start zeroed.
func ExampleAttentionForward() {
	cfg := cpu.AttentionConfig{B: 1, T: 3, HQ: 1, HKV: 1, D: 2, Causal: true}
	q := []float32{1, 0, 0, 1, 1, 1} // (b, t, hq, d)
	k := []float32{1, 0, 0, 1, 1, 1} // (b, t, hkv, d)
	v := []float32{1, 2, 3, 4, 5, 6} // (b, t, hkv, d)
	out, lse := make([]float32, 6), make([]float32, 3)
	cpu.AttentionForward(out, lse, q, k, v, cfg)
	fmt.Printf("out %.4f\nlse %.4f\n", out, lse)

	dout := []float32{1, 0, 0, 0, 0, 0} // gradient of out[0,0,0,0] only
	dq, dk, dv := make([]float32, 6), make([]float32, 6), make([]float32, 6)
	cpu.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
	fmt.Printf("dv %.4f\n", dv) // token 0 sees only itself
	// Output:
	// out [1.0000 2.0000 2.3395 3.3395 3.5105 4.5105]
	// lse [0.7071 1.1079 2.1004]
	// dv [1.0000 0.0000 0.0000 0.0000 0.0000 0.0000]
}
