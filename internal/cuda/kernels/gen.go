package kernels

// The PTX under ptx/ is generated from the *.cu files here and committed,
// so building gotron needs no CUDA toolkit. After editing a .cu file, run
//
//	go generate ./internal/cuda/kernels
//
// with nvcc on PATH (CUDA 11.8 or newer; CUDA_HOME/bin or /usr/local/cuda/bin
// are tried too). It compiles every <family>.cu with
//
//	nvcc -ptx -O3 -std=c++14 -arch=sm_XX
//
// (no fast math: kernels must match the CPU backend within float rounding)
// for sm_80 and sm_90 into ptx/sm_80/<family>.ptx and ptx/sm_90/<family>.ptx,
// and removes PTX whose .cu is gone. TestPTXUpToDate checks the committed
// files against a fresh build where nvcc is installed, and
// TestPTXNoSpills runs ptxas on them.

//go:generate go run ./gen -out ptx
