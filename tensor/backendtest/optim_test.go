package backendtest

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// listAndVocabChecks are the checks of the optimizer, gradient-statistics
// and vocab-parallel methods, by method name.
var listAndVocabChecks = map[string]func(tensor.Backend) error{
	"AdamW":                     CheckAdamW,
	"SGD":                       CheckSGD,
	"ScaleList":                 CheckScaleList,
	"SumSquares":                CheckSumSquares,
	"MaxAbs":                    CheckMaxAbs,
	"NonFinite":                 CheckNonFinite,
	"VocabEmbeddingForward":     CheckVocabEmbedding,
	"VocabEmbeddingBackward":    CheckVocabEmbedding,
	"RowMax":                    CheckRowMax,
	"VocabCrossEntropyPartials": CheckVocabCrossEntropy,
	"VocabCrossEntropyLoss":     CheckVocabCrossEntropy,
	"VocabCrossEntropyBackward": CheckVocabCrossEntropy,
}

// memoryChecks are the checks of the memory, reduction and tape
// bookkeeping methods, by method name.
var memoryChecks = map[string]func(tensor.Backend) error{
	"Fill":              CheckFill,
	"CopyStrided":       CheckCopyStrided,
	"ScatterAddStrided": CheckScatterAddStrided,
	"SumAll":            CheckReductions,
	"RowSum":            CheckReductions,
	"RowArgMax":         CheckReductions,
	"AddRowBroadcast":   CheckRowAdds,
	"AddAtRowIndex":     CheckRowAdds,
	"DropoutMask":       CheckDropoutMask,
	"LossMaskMean":      CheckLossMask,
	"LossMaskScale":     CheckLossMask,
	"Convert":           CheckConvert,
}

func TestCPUMemoryConformance(t *testing.T) {
	be := tensor.CPUBackend()
	for name, check := range memoryChecks {
		if err := check(be); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCPUListAndVocabConformance(t *testing.T) {
	be := tensor.CPUBackend()
	for name, check := range listAndVocabChecks {
		if err := check(be); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// wrongList is a backend with one list or vocab method's result off
// by one ulp in one element (a statistic by one ulp, NonFinite negated):
// each check must notice.
type wrongList struct {
	tensor.Backend
	method string
}

// nudgeList moves the middle element of the list's last tensor one ulp up.
func nudgeList(l *tensor.TensorList) { nudge(l.At(l.Len() - 1)) }

func (b wrongList) AdamW(p, g, m, v *tensor.TensorList, c []tensor.AdamWCoeffs) {
	b.Backend.AdamW(p, g, m, v, c)
	if b.method == "AdamW" {
		nudgeList(v)
	}
}

func (b wrongList) SGD(p, g, buf *tensor.TensorList, c []tensor.SGDCoeffs) {
	b.Backend.SGD(p, g, buf, c)
	if b.method == "SGD" {
		nudgeList(p)
	}
}

func (b wrongList) ScaleList(l *tensor.TensorList, alpha float32) {
	b.Backend.ScaleList(l, alpha)
	if b.method == "ScaleList" {
		nudgeList(l)
	}
}

func (b wrongList) SumSquares(out *tensor.Tensor, l *tensor.TensorList) {
	b.Backend.SumSquares(out, l)
	if b.method == "SumSquares" {
		s := math.Nextafter(tensor.Float64Bits(tensor.ToHost(out)), math.Inf(1))
		h := tensor.New(tensor.Int64, 1)
		h.Int64s()[0] = int64(math.Float64bits(s))
		tensor.Copy(out, h)
	}
}

func (b wrongList) MaxAbs(l *tensor.TensorList) float64 {
	m := b.Backend.MaxAbs(l)
	if b.method == "MaxAbs" {
		m = math.Nextafter(m, math.Inf(1))
	}
	return m
}

func (b wrongList) NonFinite(out *tensor.Tensor, l *tensor.TensorList) {
	b.Backend.NonFinite(out, l)
	if b.method == "NonFinite" {
		tensor.Copy(out, tensor.FromInt32([]int32{1 - tensor.ToHost(out).Int32s()[0]}, 1))
	}
}

func (b wrongList) VocabEmbeddingForward(out, table, ids *tensor.Tensor, start int) {
	b.Backend.VocabEmbeddingForward(out, table, ids, start)
	if b.method == "VocabEmbeddingForward" {
		nudge(out)
	}
}

func (b wrongList) VocabEmbeddingBackward(dtable, dout, ids *tensor.Tensor, start int) {
	b.Backend.VocabEmbeddingBackward(dtable, dout, ids, start)
	if b.method == "VocabEmbeddingBackward" {
		nudge(dtable)
	}
}

func (b wrongList) RowMax(m, x *tensor.Tensor) {
	b.Backend.RowMax(m, x)
	if b.method == "RowMax" {
		nudge(m)
	}
}

func (b wrongList) VocabCrossEntropyPartials(partials, x, rowMax, targets *tensor.Tensor, start int) {
	b.Backend.VocabCrossEntropyPartials(partials, x, rowMax, targets, start)
	if b.method == "VocabCrossEntropyPartials" { // a target logit (checked exactly)
		nudge(partials)
	}
}

func (b wrongList) VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask *tensor.Tensor) {
	b.Backend.VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask)
	if b.method == "VocabCrossEntropyLoss" {
		nudge(lse)
	}
}

func (b wrongList) VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den *tensor.Tensor, start int) {
	b.Backend.VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den, start)
	if b.method == "VocabCrossEntropyBackward" { // far beyond the tolerance
		edit(dx, func(s []float32) { s[len(s)/2] += 0.01 })
	}
}

func TestListAndVocabChecksCatchErrors(t *testing.T) {
	for _, be := range backends {
		for method, check := range listAndVocabChecks {
			if err := check(wrongList{be, method}); err == nil {
				t.Errorf("%s: the check of %s passed a backend whose %s is wrong", be.Name(), method, method)
			} else {
				t.Logf("%s: %s: %v", be.Name(), method, err)
			}
		}
	}
}
