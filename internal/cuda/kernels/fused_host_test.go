package kernels_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestFusedAddNormHost runs fused.cu's residual add + norm kernel
// (fused_bias_dropout_add_norm_f32) on the host (testdata/fused_host.cc:
// a host thread per CUDA thread, barriers for __syncthreads and the
// shuffles, blocks one after the other, fewer blocks than rows) against
// the CPU's BiasDropoutAddNorm: the sum bit for bit (the same float32
// operations and the CPU's dropout mask), the normalized output, mean and
// rstd within 1e-5 (the block sums add in a tree order, the CPU's in
// sequence). LayerNorm with and without biases, RMSNorm, dropout 0 and
// 0.3; rows of 33 (odd: Philox blocks straddle rows), 768 and 1,030 at the
// launch's thread counts. This checks the kernel's row, Philox-block and
// shared-memory indexing without a GPU; nvcc's code only a GPU run checks.
func TestFusedAddNormHost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: building and running the host harness takes a few seconds")
	}
	for _, c := range []struct {
		rows, cols         int
		p                  float32
		rms, bias, normBia bool
	}{
		{7, 33, 0.3, false, true, true},
		{5, 768, 0, false, false, false},
		{4, 1030, 0.3, true, true, false},
		{6, 33, 0, true, false, false},
	} {
		name := fmt.Sprintf("%dx%d-p%v-rms%v", c.rows, c.cols, c.p, c.rms)
		t.Run(name, func(t *testing.T) {
			n, cols := c.rows, c.cols
			rng := tensor.NewRNG(uint64(n*cols) + 1)
			fill := func(k int) []float32 {
				x := make([]float32, k)
				rng.Normal(x, 0, 1)
				return x
			}
			r, y, b, w, nb := fill(n*cols), fill(n*cols), fill(cols), fill(cols), fill(cols)
			drop := tensor.NewRNG(77)
			st := drop.State()
			// the CPU
			norm := tensor.Norm{RMS: c.rms, Weight: tensor.FromFloat32(w, cols), Eps: 1e-5}
			if c.normBia {
				norm.Bias = tensor.FromFloat32(nb, cols)
			}
			var bt *tensor.Tensor
			if c.bias {
				bt = tensor.FromFloat32(b, cols)
			}
			sum, out := (*tensor.Tape)(nil).BiasDropoutAddNorm(tensor.FromFloat32(r, n, cols), tensor.FromFloat32(y, n, cols), bt, c.p, drop, norm)
			// the kernel: dropout parameters as the CUDA backend's dropoutParams
			thr, keep := uint32(float64(c.p)*(1<<32)), 1/(1-c.p)
			dropout := 0
			if c.p != 0 {
				dropout = 1
			}
			threads := min(256, max(32, ((cols+3)/4+31)/32*32)) // normRowThreads
			in := append(leBytes(r), leBytes(y)...)
			if c.bias {
				in = append(in, leBytes(b)...)
			}
			in = append(in, leBytes(w)...)
			if c.normBia {
				in = append(in, leBytes(nb)...)
			}
			got := fromLE[float32](fusedHost.run(t, in, "addnorm", n, cols, 3, threads, dropout, st.Key[0], st.Key[1], st.Offset, thr,
				math.Float32bits(keep), "1e-5", b2i(c.rms), b2i(c.bias), b2i(c.normBia)))
			nStats := 2 * n
			if c.rms {
				nStats = n
			}
			if len(got) != 2*n*cols+nStats {
				t.Fatalf("%d values, want %d", len(got), 2*n*cols+nStats)
			}
			sameBitsF32(t, "sum", got[:n*cols], sum.Float32s())
			near := func(what string, g, want []float32) {
				for i := range want {
					if d := math.Abs(float64(g[i] - want[i])); d > 1e-5*math.Max(1, math.Abs(float64(want[i]))) {
						t.Fatalf("%s[%d] = %v, the CPU's %v", what, i, g[i], want[i])
					}
				}
			}
			near("out", got[n*cols:2*n*cols], out.Float32s())
			// the CPU's statistics: LayerNorm's or RMSNorm's of the sum
			mean, rstd := make([]float32, n), make([]float32, n)
			s := sum.Float32s()
			for i := range n {
				var m, v float64
				for _, x := range s[i*cols : (i+1)*cols] {
					m += float64(x)
				}
				mf := float32(m / float64(cols))
				for _, x := range s[i*cols : (i+1)*cols] {
					if c.rms {
						v += float64(x) * float64(x)
					} else {
						d := float64(x - mf)
						v += d * d
					}
				}
				mean[i], rstd[i] = mf, float32(1/math.Sqrt(v/float64(cols)+1e-5))
			}
			rest := got[2*n*cols:]
			if !c.rms {
				near("mean", rest[:n], mean)
				rest = rest[n:]
			}
			near("rstd", rest, rstd)
		})
	}
}
