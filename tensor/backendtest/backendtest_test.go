package backendtest

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// decodeChecks are the checks of the decoding methods, by method name.
var decodeChecks = map[string]func(tensor.Backend) error{
	"AllocCommitted": CheckAllocCommitted,
	"PagedKVWrite":   CheckPagedKVWrite,
	"PagedAttention": CheckPagedAttention,
	"PackedLinear":   CheckPackedLinear,
	"SampleTokens":   CheckSampleTokens,
	"TokenLogprobs":  CheckTokenLogprobs,
}

func TestCPUConformance(t *testing.T) {
	be := tensor.CPUBackend()
	for name, check := range decodeChecks {
		if err := check(be); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// backends are the backends the error-catching tests wrap: the CPU's and
// the simulated device's (whose tensors the checks move to it).
var backends = []tensor.Backend{tensor.CPUBackend(), tensor.SimBackend()}

// broken is a backend with one method's result off by one ulp in one
// element (or, for the KV write, one slot missed): each check must notice.
type broken struct {
	tensor.Backend
	method string
}

// edit lets fn change t's float32 values on the host, then writes them
// back to t's device (on the CPU, fn edits t's own storage).
func edit(t *tensor.Tensor, fn func(s []float32)) {
	h := tensor.ToHost(t)
	fn(h.Float32s())
	if h != t {
		tensor.Copy(t, h)
	}
}

// editIDs is edit for an int32 tensor.
func editIDs(t *tensor.Tensor, fn func(s []int32)) {
	h := tensor.ToHost(t)
	fn(h.Int32s())
	if h != t {
		tensor.Copy(t, h)
	}
}

// nudge moves t's middle element one ulp up.
func nudge(t *tensor.Tensor) {
	edit(t, func(s []float32) {
		i := len(s) / 2
		s[i] = math.Nextafter32(s[i], float32(math.Inf(1)))
	})
}

func (b broken) PagedAttention(out, q, kPool, vPool *tensor.Tensor, cfg tensor.PagedAttentionConfig) {
	b.Backend.PagedAttention(out, q, kPool, vPool, cfg)
	if b.method == "PagedAttention" {
		nudge(out)
	}
}

func (b broken) PagedKVWrite(kPool, vPool, k, v, slots *tensor.Tensor) {
	if b.method == "PagedKVWrite" { // the last row is not written
		n, g, d, dev := k.Dim(0)-1, k.Dim(1), k.Dim(2), k.Device()
		k = tensor.FromFloat32(tensor.ToHost(k).Float32s()[:n*g*d], n, g, d).ToDevice(dev)
		v = tensor.FromFloat32(tensor.ToHost(v).Float32s()[:n*g*d], n, g, d).ToDevice(dev)
		slots = tensor.FromInt32(tensor.ToHost(slots).Int32s()[:n], n).ToDevice(dev)
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
		editIDs(out.IDs, func(ids []int32) { ids[len(ids)-1] = (ids[len(ids)-1] + 1) % int32(vocab) })
	}
}

func (b broken) TokenLogprobs(out, logits, targets *tensor.Tensor, vocab int) {
	b.Backend.TokenLogprobs(out, logits, targets, vocab)
	if b.method == "TokenLogprobs" {
		nudge(out)
	}
}

func TestChecksCatchErrors(t *testing.T) {
	for _, be := range backends {
		for method, check := range decodeChecks {
			if method == "AllocCommitted" {
				continue
			}
			if err := check(broken{be, method}); err == nil {
				t.Errorf("%s: Check%s passed a backend whose %s is wrong", be.Name(), method, method)
			} else {
				t.Logf("%s: %s: %v", be.Name(), method, err)
			}
		}
	}
}
