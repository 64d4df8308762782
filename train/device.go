package train

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// This file is the stepper's device seam (--device). The model is built on
// the CPU, from the seed or sliced by the parallel plan, and moved to the
// device once; after that, host code touches device storage only at the
// I/O boundaries, through the explicit copies the tensor package counts:
// batches are copied in at the data-loading boundary, the loss and the
// logged scalars are read back, checkpoints are written from and read into
// host copies of the parameters and optimizer state, and collectives stage
// their buffers through the host (copy out, communicate, copy back).

// moveToDevice moves this rank's parameters (its stages' under pipelining,
// the tied embedding's copy included) to the run's device, before the
// gradient buffers and the optimizer state are allocated beside them.
func (st *stepper) moveToDevice() {
	if st.cfg.Device == tensor.CPU {
		return
	}
	tensor.MoveParams(st.cfg.Device, st.model.Params()...)
	tensor.MoveParams(st.cfg.Device, st.localParams()...)
}

// batchTo returns bt with every tensor copied to dev (bt itself on the CPU):
// the data-loading boundary.
func batchTo(bt gpt.Batch, dev tensor.Device) gpt.Batch {
	if dev == tensor.CPU {
		return bt
	}
	mv := func(x *tensor.Tensor) *tensor.Tensor {
		if x == nil {
			return nil
		}
		return x.ToDevice(dev)
	}
	return gpt.Batch{Tokens: mv(bt.Tokens), Positions: mv(bt.Positions), DocIDs: mv(bt.DocIDs), Labels: mv(bt.Labels), LossMask: mv(bt.LossMask)}
}

// scalar reads a one-element float32 tensor back to the host (a logged
// value: the loss).
func scalar(x *tensor.Tensor) float64 { return float64(tensor.ToHost(x).Float32s()[0]) }

// hostValues returns p's values for host code that only reads them (a
// checkpoint being written): p's own storage on the CPU, else a counted
// copy.
func hostValues(p *tensor.Tensor) []float32 { return tensor.ToHost(p).Float32s() }

// setValues writes v into p (a host copy into device storage off the CPU).
func setValues(p *tensor.Tensor, v []float32) {
	if p.Device() == tensor.CPU {
		copy(p.Float32s(), v)
		return
	}
	tensor.Copy(p, tensor.FromFloat32(v, len(v)))
}

// staged runs fn on p's values in host memory and, when p lives on a device,
// copies what fn wrote back: the staging of a collective or a checkpoint
// read into device storage. On the CPU fn gets p's own storage.
func staged(p *tensor.Tensor, fn func([]float32) error) error {
	if p.Device() == tensor.CPU {
		return fn(p.Float32s())
	}
	h := tensor.ToHost(p)
	if err := fn(h.Float32s()); err != nil {
		return err
	}
	tensor.Copy(p, h)
	return nil
}

// transferCounter returns the host-copy counter of dev: the simulated
// device's (the seam's explicit copies) or the GPU's (every copy, the
// backend's own included: each synchronizes the stream); nil on the CPU.
func transferCounter(dev tensor.Device) func() tensor.Transfers {
	switch dev {
	case tensor.Sim:
		return tensor.SimTransfers
	case tensor.CUDA:
		return tensor.CUDATransfers
	}
	return nil
}

// transfers is the line a run on the simulated device or the GPU ends
// with: how many host copies it made (the seam's cost, which a real device
// pays over its bus) from since to now, and how many each training
// iteration made on average (steps: the copies made inside training steps,
// over iters of them; evaluation and checkpoints excluded), by site.
func transfers(dev tensor.Device, now, since, steps tensor.Transfers, iters int64) string {
	d := now.Sub(since)
	per := ""
	if iters > 0 {
		per = fmt.Sprintf("; per training iteration %.1f in, %.1f out, %.3f MB%s",
			float64(steps.FromHost)/float64(iters), float64(steps.ToHost)/float64(iters), float64(steps.Bytes)/1e6/float64(iters),
			copySites(steps.Sites, iters))
	}
	return fmt.Sprintf("%v device: %d host-to-device and %d device-to-host copies, %.3f MB%s", dev, d.FromHost, d.ToHost, float64(d.Bytes)/1e6, per)
}

// bf16OperandsLine is the line a --bf16 run on the simulated device or the
// GPU ends with: per training iteration, the products under --bf16 and
// the conversions to bfloat16 they cost (counted in this process, every
// rank it runs included). With bfloat16 operands (--device sim; cuda under
// GOTRON_CUDA_UNVERIFIED=gemm-bf16) the line also gives what the same
// products on float32 operands would cost: two conversions each, inside
// the product, and 4 bytes an operand element read.
func bf16OperandsLine(dev tensor.Device, c tensor.BF16OperandCounts, iters int64) string {
	if iters <= 0 {
		return fmt.Sprintf("%v device, bf16 GEMM operands: no training iteration", dev)
	}
	per := func(n int64) float64 { return float64(n) / float64(iters) }
	cost := func(c tensor.BF16OperandCounts) string {
		return fmt.Sprintf("%.1f conversions of %.3f M elements, %.3f MB of operands read by the products",
			per(c.Conversions()), per(c.ConvertedElems())/1e6, per(c.ProductReadBytes())/1e6)
	}
	if c.BF16OperandProducts == 0 {
		return fmt.Sprintf("%v device, bf16 GEMM operands: per training iteration %.1f products on float32 operands (converted inside each): %s",
			dev, per(c.FP32OperandProducts), cost(c))
	}
	return fmt.Sprintf("%v device, bf16 GEMM operands: per training iteration %.1f products on bfloat16 operands and %.1f on float32, %.1f weight casts (%.3f M elements), %.1f activation casts (%.3f M elements) and %.1f activations written in bfloat16 by the norms (%.3f M elements): %s; on float32 operands: %s",
		dev, per(c.BF16OperandProducts), per(c.FP32OperandProducts), per(c.WeightCasts), per(c.WeightCastElems)/1e6, per(c.ActCasts), per(c.ActCastElems)/1e6,
		per(c.FusedCasts), per(c.FusedCastElems)/1e6, cost(c), cost(c.AsFP32Operands()))
}

// copySites formats the copies of iters iterations by site, per iteration,
// the most frequent first: " (in: train.batchTo 4.0, AdamW coefficients
// 1.0; out: ...)"; "" without copies.
func copySites(sites map[string]tensor.SiteTransfers, iters int64) string {
	var parts []string
	for _, dir := range []string{"in", "out"} {
		type row struct {
			site string
			n    int64
		}
		var rows []row
		for k, v := range sites {
			n := v.In
			if dir == "out" {
				n = v.Out
			}
			if n != 0 {
				rows = append(rows, row{k, n})
			}
		}
		if len(rows) == 0 {
			continue
		}
		sort.Slice(rows, func(i, j int) bool {
			if rows[i].n != rows[j].n {
				return rows[i].n > rows[j].n
			}
			return rows[i].site < rows[j].site
		})
		items := make([]string, len(rows))
		for i, r := range rows {
			items[i] = fmt.Sprintf("%s %.1f", r.site, float64(r.n)/float64(iters))
		}
		parts = append(parts, dir+": "+strings.Join(items, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}
