package tensor

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// Device is where a tensor's storage lives, and so which Backend computes
// on it. Every op's output is on its inputs' device; an op given tensors of
// two devices panics naming them. Tensors cross devices only through the
// explicit copies (ToDevice, ToHost, Copy), at the program's I/O
// boundaries: data loading, checkpoints, logging, communication staging.
type Device uint8

const (
	// CPU is host memory computed on by internal/cpu's kernels; its host
	// accessors (Float32s, ...) alias the storage. The zero value.
	CPU Device = iota
	// Sim is a development aid, a simulated device that proves the device
	// seam without a GPU: its buffers are host memory the rest of the
	// program may not read — Float32s, Int32s, At, ... panic on them — so
	// code that reaches around the backend fails; host access goes through
	// the explicit copies, which it counts (SimTransfers); its arithmetic is
	// the CPU kernels', so results are the CPU's bit for bit.
	Sim
	// CUDA is an NVIDIA GPU (tensor/cuda.go): device memory the host reads
	// only through the explicit copies, computed on by internal/cuda's
	// kernels and cuBLAS. A process opens one GPU (OpenCUDA, OpenDevice).
	CUDA
)

// String returns "cpu", "sim" or "cuda".
func (d Device) String() string {
	switch d {
	case CPU:
		return "cpu"
	case Sim:
		return "sim"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("device(%d)", uint8(d))
}

// ParseDevice parses a --device value: "cpu", "sim", or "cuda" / "cuda:N"
// (the GPU must then be opened, OpenCUDA; OpenDevice parses and opens).
func ParseDevice(s string) (Device, error) {
	switch s {
	case "", "cpu":
		return CPU, nil
	case "sim":
		return Sim, nil
	}
	if _, ok, err := parseCUDA(s); ok {
		if err != nil {
			return CPU, err
		}
		return CUDA, nil
	}
	return CPU, fmt.Errorf("tensor: device %q: want cpu, cuda, cuda:N or sim (sim: the simulated device, a development aid)", s)
}

// Transfers counts the copies between the host and a device (the
// simulated one, SimTransfers, or the GPU, CUDATransfers).
type Transfers struct {
	// ToHost and FromHost count copies out of and into device storage;
	// ToHostBytes and FromHostBytes their sizes, Bytes the two together.
	ToHost, FromHost, Bytes    int64
	ToHostBytes, FromHostBytes int64
	// Sites counts them by what made them: the function outside package
	// tensor that asked for the copy ("train.batchTo"), or the backend's
	// own copies by name ("tensor list tables", "SumSquares read-back").
	// Nil when there were none.
	Sites map[string]SiteTransfers
}

// SiteTransfers counts one site's copies: in (host to device), out.
type SiteTransfers struct{ In, Out int64 }

// Sub returns t − u, field by field and site by site (sites left with no
// copies are dropped).
func (t Transfers) Sub(u Transfers) Transfers {
	d := Transfers{ToHost: t.ToHost - u.ToHost, FromHost: t.FromHost - u.FromHost, Bytes: t.Bytes - u.Bytes,
		ToHostBytes: t.ToHostBytes - u.ToHostBytes, FromHostBytes: t.FromHostBytes - u.FromHostBytes}
	for k, v := range t.Sites {
		w := u.Sites[k]
		if v.In != w.In || v.Out != w.Out {
			if d.Sites == nil {
				d.Sites = map[string]SiteTransfers{}
			}
			d.Sites[k] = SiteTransfers{In: v.In - w.In, Out: v.Out - w.Out}
		}
	}
	return d
}

// Add returns t + u, field by field and site by site.
func (t Transfers) Add(u Transfers) Transfers {
	s := Transfers{ToHost: t.ToHost + u.ToHost, FromHost: t.FromHost + u.FromHost, Bytes: t.Bytes + u.Bytes,
		ToHostBytes: t.ToHostBytes + u.ToHostBytes, FromHostBytes: t.FromHostBytes + u.FromHostBytes}
	for _, m := range []map[string]SiteTransfers{t.Sites, u.Sites} {
		for k, v := range m {
			if s.Sites == nil {
				s.Sites = map[string]SiteTransfers{}
			}
			w := s.Sites[k]
			s.Sites[k] = SiteTransfers{In: w.In + v.In, Out: w.Out + v.Out}
		}
	}
	return s
}

// copyCounter counts one device's host copies, in all and by site.
type copyCounter struct {
	toHost, fromHost, toHostBytes, fromHostBytes atomic.Int64

	mu    sync.Mutex
	sites map[string]SiteTransfers
}

// count records one copy of n bytes, out of the device when out is set,
// made by site ("" names the caller outside the copy helpers).
func (c *copyCounter) count(site string, out bool, n int64) {
	if site == "" {
		site = copySite()
	}
	if out {
		c.toHost.Add(1)
		c.toHostBytes.Add(n)
	} else {
		c.fromHost.Add(1)
		c.fromHostBytes.Add(n)
	}
	c.mu.Lock()
	if c.sites == nil {
		c.sites = map[string]SiteTransfers{}
	}
	s := c.sites[site]
	if out {
		s.Out++
	} else {
		s.In++
	}
	c.sites[site] = s
	c.mu.Unlock()
}

// snapshot returns the counts so far.
func (c *copyCounter) snapshot() Transfers {
	t := Transfers{ToHost: c.toHost.Load(), FromHost: c.fromHost.Load(),
		ToHostBytes: c.toHostBytes.Load(), FromHostBytes: c.fromHostBytes.Load()}
	t.Bytes = t.ToHostBytes + t.FromHostBytes
	c.mu.Lock()
	if len(c.sites) > 0 {
		t.Sites = make(map[string]SiteTransfers, len(c.sites))
		for k, v := range c.sites {
			t.Sites[k] = v
		}
	}
	c.mu.Unlock()
	return t
}

// copySite names the function that asked for a copy: the first caller
// outside package tensor's copy helpers ("train.batchTo"), or "tensor" when
// every frame is one.
func copySite() string {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		name := f.Function[strings.LastIndex(f.Function, "/")+1:]
		switch name {
		case "tensor.copyToCUDA", "tensor.copyFromCUDA", "tensor.toCUDA", "tensor.fromCUDA", "tensor.(*Tensor).ToDevice",
			"tensor.ToHost", "tensor.Copy", "tensor.(*cudaRuntime).timed", "tensor.countTransfer", "tensor.MoveParams",
			"tensor.(*copyCounter).count", "tensor.ReadBack", "tensor.readBackPacked", "tensor.SumSquares", "tensor.NonFinite":
		default:
			if name != "" {
				return trimClosure(name)
			}
		}
		if !more {
			return "tensor"
		}
	}
}

// trimClosure names a closure by its function: "train.batchTo.func1" is
// "train.batchTo".
func trimClosure(name string) string {
	for {
		i := strings.LastIndex(name, ".func")
		if i < 0 || strings.Trim(name[i+len(".func"):], "0123456789.") != "" {
			return name
		}
		name = name[:i]
	}
}

// simTransfers is the process's count (the simulated device is one per
// process, as a GPU is).
var simTransfers copyCounter

// SimTransfers returns the number of host copies of sim tensors so far:
// the explicit copies and the ones the simulated backend counts where the
// CUDA backend makes its own (list tables, optimizer coefficients,
// read-back statistics), so that a run on it counts a GPU's copies.
func SimTransfers() Transfers { return simTransfers.snapshot() }

// countTransfer records a copy of t's elements from device from to device
// to (nothing when neither is sim).
func countTransfer(from, to Device, t *Tensor) {
	n := int64(t.Numel() * t.dtype.Size())
	switch {
	case from == to:
	case from == Sim:
		simTransfers.count("", true, n)
	case to == Sim:
		simTransfers.count("", false, n)
	}
}

// Device returns the device holding t's storage.
func (t *Tensor) Device() Device { return t.dev }

// ToDevice returns t on dev: t itself when it is there already, else a
// dense copy (no autograd; counted when it crosses into or out of sim).
func (t *Tensor) ToDevice(dev Device) *Tensor {
	if t.dev == dev {
		return t
	}
	var out *Tensor
	switch {
	case dev == CUDA:
		out = toCUDA(t, "")
	case t.dev == CUDA:
		out = fromCUDA(t, dev, "")
	default:
		out = t.Clone()
		out.dev = dev
	}
	out.Name = t.Name
	countTransfer(t.dev, dev, t)
	return out
}

// ToHost returns t's values on the CPU, where the host accessors may read
// them: t itself when on the CPU, else a counted copy. Writing into the copy
// does not change t (use Copy).
func ToHost(t *Tensor) *Tensor { return t.ToDevice(CPU) }

// MoveParams moves leaf tensors (a model's parameters) to dev in place:
// their storage is copied there (counted) and their Grad dropped, so
// pointers to them stay valid. It is the start of a run on a device.
func MoveParams(dev Device, params ...*Tensor) {
	for _, p := range params {
		if p == nil || p.dev == dev {
			continue
		}
		if !p.leaf {
			panic("tensor: MoveParams of a non-leaf tensor " + p.Name)
		}
		countTransfer(p.dev, dev, p)
		if p.dev == CUDA || dev == CUDA {
			moved := p.ToDevice(dev)
			p.shareStorage(moved)
			p.shape, p.strides, p.offset = moved.shape, moved.strides, moved.offset
		}
		p.dev = dev
		if p.Grad != nil {
			p.Grad = nil
		}
	}
}

// ZerosLike returns a zeroed float32 tensor of t's shape on t's device.
func ZerosLike(t *Tensor) *Tensor { return NewOn(t.dev, Float32, t.shape...) }

// NewOn returns a zeroed tensor of dtype and shape on dev.
func NewOn(dev Device, dtype DType, shape ...int) *Tensor {
	if dev == CUDA {
		return newCUDA(dtype, shape, true)
	}
	t := New(dtype, shape...)
	t.dev = dev
	return t
}

// emptyOn returns a tensor of dtype and shape on dev whose values are about
// to be overwritten (device memory is not cleared first).
func emptyOn(dev Device, dtype DType, shape ...int) *Tensor {
	if dev == CUDA {
		return newCUDA(dtype, shape, false)
	}
	return NewOn(dev, dtype, shape...)
}

// ZerosOn returns a zeroed float32 tensor on dev.
func ZerosOn(dev Device, shape ...int) *Tensor { return NewOn(dev, Float32, shape...) }

// mustHost panics unless t's storage may be read by the host accessor op.
func (t *Tensor) mustHost(op string) {
	if t.dev != CPU {
		panic(fmt.Sprintf("tensor: %s of %s on the %v device: host code may not read device storage; copy it with tensor.ToHost (or move data with ToDevice)", op, t, t.dev))
	}
}

// sameDevice returns the device of ts (nil entries skipped), panicking when
// they are on two devices.
func sameDevice(op string, ts ...*Tensor) Device {
	var dev Device
	seen := false
	for _, t := range ts {
		if t == nil {
			continue
		}
		if !seen {
			dev, seen = t.dev, true
		} else if t.dev != dev {
			panic(fmt.Sprintf("tensor: %s of tensors on two devices: %v on %v, another on %v (move one with ToDevice)", op, t, t.dev, dev))
		}
	}
	return dev
}

// onDevice tags t, a fresh wrapper of host storage inside package tensor,
// as living on dev, and returns it.
func onDevice(t *Tensor, dev Device) *Tensor {
	t.dev = dev
	return t
}

// simBackend is the simulated device's Backend: the CPU kernels on its
// (host) storage, so its results are the CPU's bit for bit. What it checks
// is everything around the kernels: that tensors reach it only through ops
// (host accessors refuse sim tensors), that every op's inputs share its
// device, and that outputs are allocated there.
type simBackend struct{ cpuBackend }

var _ Backend = simBackend{}

// SimBackend returns the simulated device's backend (see Sim): the CPU
// kernels on sim storage. Its methods take sim tensors, on which the host
// accessors panic; tensor/backendtest runs its method-level checks on it, so
// that a check reading device storage other than through the explicit
// copies fails here rather than on a real device.
func SimBackend() Backend { return simBackend{} }

func (simBackend) Name() string { return "sim" }

func (simBackend) Device() Device { return Sim }

var _ bf16NormForward = simBackend{}

// LayerNormForwardBF16 emulates the CUDA kernel that writes the norm's
// output and its bfloat16 rounding in one pass: the CPU's norm, then the
// conversion (the same bits).
func (s simBackend) LayerNormForwardBF16(out, out16, mean, rstd, x, w, b *Tensor, eps float32) {
	s.LayerNormForward(out, mean, rstd, x, w, b, eps)
	s.Convert(out16, out)
}

// BiasDropoutAddNormForwardBF16 is LayerNormForwardBF16's
// BiasDropoutAddNormForward.
func (s simBackend) BiasDropoutAddNormForwardBF16(sum, out, out16, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32) {
	s.BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb, p, rng, eps)
	s.Convert(out16, out)
}

// RMSNormForwardBF16 is LayerNormForwardBF16's RMSNorm.
func (s simBackend) RMSNormForwardBF16(out, out16, rstd, x, w *Tensor, eps float32) {
	s.RMSNormForward(out, rstd, x, w, eps)
	s.Convert(out16, out)
}
