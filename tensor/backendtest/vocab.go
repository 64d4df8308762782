package backendtest

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// vocabCase is one rank's share of a vocab-parallel op: n rows over the
// vocabulary slice [Start, Start+V) of a vocabulary of Full ids.
type vocabCase struct {
	N, V, Start, Full int
}

// vocabCases: the first, a middle and the last slice of a vocabulary, with
// widths on and off the vector lengths.
var vocabCases = []vocabCase{
	{N: 7, V: 24, Start: 0, Full: 72},
	{N: 13, V: 37, Start: 37, Full: 111},
	{N: 5, V: 64, Start: 128, Full: 192},
}

// ids returns n ids over [0, full), some repeated, most outside the slice.
func (c vocabCase) ids(seed int) []int32 {
	out := make([]int32, c.N)
	for i := range out {
		out[i] = int32((i*i*7 + seed*13 + i) % c.Full)
	}
	out[c.N-1] = out[0] // a repeated id
	out[c.N/2] = int32(c.Start + c.V - 1)
	return out
}

// normals returns n normal values of standard deviation sd from seed.
func normals(n int, seed uint64, sd float32) []float32 {
	x := make([]float32, n)
	tensor.NewRNG(seed).Normal(x, 0, sd)
	return x
}

// CheckVocabEmbedding checks be.VocabEmbeddingForward (rows of the slice
// copied, others zero) and be.VocabEmbeddingBackward (rows summed in order
// into a gradient it overwrites), bit for bit.
func CheckVocabEmbedding(be tensor.Backend) error {
	const h = 9
	dev := be.Device()
	for ci, c := range vocabCases {
		ids := c.ids(ci)
		table, dout := normals(c.V*h, uint64(ci)+1, 1), normals(c.N*h, uint64(ci)+11, 1)
		wantOut, wantD := make([]float32, c.N*h), make([]float32, c.V*h)
		for i, id := range ids {
			if j := int(id) - c.Start; j >= 0 && j < c.V {
				copy(wantOut[i*h:(i+1)*h], table[j*h:(j+1)*h])
				for k := range h {
					wantD[j*h+k] += dout[i*h+k]
				}
			}
		}
		// Outputs filled with values they must overwrite.
		out, d := onDev(dev, normals(c.N*h, 99, 1), c.N, h), onDev(dev, normals(c.V*h, 98, 1), c.V, h)
		idsT := idsOn(dev, ids, c.N)
		be.VocabEmbeddingForward(out, onDev(dev, table, c.V, h), idsT, c.Start)
		if err := sameBits(fmt.Sprintf("case %d: embedding", ci), host(out), wantOut); err != nil {
			return err
		}
		be.VocabEmbeddingBackward(d, onDev(dev, dout, c.N, h), idsT, c.Start)
		if err := sameBits(fmt.Sprintf("case %d: table gradient", ci), host(d), wantD); err != nil {
			return err
		}
	}
	return nil
}

// CheckRowMax compares be.RowMax with each row's maximum, exactly.
func CheckRowMax(be tensor.Backend) error {
	for ci, c := range vocabCases {
		x := normals(c.N*c.V, uint64(ci)+21, 3)
		x[c.V-1] = 40 // a row's maximum in its last column
		want := make([]float32, c.N)
		for i := range want {
			want[i] = float32(math.Inf(-1))
			for _, v := range x[i*c.V : (i+1)*c.V] {
				want[i] = max(want[i], v)
			}
		}
		m := tensor.ZerosOn(be.Device(), c.N)
		be.RowMax(m, onDev(be.Device(), x, c.N, c.V))
		if err := sameBits(fmt.Sprintf("case %d: row max", ci), host(m), want); err != nil {
			return err
		}
	}
	return nil
}

// within reports |got − want| <= tol·|want| + abs.
func within(got, want, tol, abs float64) bool {
	return math.Abs(got-want) <= tol*math.Abs(want)+abs
}

// CheckVocabCrossEntropy runs the three cross-entropy steps of one rank
// (with and without a mask) and checks each against float64 references:
// the partials' sums of exponentials to 1e-5 relative (a backend's exp need
// not be correctly rounded), their target logits exactly; the log-sum-exp,
// loss and Σ mask exactly (they are float64 sums of the partials, in row
// order); the gradient to 1e-5 of the row's scale.
func CheckVocabCrossEntropy(be tensor.Backend) error {
	for ci, c := range vocabCases {
		for _, masked := range []bool{false, true} {
			if err := checkVocabCE(be, ci, c, masked); err != nil {
				return fmt.Errorf("case %d, mask %v: %w", ci, masked, err)
			}
		}
	}
	return nil
}

func checkVocabCE(be tensor.Backend, ci int, c vocabCase, masked bool) error {
	dev := be.Device()
	x := normals(c.N*c.V, uint64(ci)+31, 3)
	targets := c.ids(ci + 5)
	rowMax := make([]float32, c.N)
	for i := range rowMax { // a "global" max above the slice's own for some rows
		rowMax[i] = x[i*c.V] + float32(i%3)
		for _, v := range x[i*c.V : (i+1)*c.V] {
			rowMax[i] = max(rowMax[i], v)
		}
	}
	var mask *tensor.Tensor
	w := func(int) float64 { return 1 }
	if masked {
		mk := make([]float32, c.N)
		for i := range mk {
			mk[i] = float32(i%3) * 0.5
		}
		mask = onDev(dev, mk, c.N)
		w = func(i int) float64 { return float64(mk[i]) }
	}
	xT, tgT, mT := onDev(dev, x, c.N, c.V), idsOn(dev, targets, c.N), onDev(dev, rowMax, c.N)

	// Partials.
	partials := onDev(dev, normals(2*c.N, 97, 1), 2, c.N) // overwritten
	be.VocabCrossEntropyPartials(partials, xT, mT, tgT, c.Start)
	got := host(partials)
	for i := range c.N {
		s := 0.0
		for _, v := range x[i*c.V : (i+1)*c.V] {
			s += math.Exp(float64(v) - float64(rowMax[i]))
		}
		if !within(float64(got[i]), s, 1e-5, 0) {
			return fmt.Errorf("row %d: sum of exponentials %v, want %v", i, got[i], s)
		}
		var t float32
		if j := int(targets[i]) - c.Start; j >= 0 && j < c.V {
			t = x[i*c.V+j] - rowMax[i]
		}
		if math.Float32bits(got[c.N+i]) != math.Float32bits(t) {
			return fmt.Errorf("row %d: target logit %v, want %v", i, got[c.N+i], t)
		}
	}

	// Loss, from the partials as computed (a reduction would sum them).
	loss, lse := tensor.ZerosOn(dev, 1), tensor.ZerosOn(dev, c.N)
	denT := tensor.NewOn(dev, tensor.Int64, 1)
	be.VocabCrossEntropyLoss(loss, lse, denT, partials, mT, mask)
	den := tensor.Float64Bits(tensor.ToHost(denT))
	var num, wantDen float64
	wantLSE := make([]float32, c.N)
	for i := range c.N {
		l := math.Log(float64(got[i]))
		wantLSE[i] = float32(float64(rowMax[i]) + l)
		num += (l - float64(got[c.N+i])) * w(i)
		wantDen += w(i)
	}
	if den != wantDen {
		return fmt.Errorf("mask sum Σ = %v, want %v", den, wantDen)
	}
	if err := sameBits("log-sum-exp", host(lse), wantLSE); err != nil {
		return err
	}
	if err := sameBits("loss", host(loss), []float32{float32(num / wantDen)}); err != nil {
		return err
	}

	// Gradient.
	const dl = float32(0.7)
	dx := onDev(dev, normals(c.N*c.V, 96, 1), c.N, c.V) // overwritten
	be.VocabCrossEntropyBackward(dx, xT, lse, tgT, mask, onDev(dev, []float32{dl}, 1), denT, c.Start)
	g := host(dx)
	for i := range c.N {
		scale := float64(dl * float32(w(i)) / float32(den))
		for j := range c.V {
			want := scale * math.Exp(float64(x[i*c.V+j])-float64(wantLSE[i]))
			if int(targets[i])-c.Start == j {
				want -= scale
			}
			if !within(float64(g[i*c.V+j]), want, 0, 1e-5*math.Abs(scale)) {
				return fmt.Errorf("d loss/d x[%d][%d] = %v, want %v", i, j, g[i*c.V+j], want)
			}
		}
	}
	return nil
}
