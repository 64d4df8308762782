package backendtest

import (
	"fmt"
	"math"
	"sort"

	"github.com/gotron/gotron/tensor"
)

// samplingLogits returns rows×V logits: normal·3 in the first vocab
// columns and a padded tail of +100, which no draw may pick; row 0 is
// [1 2 2 2 2 0] (ties) when vocab is 6.
func samplingLogits(rows, V, vocab int, seed uint64) []float32 {
	x := make([]float32, rows*V)
	tensor.NewRNG(seed).Normal(x, 0, 3)
	for r := range rows {
		for i := vocab; i < V; i++ {
			x[r*V+i] = 100
		}
	}
	if vocab == 6 {
		copy(x, []float32{1, 2, 2, 2, 2, 0})
	}
	return x
}

// CheckSampleTokens runs be.SampleTokens on greedy, plain, temperature,
// top-k and top-p draws with log-probabilities and compares the ids and
// the log-probabilities, bit for bit, with SampleRef and a direct
// log-softmax; and checks that tied logits are kept lower id first.
func CheckSampleTokens(be tensor.Backend) error {
	rules := []tensor.TokenSampling{
		{TopK: 1}, {}, {Temperature: 0.7}, {TopK: 2}, {TopK: 50, Temperature: 0.8}, {TopK: 5000},
		{TopP: 0.1}, {TopP: 0.5}, {TopP: 0.9, Temperature: 0.7}, {TopP: 1},
	}
	us := []float32{1e-7, 0.1, 0.5, 0.9, 0.999999, 1}
	dev := be.Device()
	for _, sh := range [][3]int{{4, 1000, 1000}, {3, 1030, 1000}, {2, 8, 6}} {
		rows, V, vocab := sh[0], sh[1], sh[2]
		logits := samplingLogits(rows, V, vocab, uint64(V))
		var draws []tensor.TokenSampling
		for ri, r := range rules {
			for ui, u := range us {
				d := r
				if d.Temperature == 0 {
					d.Temperature = 1
				}
				d.Row, d.U = (ri+ui)%rows, u
				d.Logprob = ui%2 == 0
				d.TopLogprobs = []int{0, 3, 0, 1, 0, 7}[ui]
				draws = append(draws, d)
			}
		}
		n, k := len(draws), 7
		out := tensor.SampledTokens{
			IDs: tensor.NewOn(dev, tensor.Int32, n), Logprobs: tensor.ZerosOn(dev, n),
			TopIDs: tensor.NewOn(dev, tensor.Int32, n, k), TopLogprobs: tensor.ZerosOn(dev, n, k),
		}
		be.SampleTokens(out, onDev(dev, logits, rows, V), vocab, draws)
		ids, lps := hostIDs(out.IDs), host(out.Logprobs)
		topIDs, topLPs := hostIDs(out.TopIDs), host(out.TopLogprobs)
		for i, d := range draws {
			row := logits[d.Row*V : d.Row*V+vocab]
			name := fmt.Sprintf("V=%d vocab=%d draw %d %+v", V, vocab, i, d)
			want := SampleRef(row, d)
			if int(ids[i]) != want {
				return fmt.Errorf("%s: drew %d, want %d", name, ids[i], want)
			}
			lse := logSumExpRef(row)
			if d.Logprob {
				if w := float32(float64(row[want]) - lse); math.Float32bits(lps[i]) != math.Float32bits(w) {
					return fmt.Errorf("%s: logprob %v, want %v", name, lps[i], w)
				}
			}
			top := make([]int, vocab)
			for j := range top {
				top[j] = j
			}
			sort.SliceStable(top, func(a, b int) bool { return row[top[a]] > row[top[b]] })
			for j := range min(d.TopLogprobs, vocab) {
				w := float32(float64(row[top[j]]) - lse)
				if g := topLPs[i*k+j]; int(topIDs[i*k+j]) != top[j] || math.Float32bits(g) != math.Float32bits(w) {
					return fmt.Errorf("%s: top logprob %d: token %d (%v), want %d (%v)", name, j, topIDs[i*k+j], g, top[j], w)
				}
			}
		}
	}
	// Ties: of [1 2 2 2 2 0], top-3 keeps ids 1, 2, 3 (lower id first), so
	// three equal thirds of U's range pick them in that order.
	logits := samplingLogits(1, 6, 6, 1)
	draws := []tensor.TokenSampling{{TopK: 3, Temperature: 1, U: 0.1}, {TopK: 3, Temperature: 1, U: 0.5}, {TopK: 3, Temperature: 1, U: 0.9}}
	idsT := tensor.NewOn(dev, tensor.Int32, 3)
	be.SampleTokens(tensor.SampledTokens{IDs: idsT}, onDev(dev, logits, 1, 6), 6, draws)
	ids := hostIDs(idsT)
	if ids[0] != 1 || ids[1] != 2 || ids[2] != 3 {
		return fmt.Errorf("top-3 of tied logits %v drew %v for U 0.1, 0.5, 0.9; want [1 2 3]", logits, ids)
	}
	return nil
}

// SampleRef is the token d draws from row (the vocabulary), by sorting:
// the specification tensor.SampleTokens's partial selection matches. The
// kept tokens are ordered most probable first (ties: lower id first), or
// by id without filtering; the weights exp(p−max) are summed in that
// order, except top-p's threshold, which uses the sum over the whole
// vocabulary in id order.
func SampleRef(row []float32, d tensor.TokenSampling) int {
	if d.TopK == 1 {
		best := 0
		for i, v := range row {
			if v > row[best] {
				best = i
			}
		}
		return best
	}
	n := len(row)
	p, order := make([]float64, n), make([]int, n)
	for i, l := range row {
		p[i] = float64(l) / d.Temperature
		order[i] = i
	}
	byP := func(a, b int) bool { return p[order[a]] > p[order[b]] }
	kept := order
	switch {
	case d.TopK > 1:
		sort.SliceStable(order, byP)
		kept = order[:min(d.TopK, n)]
	case d.TopP > 0:
		mx := math.Inf(-1)
		for _, v := range p {
			mx = math.Max(mx, v)
		}
		var total float64
		for i := range p {
			p[i] = math.Exp(p[i] - mx)
			total += p[i]
		}
		sort.SliceStable(order, byP)
		cum, m := 0.0, 0
		for m < n && cum <= d.TopP*total {
			cum += p[order[m]]
			m++
		}
		return pickRef(p, order[:m], d.U)
	}
	mx := math.Inf(-1)
	for _, i := range kept {
		mx = math.Max(mx, p[i])
	}
	for _, i := range kept {
		p[i] = math.Exp(p[i] - mx)
	}
	return pickRef(p, kept, d.U)
}

// pickRef returns the kept token at which u·Σp falls below the running
// sum (the last when rounding leaves a remainder).
func pickRef(p []float64, kept []int, u float32) int {
	var sum float64
	for _, i := range kept {
		sum += p[i]
	}
	r := float64(u) * sum
	for _, i := range kept {
		if r -= p[i]; r < 0 {
			return i
		}
	}
	return kept[len(kept)-1]
}

func logSumExpRef(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(sum)
}

// CheckTokenLogprobs compares be.TokenLogprobs with a direct float64
// log-softmax, bit for bit, on rows whose padded tail must be ignored.
func CheckTokenLogprobs(be tensor.Backend) error {
	rows, V, vocab := 5, 300, 257
	logits := samplingLogits(rows, V, vocab, 11)
	targets := []int32{0, 256, 17, 100, 3}
	dev := be.Device()
	outT := tensor.ZerosOn(dev, rows)
	be.TokenLogprobs(outT, onDev(dev, logits, rows, V), idsOn(dev, targets, rows), vocab)
	out := host(outT)
	for i, t := range targets {
		row := logits[i*V : i*V+vocab]
		if w := float32(float64(row[t]) - logSumExpRef(row)); math.Float32bits(out[i]) != math.Float32bits(w) {
			return fmt.Errorf("row %d target %d: %v, want %v", i, t, out[i], w)
		}
	}
	return nil
}
