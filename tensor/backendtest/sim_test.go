package backendtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// methodChecks returns every method-level check, by method name.
func methodChecks() map[string]func(tensor.Backend) error {
	all := map[string]func(tensor.Backend) error{}
	for _, m := range []map[string]func(tensor.Backend) error{decodeChecks, listAndVocabChecks, memoryChecks} {
		for name, check := range m {
			all[name] = check
		}
	}
	return all
}

// TestSimConformance runs every method-level check on the simulated
// device: its host accessors panic, so a check that reads device storage
// directly fails, and strict fails one that hands the backend a tensor
// not on its device (which the sim kernels, the CPU's, would accept).
func TestSimConformance(t *testing.T) {
	be := tensor.SimBackend()
	if be.Name() != "sim" || be.Device() != tensor.Sim || tensor.CPUBackend().Device() != tensor.CPU {
		t.Fatalf("backends %s on %v and %s on %v, want sim on sim and cpu on cpu",
			be.Name(), be.Device(), tensor.CPUBackend().Name(), tensor.CPUBackend().Device())
	}
	before := tensor.SimTransfers()
	for name, check := range methodChecks() {
		if err := check(strict{be}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if tr := tensor.SimTransfers(); tr.FromHost == before.FromHost || tr.ToHost == before.ToHost {
		t.Errorf("the checks copied nothing to or from the simulated device: %+v, then %+v", before, tr)
	}
}

// TestStrictRefusesHostTensors: strict notices a host tensor given to a
// backend on another device.
func TestStrictRefusesHostTensors(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "RowMax") {
			t.Errorf("RowMax of host tensors on sim: recovered %v, want a panic naming RowMax", r)
		}
	}()
	strict{tensor.SimBackend()}.RowMax(tensor.Zeros(2), tensor.Zeros(2, 3))
}

// strict wraps a backend, panicking when a method of the checks gets (or
// returns) a tensor that is not on the backend's device.
type strict struct{ tensor.Backend }

func (b strict) on(method string, ts ...*tensor.Tensor) {
	for i, t := range ts {
		if t != nil && t.Device() != b.Device() {
			panic(fmt.Sprintf("backendtest: %s: argument %d (%v) is on the %v device, the backend on %v", method, i, t, t.Device(), b.Device()))
		}
	}
}

func (b strict) onList(method string, ls ...*tensor.TensorList) {
	for _, l := range ls {
		if l == nil {
			continue
		}
		for i := range l.Len() {
			b.on(method, l.At(i))
		}
	}
}

func (b strict) AllocCommitted(dtype tensor.DType, shape []int) *tensor.Tensor {
	t := b.Backend.AllocCommitted(dtype, shape)
	b.on("AllocCommitted (result)", t)
	return t
}

func (b strict) PagedKVWrite(kPool, vPool, k, v, slots *tensor.Tensor) {
	b.on("PagedKVWrite", kPool, vPool, k, v, slots)
	b.Backend.PagedKVWrite(kPool, vPool, k, v, slots)
}

func (b strict) PagedAttention(out, q, kPool, vPool *tensor.Tensor, cfg tensor.PagedAttentionConfig) {
	b.on("PagedAttention", out, q, kPool, vPool, cfg.BlockTables, cfg.Spans)
	b.Backend.PagedAttention(out, q, kPool, vPool, cfg)
}

func (b strict) PackWeight(w *tensor.Tensor, dtype tensor.DType) *tensor.PackedWeight {
	b.on("PackWeight", w)
	pw := b.Backend.PackWeight(w, dtype)
	if pw.Device() != b.Device() {
		panic(fmt.Sprintf("backendtest: PackWeight returned a weight on %v, the backend on %v", pw.Device(), b.Device()))
	}
	return pw
}

func (b strict) PackedLinear(out, x *tensor.Tensor, w *tensor.PackedWeight, bias *tensor.Tensor) {
	b.on("PackedLinear", out, x, bias)
	b.Backend.PackedLinear(out, x, w, bias)
}

func (b strict) SampleTokens(out tensor.SampledTokens, logits *tensor.Tensor, vocab int, draws []tensor.TokenSampling) {
	b.on("SampleTokens", out.IDs, out.Logprobs, out.TopIDs, out.TopLogprobs, logits)
	b.Backend.SampleTokens(out, logits, vocab, draws)
}

func (b strict) TokenLogprobs(out, logits, targets *tensor.Tensor, vocab int) {
	b.on("TokenLogprobs", out, logits, targets)
	b.Backend.TokenLogprobs(out, logits, targets, vocab)
}

func (b strict) AdamW(p, g, m, v *tensor.TensorList, c []tensor.AdamWCoeffs) {
	b.onList("AdamW", p, g, m, v)
	b.Backend.AdamW(p, g, m, v, c)
}

func (b strict) SGD(p, g, buf *tensor.TensorList, c []tensor.SGDCoeffs) {
	b.onList("SGD", p, g, buf)
	b.Backend.SGD(p, g, buf, c)
}

func (b strict) ScaleList(l *tensor.TensorList, alpha float32) {
	b.onList("ScaleList", l)
	b.Backend.ScaleList(l, alpha)
}

func (b strict) SumSquares(out *tensor.Tensor, l *tensor.TensorList) {
	b.on("SumSquares", out)
	b.onList("SumSquares", l)
	b.Backend.SumSquares(out, l)
}

func (b strict) MaxAbs(l *tensor.TensorList) float64 {
	b.onList("MaxAbs", l)
	return b.Backend.MaxAbs(l)
}

func (b strict) NonFinite(out *tensor.Tensor, l *tensor.TensorList) {
	b.on("NonFinite", out)
	b.onList("NonFinite", l)
	b.Backend.NonFinite(out, l)
}

func (b strict) VocabEmbeddingForward(out, table, ids *tensor.Tensor, start int) {
	b.on("VocabEmbeddingForward", out, table, ids)
	b.Backend.VocabEmbeddingForward(out, table, ids, start)
}

func (b strict) VocabEmbeddingBackward(dtable, dout, ids *tensor.Tensor, start int) {
	b.on("VocabEmbeddingBackward", dtable, dout, ids)
	b.Backend.VocabEmbeddingBackward(dtable, dout, ids, start)
}

func (b strict) RowMax(m, x *tensor.Tensor) {
	b.on("RowMax", m, x)
	b.Backend.RowMax(m, x)
}

func (b strict) VocabCrossEntropyPartials(partials, x, rowMax, targets *tensor.Tensor, start int) {
	b.on("VocabCrossEntropyPartials", partials, x, rowMax, targets)
	b.Backend.VocabCrossEntropyPartials(partials, x, rowMax, targets, start)
}

func (b strict) VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask *tensor.Tensor) {
	b.on("VocabCrossEntropyLoss", loss, lse, den, partials, rowMax, mask)
	b.Backend.VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask)
}

func (b strict) VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den *tensor.Tensor, start int) {
	b.on("VocabCrossEntropyBackward", dx, x, lse, targets, mask, dloss, den)
	b.Backend.VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den, start)
}

func (b strict) Fill(t *tensor.Tensor, v float32) {
	b.on("Fill", t)
	b.Backend.Fill(t, v)
}

func (b strict) CopyStrided(dst, src *tensor.Tensor) {
	b.on("CopyStrided", dst, src)
	b.Backend.CopyStrided(dst, src)
}

func (b strict) ScatterAddStrided(dst, v, g *tensor.Tensor) {
	b.on("ScatterAddStrided", dst, v, g)
	b.Backend.ScatterAddStrided(dst, v, g)
}

func (b strict) SumAll(out, x *tensor.Tensor) {
	b.on("SumAll", out, x)
	b.Backend.SumAll(out, x)
}

func (b strict) RowSum(out, x *tensor.Tensor) {
	b.on("RowSum", out, x)
	b.Backend.RowSum(out, x)
}

func (b strict) RowArgMax(out, arg, x *tensor.Tensor) {
	b.on("RowArgMax", out, arg, x)
	b.Backend.RowArgMax(out, arg, x)
}

func (b strict) AddRowBroadcast(dx, g *tensor.Tensor) {
	b.on("AddRowBroadcast", dx, g)
	b.Backend.AddRowBroadcast(dx, g)
}

func (b strict) AddAtRowIndex(dx, arg, g *tensor.Tensor) {
	b.on("AddAtRowIndex", dx, arg, g)
	b.Backend.AddAtRowIndex(dx, arg, g)
}

func (b strict) DropoutMask(mask *tensor.Tensor, p float32, rng tensor.RNGState) {
	b.on("DropoutMask", mask)
	b.Backend.DropoutMask(mask, p, rng)
}

func (b strict) LossMaskMean(out, w, den, losses, mask *tensor.Tensor) {
	b.on("LossMaskMean", out, w, den, losses, mask)
	b.Backend.LossMaskMean(out, w, den, losses, mask)
}

func (b strict) LossMaskScale(w, dout, den *tensor.Tensor) {
	b.on("LossMaskScale", w, dout, den)
	b.Backend.LossMaskScale(w, dout, den)
}

func (b strict) Convert(dst, src *tensor.Tensor) {
	b.on("Convert", dst, src)
	b.Backend.Convert(dst, src)
}
