package backendtest

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

func TestCPUConformance(t *testing.T) {
	be := tensor.CPUBackend()
	for name, check := range map[string]func(tensor.Backend) error{
		"AllocCommitted": CheckAllocCommitted,
		"PagedKVWrite":   CheckPagedKVWrite,
		"PagedAttention": CheckPagedAttention,
		"PackedLinear":   CheckPackedLinear,
		"SampleTokens":   CheckSampleTokens,
		"TokenLogprobs":  CheckTokenLogprobs,
	} {
		if err := check(be); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// broken is the CPU backend with one method's result off by one ulp in
// one element (or, for the KV write, one slot missed): each check must
// notice.
type broken struct {
	tensor.Backend
	method string
}

func nudge(t *tensor.Tensor) {
	s := t.Float32s()
	i := len(s) / 2
	s[i] = math.Nextafter32(s[i], float32(math.Inf(1)))
}

func (b broken) PagedAttention(out, q, kPool, vPool *tensor.Tensor, cfg tensor.PagedAttentionConfig) {
	b.Backend.PagedAttention(out, q, kPool, vPool, cfg)
	if b.method == "PagedAttention" {
		nudge(out)
	}
}

func (b broken) PagedKVWrite(kPool, vPool, k, v, slots *tensor.Tensor) {
	if b.method == "PagedKVWrite" { // the last row is not written
		n, g, d := k.Dim(0)-1, k.Dim(1), k.Dim(2)
		k = tensor.FromFloat32(k.Float32s()[:n*g*d], n, g, d)
		v = tensor.FromFloat32(v.Float32s()[:n*g*d], n, g, d)
		slots = tensor.FromInt32(slots.Int32s()[:n], n)
	}
	b.Backend.PagedKVWrite(kPool, vPool, k, v, slots)
}

func (b broken) PackedLinear(out, x *tensor.Tensor, w *tensor.PackedWeight, bias *tensor.Tensor) {
	b.Backend.PackedLinear(out, x, w, bias)
	if b.method == "PackedLinear" && bias != nil {
		nudge(out)
	}
}

func (b broken) SampleTokens(out tensor.SampledTokens, logits *tensor.Tensor, vocab int, draws []tensor.TokenSampling) {
	b.Backend.SampleTokens(out, logits, vocab, draws)
	if b.method == "SampleTokens" { // the last draw takes the next id
		ids := out.IDs.Int32s()
		ids[len(ids)-1] = (ids[len(ids)-1] + 1) % int32(vocab)
	}
}

func (b broken) TokenLogprobs(out, logits, targets *tensor.Tensor, vocab int) {
	b.Backend.TokenLogprobs(out, logits, targets, vocab)
	if b.method == "TokenLogprobs" {
		nudge(out)
	}
}

func TestChecksCatchErrors(t *testing.T) {
	for method, check := range map[string]func(tensor.Backend) error{
		"PagedAttention": CheckPagedAttention,
		"PagedKVWrite":   CheckPagedKVWrite,
		"PackedLinear":   CheckPackedLinear,
		"SampleTokens":   CheckSampleTokens,
		"TokenLogprobs":  CheckTokenLogprobs,
	} {
		if err := check(broken{tensor.CPUBackend(), method}); err == nil {
			t.Errorf("Check%s passed a backend whose %s is wrong", method, method)
		} else {
			t.Logf("%s: %v", method, err)
		}
	}
}
