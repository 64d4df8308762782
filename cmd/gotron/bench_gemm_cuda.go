package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
)

// benchGemmCUDA times the GPU's Gemm (cuBLAS, through tensor's CUDA
// backend, as training calls it) at each shape: reps repetitions, each
// repeating the product until it lasts minRep seconds, the stream
// synchronized before and after. The peak is the GPU's datasheet peak
// (tensor.CUDAPeakFLOPs; 0 when the GPU is not in gotron's table).
//
// With lt the products go through cuBLASLt (tensor.SetCUDALt, for this
// run), and the output ends with how many did and how many cuBLASLt had no
// algorithm for (run through cuBLAS instead): the next GPU window compares
// the two libraries at the same shapes.
func benchGemmCUDA(ctx context.Context, w io.Writer, shapes []gemmShape, bf16, lt bool, reps int, minRep float64) error {
	dev := tensor.CUDADevice()
	be := tensor.CUDABackend()
	lib := "cuBLAS"
	if lt {
		lib = "cuBLASLt"
		defer tensor.SetCUDALt(tensor.SetCUDALt(true))
		before := tensor.CUDALtCounts()
		defer func() { fmt.Fprintf(w, "cuBLASLt: %v\n", tensor.CUDALtCounts().Sub(before)) }()
	}
	prec, name := tensor.MatmulFP32, lib+" fp32 (no TF32)"
	operands := tensor.Float32
	if bf16 {
		prec, name = tensor.MatmulBF16, lib+" bf16 products, fp32 in and out"
		if tensor.CUDABF16GemmOperands() {
			// gemm-bf16: the operands training's products read then
			operands, name = tensor.BFloat16, lib+" bf16 products on bf16 operands (gemm-bf16), fp32 out"
		}
	}
	peak := tensor.CUDAPeakFLOPs(bf16) / 1e9
	fmt.Fprintf(w, "%s on %v: datasheet peak %.0f GFLOP/s, %d reps of ≥ %.2gs each\n", name, dev, peak, reps, minRep)
	fmt.Fprintf(w, "%-3s %6s %6s %6s %10s %10s %7s\n", "ops", "M", "K", "N", "median", "max", "%peak")
	for _, s := range shapes {
		if err := ctx.Err(); err != nil {
			return err
		}
		ta, tb := tensor.NoTrans, tensor.NoTrans
		ashape, bshape := []int{s.m, s.k}, []int{s.k, s.n}
		if s.tA == cpu.Trans {
			ta, ashape = tensor.Trans, []int{s.k, s.m}
		}
		if s.tB == cpu.Trans {
			tb, bshape = tensor.Trans, []int{s.n, s.k}
		}
		a := tensor.NewOn(tensor.CUDA, operands, ashape...)
		b := tensor.NewOn(tensor.CUDA, operands, bshape...)
		c := tensor.NewOn(tensor.CUDA, tensor.Float32, s.m, s.n)
		call := func() { be.Gemm(prec, ta, tb, 1, a, b, 0, c) }
		sync := func() error { return dev.Synchronize() }
		call() // warm-up: cuBLAS picks its kernel
		if err := sync(); err != nil {
			return err
		}
		n := 1
		for {
			start := time.Now()
			for range n {
				call()
			}
			if err := sync(); err != nil {
				return err
			}
			if time.Since(start).Seconds() >= minRep || n >= 1<<20 {
				break
			}
			n *= 2
		}
		flop := 2 * float64(s.m) * float64(s.k) * float64(s.n) * float64(n)
		var rates []float64
		for range reps {
			start := time.Now()
			for range n {
				call()
			}
			if err := sync(); err != nil {
				return err
			}
			rates = append(rates, flop/time.Since(start).Seconds()/1e9)
		}
		slices.Sort(rates)
		med, mx := rates[len(rates)/2], rates[len(rates)-1]
		pct := 0.0
		if peak > 0 {
			pct = 100 * med / peak
		}
		fmt.Fprintf(w, "%-3s %6d %6d %6d %10.0f %10.0f %6.1f%%\n", s.ops(), s.m, s.k, s.n, med, mx, pct)
	}
	return nil
}
