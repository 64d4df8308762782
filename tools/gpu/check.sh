#!/bin/sh
# The GPU suite, run on a GPU machine from binaries tools/gpu/build.sh made
# elsewhere (no Go there): runtime tests, the backend conformance suite on
# CUDA, the models against the CPU, training against the CPU, then the
# benchmarks; every log lands in $OUT (default ./gpu-out). Each step has its
# own time limit so one hang cannot eat the machine's time.
#   .gpu/check.sh [steps...]   (steps: runtime nccl conformance model train unverified bench profile, or unverified's parts unverified-tests unverified-124m unverified-cp; default all but profile)
# `unverified` runs what is built but has not yet run on a GPU
# (docs/design/cuda.md, "Built, not yet run on a GPU"): its tests by name
# (`unverified-tests`), GPT-2 124M in bf16 with each unverified feature
# (`unverified-124m`), and context-parallel training on the GPU against the
# CPU (`unverified-cp`); each part is a step of its own too, for a short
# GPU window.
set -u
bin=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-./gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd) # absolute: a step may run from a package's folder
# build.sh gzips the binaries (the device tool carries 64 MiB at most):
# unpack them once into a folder of their own, beside the scripts.
if ls "$bin"/*.gz > /dev/null 2>&1; then
	unpacked=${TMPDIR:-/tmp}/gotron-gpu-bin
	mkdir -p "$unpacked"
	for f in "$bin"/*.gz; do
		name=$(basename "$f" .gz)
		if [ ! -x "$unpacked/$name" ] || [ "$f" -nt "$unpacked/$name" ]; then
			gunzip -c "$f" > "$unpacked/$name" && chmod +x "$unpacked/$name" || { echo "check.sh: cannot unpack $f" >&2; exit 1; }
		fi
	done
	cp "$bin"/*.py "$bin"/check.sh "$unpacked/"
	bin=$unpacked
fi
steps=${*:-runtime nccl conformance model train unverified bench}
export GOTRON_NUM_THREADS=${GOTRON_NUM_THREADS:-16}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
run() { # name limit command...
	name=$1 limit=$2
	shift 2
	start=$(date +%s)
	timeout "$limit" "$@" > "$out/$name.log" 2>&1
	rc=$?
	echo "$name: rc=$rc $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
	grep -E "^(--- FAIL|FAIL|ok|PASS|panic)" "$out/$name.log" | head -40 >> "$out/summary.txt"
}
unverified_tests() {
	# Block attention (CP), bf16/fp16 attention products and the
	# tensor-core flash attention against the CPU; the MoE model step
	# against the CPU, with the loop and with the grouped GEMM.
	run unverified-attn 180 "$bin/tensor_backendtest.test" -test.v \
		-test.run 'TestCUDABlockAttention|TestCUDAAttentionReducedPrecision'
	# the tensor-core flash attention (flash-tc) in a process of its
	# own: a fault in a new kernel ends the CUDA context
	run unverified-attn-tc 180 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDAAttentionTensorCores'
	run unverified-moe 180 "$bin/model_gpt.test" -test.v -test.run 'TestCUDAMoEMatchesCPU'
	# NCCL's grouped sends and receives of device tensors (pipeline,
	# context- and expert-parallel exchanges in place), world of one
	run unverified-nccl-batch 120 "$bin/comm_nccl.test" -test.v -test.run 'TestCUDABatchSendRecvTensors'
	# The MoE experts' grouped GEMM (moe-grouped: one
	# cublasGemmGroupedBatchedEx per product, cuBLAS 12.5+): the call
	# against the host, GroupedLinear and a model step against the CPU.
	run unverified-moe-grouped-blas 120 "$bin/internal_cuda.test" -test.v -test.run 'TestGPUGemmGrouped'
	run unverified-moe-grouped-op 120 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDAGroupedLinearMatchesCPU'
	run unverified-moe-grouped 180 env GOTRON_CUDA_UNVERIFIED=moe-grouped "$bin/model_gpt.test" -test.v -test.run 'TestCUDAMoEGroupedMatchesCPU'
	# The MoE router on the device (moe-router: moe.cu): Route against
	# the CPU bit for bit (the z-loss and the permutation included), then
	# model steps with it on.
	run unverified-moe-router-op 120 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDARouterMatchesCPU'
	run unverified-moe-router 180 env GOTRON_CUDA_UNVERIFIED=moe-router "$bin/model_gpt.test" -test.v -test.run 'TestCUDAMoERouterMatchesCPU'
	# The fused bias-GELU, bias-SwiGLU, bias-dropout-add and
	# bias-dropout-add + LayerNorm/RMSNorm kernels (fused.cu) against the
	# CPU, then the model's training step with them on (the layer fuses by
	# default).
	run unverified-fusion 180 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDAFusedOps'
	# The squared ReLU and the attention output gate (elem.cu: sqrelu,
	# output-gate) and the gated delta net (gdn.cu: gdn): the ops against
	# the CPU, then a model step with each (loss, every gradient, decoding).
	run unverified-sqrelu-gate-op 120 env GOTRON_CUDA_UNVERIFIED=sqrelu,output-gate,gdn "$bin/tensor_backendtest.test" -test.v \
		-test.run 'TestCUDAOps/(squared-relu|sigmoid-gate|causal-conv-silu|l2norm|gdn-gates|gated-delta-rule)'
	run unverified-sqrelu-gate 180 env GOTRON_CUDA_UNVERIFIED=sqrelu,output-gate,gdn "$bin/model_gpt.test" -test.v -test.run 'TestCUDAVariantsMatchCPU'
	# Multi-latent attention (mla): model steps and decoding against the
	# CPU, 144-channel heads by chunks of heads included.
	run unverified-mla 180 env GOTRON_CUDA_UNVERIFIED=mla "$bin/model_gpt.test" -test.v -test.run 'TestCUDAMLAMatchesCPU'
	# DeepSeek sparse attention (dsa, on mla): the golden models' step
	# against the PyTorch goldens; it reads model/gpt/testdata, so it runs
	# from that folder of the repository's copy (check.sh run from its root)
	if [ -d model/gpt/testdata ]; then
		(cd model/gpt && run unverified-dsa 180 env GOTRON_CUDA_UNVERIFIED=mla,dsa "$bin/model_gpt.test" -test.v -test.run 'TestCUDADSAMatchesGolden')
	else
		echo "unverified-dsa: skipped: run check.sh from the repository's root (the test reads model/gpt/testdata)" | tee -a "$out/summary.txt"
	fi
	run unverified-model-fusion 180 env GOTRON_CUDA_UNVERIFIED=fusion "$bin/model_gpt.test" -test.v -test.run '^TestCUDAMatchesCPU$'
	# Staged host-to-device copies: the runtime test, then training
	# against the CPU (50 iterations, fp32 and --bf16) with them on.
	run unverified-staged 120 "$bin/internal_cuda.test" -test.v -test.run 'TestGPUCopyHtoDStaged'
	run unverified-train-staged 240 env GOTRON_CUDA_UNVERIFIED=staged-copies "$bin/train.test" -test.v -test.run 'CUDA'
	# A step's scalars read back once (fewer-syncs): the loss mask's
	# scale reading Σ mask on the device (bit for bit), ReadBack's
	# packed copy, one read-back per training step, then training
	# against the CPU.
	run unverified-fewer-syncs 180 env GOTRON_CUDA_UNVERIFIED=fewer-syncs "$bin/tensor_backendtest.test" -test.v \
		-test.run 'TestCUDAMethods|TestCUDAReadBack|TestCUDAOps'
	run unverified-train-fewer-syncs 240 env GOTRON_CUDA_UNVERIFIED=fewer-syncs "$bin/train.test" -test.v -test.run 'CUDA'
	grep -h "device-to-host copies\|^--- \|^ok\|^FAIL" "$out/unverified-train-fewer-syncs.log" | head -20 >> "$out/summary.txt"
	# bfloat16 GEMM operands under --bf16 (gemm-bf16): Linear's products
	# on the weights' bfloat16 copies and on activations and gradients
	# cast once (cuBLAS: CUDA_R_16BF A and B, float32 C,
	# CUBLAS_COMPUTE_32F) against the CPU, and the norm kernels that write
	# the next product's bfloat16 operand beside their output (norm.cu's
	# _bf16 kernels), then training against the CPU (50 iterations) with
	# them on.
	run unverified-gemm-bf16 120 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDABF16GemmOperandsMatchCPU|TestCUDANormBF16OperandsMatchCPU'
	run unverified-train-gemm-bf16 240 env GOTRON_CUDA_UNVERIFIED=gemm-bf16 "$bin/train.test" -test.v -test.run 'TestCUDATrainingMatchesCPU'
	grep -h "bf16 GEMM operands\|final loss" "$out/unverified-train-gemm-bf16.log" | head -4 >> "$out/summary.txt"
	# Products through cuBLASLt (cublaslt): the library's products and
	# epilogues (BIAS, BGRADB, GELU_AUX_BIAS, DGELU, DGELU_BGRAD; fp32,
	# TF32, bf16, fp16) against the host, Linear with the bias and its
	# gradient in the epilogues against the CPU, then the model's step
	# and training against the CPU with every product through cuBLASLt.
	run unverified-cublaslt-lib 120 "$bin/internal_cuda.test" -test.v -test.run 'TestGPULt|TestLt'
	run unverified-cublaslt-op 120 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDALtMatchesCPU'
	run unverified-model-cublaslt 180 env GOTRON_CUDA_UNVERIFIED=cublaslt "$bin/model_gpt.test" -test.v -test.run '^TestCUDAMatchesCPU$'
	run unverified-train-cublaslt 240 env GOTRON_CUDA_UNVERIFIED=cublaslt "$bin/train.test" -test.v -test.run 'TestCUDATrainingMatchesCPU'
	grep -h "cuBLASLt products" "$out/unverified-train-cublaslt.log" | head -4 >> "$out/summary.txt"
	# FP8 products (fp8: fp8.cu's amax, scale and casts, cuBLASLt's FP8
	# matmul; compute capability 8.9+): the FP8 bindings' descriptors,
	# then LinearFP8's forward and gradients against the CPU's emulation.
	run unverified-fp8-lib 120 "$bin/internal_cuda.test" -test.v -test.run 'TestLtPlanFP8|TestLtDescriptors|TestLtABI'
	run unverified-fp8-op 120 env GOTRON_CUDA_UNVERIFIED=fp8 "$bin/tensor_backendtest.test" -test.v -test.run 'TestCUDALinearFP8MatchesCPU|TestCUDALinearFP8DelayedMatchesCPU|TestCUDALinearFP8DecodeMatchesCPU'
}
unverified_124m() {
	# GPT-2 124M bf16 with each feature alone, and the two copy features
	# together: speed and host copies
	for feat in staged-copies attn-bf16 fewer-syncs staged-copies,fewer-syncs flash-tc gemm-bf16 gemm-bf16,cublaslt; do
		run "unverified-124m-bf16-$feat" 240 env GOTRON_CUDA_UNVERIFIED=$feat "$bin/gotron" train --device cuda --mock-data \
			--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
			--micro-batch-size 8 --global-batch-size 8 --train-iters 8 --log-interval 1 --vocab-size 50304 --lr 1e-4 --bf16
		grep -o "lm loss: [0-9.E+-]*\|elapsed time per iteration (ms): [0-9.]*\|tokens/s: [0-9.]*" \
			"$out/unverified-124m-bf16-$feat.log" | tail -3 | sed "s/^/$feat: /" >> "$out/summary.txt"
		grep -o "cuda device: .*\|cuda device, cuBLASLt.*" "$out/unverified-124m-bf16-$feat.log" | sed "s/^/$feat: /" >> "$out/summary.txt"
	done
	# FP8 training (fp8, tensorwise, hybrid) at GPT-2 124M: speed and losses
	run unverified-124m-fp8 240 env GOTRON_CUDA_UNVERIFIED=fp8 "$bin/gotron" train --device cuda --mock-data \
		--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
		--micro-batch-size 8 --global-batch-size 8 --train-iters 8 --log-interval 1 --vocab-size 50304 --lr 1e-4 --bf16 \
		--fp8-format hybrid --fp8-recipe tensorwise
	grep -o "lm loss: [0-9.E+-]*\|elapsed time per iteration (ms): [0-9.]*\|tokens/s: [0-9.]*" \
		"$out/unverified-124m-fp8.log" | tail -3 | sed "s/^/fp8: /" >> "$out/summary.txt"
	# the delayed recipe (Megatron's default, as the Llama 3 FP8 example
	# runs it): histories on the host, amaxes folded in at each update
	run unverified-124m-fp8-delayed 240 env GOTRON_CUDA_UNVERIFIED=fp8 "$bin/gotron" train --device cuda --mock-data \
		--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
		--micro-batch-size 8 --global-batch-size 8 --train-iters 8 --log-interval 1 --vocab-size 50304 --lr 1e-4 --bf16 \
		--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
	grep -o "lm loss: [0-9.E+-]*\|elapsed time per iteration (ms): [0-9.]*\|tokens/s: [0-9.]*" \
		"$out/unverified-124m-fp8-delayed.log" | tail -3 | sed "s/^/fp8-delayed: /" >> "$out/summary.txt"
	# gemm-bf16's products at GPT-2's shapes, beside the bench step's
	# bf16 products on float32 operands
	run unverified-gemm-bf16-bench 120 env GOTRON_CUDA_UNVERIFIED=gemm-bf16 "$bin/gotron" bench gemm --device cuda \
		--precision bf16 --reps 3 --min-rep-seconds 0.2 \
		--shapes NN:8192x768x2304,NT:8192x2304x768,TN:768x8192x2304,NN:8192x768x3072,NN:8192x768x50304,NN:8192x8192x8192
	cat "$out/unverified-gemm-bf16-bench.log" >> "$out/summary.txt"
	# cuBLASLt's products at the same shapes, beside the bench step's
	# cuBLAS ones (the last line counts fallbacks to cuBLAS)
	for prec in fp32 bf16; do
		run "unverified-cublaslt-bench-$prec" 120 "$bin/gotron" bench gemm --device cuda --library cublaslt \
			--precision $prec --reps 3 --min-rep-seconds 0.2 \
			--shapes NN:8192x768x2304,NT:8192x2304x768,TN:768x8192x2304,NN:8192x768x3072,NN:8192x768x50304,NN:8192x8192x8192
		cat "$out/unverified-cublaslt-bench-$prec.log" >> "$out/summary.txt"
	done
}
unverified_cp() {
	# --context-parallel-size 2 (two processes on the one GPU, host
	# collectives) against the same run on the CPU: the losses of the
	# last iterations must agree within float32 rounding.
	for dev in cpu cuda; do
		run "unverified-cp-$dev" 240 env GOTRON_CUDA_UNVERIFIED=cp "$bin/gotron" launch --nproc-per-node 2 -- train \
			--device $dev --device-memory-fraction 0.4 --distributed-backend gloo --context-parallel-size 2 --mock-data --num-layers 2 \
			--hidden-size 128 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256 \
			--micro-batch-size 2 --global-batch-size 2 --train-iters 10 --log-interval 1 --vocab-size 512 \
			--lr 1e-3 --eval-iters 0 --seed 5
		grep -o "lm loss: [0-9.E+-]*" "$out/unverified-cp-$dev.log" | tail -2 | sed "s/^/cp $dev: /" >> "$out/summary.txt"
	done
}
for s in $steps; do
	case $s in
	runtime) run runtime 120 "$bin/internal_cuda.test" -test.v ;;
	nccl) run nccl 300 "$bin/comm_nccl.test" -test.v -test.run 'GPU' ;;
	# conformance and model run what has passed on a GPU; unverified the rest
	conformance) run conformance 180 "$bin/tensor_backendtest.test" -test.v -test.run '^TestCUDA(Ops|Methods|Copy|GreedySample|Attention)$' ;;
	model)
		run model 180 "$bin/model_gpt.test" -test.v -test.run '^TestCUDAMatchesCPU$'
		run serve 180 "$bin/infer.test" -test.v -test.run 'CUDA'
		;;
	train)
		run train 240 "$bin/train.test" -test.v -test.run 'CUDA'
		# Out of device memory: an error naming the allocation, the peak
		# and the fix, exit status 1, no panic trace.
		run oom 120 "$bin/gotron" train --device cuda --mock-data --num-layers 12 --hidden-size 2048 \
			--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 64 \
			--global-batch-size 64 --train-iters 1 --vocab-size 50304 --lr 1e-4
		grep -h "out of device memory" "$out/oom.log" | head -2 >> "$out/summary.txt"
		grep -c "goroutine " "$out/oom.log" | sed 's/^/goroutine lines in the oom log (want 0): /' >> "$out/summary.txt"
		;;
	unverified) unverified_tests; unverified_124m; unverified_cp ;;
	unverified-tests) unverified_tests ;;
	unverified-124m) unverified_124m ;;
	unverified-cp) unverified_cp ;;
	bench)
		run bench-gemm 120 "$bin/internal_cuda.test" -test.run '^$' -test.bench 'GPU' -test.benchtime 20x
		for prec in fp32 bf16; do
			run "gemm-$prec" 120 "$bin/gotron" bench gemm --device cuda --precision $prec --reps 3 --min-rep-seconds 0.2 \
				--shapes NN:8192x768x2304,NT:8192x2304x768,TN:768x8192x2304,NN:8192x768x3072,NN:8192x768x50304,NN:8192x8192x8192
			cat "$out/gemm-$prec.log" >> "$out/summary.txt"
		done
		for prec in fp32 bf16; do
			p=""
			[ "$prec" = bf16 ] && p=--bf16
			run "gotron-124m-$prec" 240 "$bin/gotron" train --device cuda --mock-data --num-layers 12 --hidden-size 768 \
				--num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 \
				--global-batch-size 8 --train-iters 8 --log-interval 1 --vocab-size 50304 --lr 1e-4 $p
			grep -o "elapsed time per iteration (ms): [0-9.]*\|tokens/s: [0-9.]*" "$out/gotron-124m-$prec.log" | tail -4 >> "$out/summary.txt"
			# host copies per training iteration (each one synchronizes the stream)
			grep -o "cuda device: .*" "$out/gotron-124m-$prec.log" | tail -1 >> "$out/summary.txt"
		done
		if command -v python3 > /dev/null; then
			run peer-124m 240 python3 "$bin/peer_gpt2.py" --B 8 --T 1024 --steps 8
			grep pytorch "$out/peer-124m.log" >> "$out/summary.txt"
		fi
		# attention fwd+bwd TFLOP/s per path (the tensor-core kernels are
		# unverified: check unverified-attn's log before trusting them)
		# at T 1024 and 4096, and PyTorch's SDPA at the same shapes
		run bench-attn 240 "$bin/tensor_backendtest.test" -test.run '^$' -test.bench 'CUDAAttention' -test.benchtime 10x
		grep "TFLOP/s" "$out/bench-attn.log" >> "$out/summary.txt"
		if command -v python3 > /dev/null; then
			run peer-attn 120 python3 "$bin/peer_attn.py"
			grep pytorch "$out/peer-attn.log" >> "$out/summary.txt"
		fi
		;;
	profile)
		for prec in fp32 bf16; do
			p=""
			[ "$prec" = bf16 ] && p=--bf16
			run "profile-124m-$prec" 240 env GOTRON_CUDA_PROFILE=1 "$bin/gotron" train --device cuda --mock-data --num-layers 12 \
				--hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
				--micro-batch-size 8 --global-batch-size 8 --train-iters 3 --log-interval 1 --vocab-size 50304 --lr 1e-4 --eval-iters 0 $p
			# which functions make the host copies inside a step
			grep "copy host to device\|copy device to host\|cuda device: " "$out/profile-124m-$prec.log" >> "$out/summary.txt"
		done
		;;
	esac
done
cat "$out/summary.txt"
