package tensor

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/gotron/gotron/internal/cuda"
)

// ReadBack returns host copies of ts — small tensors of any dtypes on one
// device (nil entries give nil) — for host code that only reads them: ts
// themselves on the CPU, else copies made with as few synchronizations as
// the device allows. A training step keeps its scalars (each micro-batch's
// loss, the gradients' Σ g² and NaN/Inf flag) on the device and reads them
// here, once, as Megatron reads the gradient norm once (its .item()). The
// simulated device counts one copy for all of them; the GPU packs them
// into one device buffer (device-to-device copies, queued) and copies that
// to the host once under GOTRON_CUDA_UNVERIFIED=fewer-syncs (built, not
// yet run on a GPU), else copies each (a synchronization each).
func ReadBack(ts ...*Tensor) []*Tensor {
	out := make([]*Tensor, len(ts))
	var dev Device
	var live []int
	for i, t := range ts {
		if t == nil {
			continue
		}
		if len(live) == 0 {
			dev = t.dev
		} else if t.dev != dev {
			panic(fmt.Sprintf("tensor: ReadBack of tensors on two devices: %v on %v, another on %v", t, t.dev, dev))
		}
		live = append(live, i)
	}
	switch {
	case len(live) == 0:
	case dev == CPU:
		copy(out, ts)
	case dev == Sim:
		var bytes int64
		for _, i := range live {
			out[i] = ts[i].Clone()
			out[i].dev = CPU
			bytes += int64(ts[i].Numel() * ts[i].dtype.Size())
		}
		simTransfers.count(copySite(), true, bytes)
	case dev == CUDA:
		rt := cudaRT()
		if !rt.fewerSyncs || len(live) == 1 {
			for _, i := range live {
				out[i] = fromCUDA(ts[i], CPU, "")
			}
			break
		}
		readBackPacked(rt, ts, live, out)
	default:
		panic(fmt.Sprintf("tensor: ReadBack on the %v device", dev))
	}
	return out
}

// readBackPacked copies the tensors ts[live] into one device buffer, each
// at an 8-byte-aligned offset, reads that back in one copy and splits it
// into host tensors out[live].
func readBackPacked(rt *cudaRuntime, ts []*Tensor, live []int, out []*Tensor) {
	offs := make([]int64, len(ts))
	var total int64
	srcs := make([]*Tensor, len(ts))
	for _, i := range live {
		src := ts[i]
		if !src.IsContiguous() {
			src = src.Contiguous() // on the device
		}
		srcs[i] = src
		offs[i] = total
		total += (int64(src.Numel()*src.dtype.Size()) + 7) &^ 7
	}
	if total == 0 {
		for _, i := range live {
			out[i] = New(ts[i].dtype, ts[i].shape...)
		}
		return
	}
	packed := newCUDA(Int64, []int{int(total / 8)}, false)
	for _, i := range live {
		n := int64(srcs[i].Numel() * srcs[i].dtype.Size())
		if n == 0 {
			continue
		}
		rt.timed("copy device to device (ReadBack)", func() {
			if err := rt.dev.CopyDtoD(packed.dbuf.ptr+cuda.Ptr(offs[i]), devPtr(srcs[i]), n); err != nil {
				panic(fmt.Sprintf("tensor: ReadBack: packing %s on CUDA: %v", srcs[i], err))
			}
		})
	}
	host := fromCUDA(packed, CPU, copySite())
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&host.i64[0])), total)
	for _, i := range live {
		o := New(ts[i].dtype, ts[i].shape...)
		if p, n := hostData(o); n > 0 {
			copy(unsafe.Slice((*byte)(p), n), raw[offs[i]:offs[i]+n])
		}
		out[i] = o
	}
	runtime.KeepAlive(srcs)
}
