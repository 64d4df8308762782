package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/comm"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

const trainSynopsis = "train [flags]   (Megatron's pretrain_gpt.py flags; no flags: the quickstart)"

// trainFlags are gotron train's flags, by Megatron's names.
type trainFlags struct {
	preset                          string
	noWDCond                        string // --no-weight-decay-cond-type (deprecated)
	model                           gpt.Config
	gqa                             bool
	swiglu, openaiGELU, squaredReLU bool
	divisibleBy                     int

	tpSize, ppSize, cpSize int
	tpPPDPMapping          bool // --use-tp-pp-dp-mapping: rank order parallel.TPPPDPOrder
	distOptInstances       int  // --num-distributed-optimizer-instances
	cp                     cpFlags
	fp8                    fp8Flags // fp8flags.go
	fsdp                   fsdpFlags
	timeoutMins            float64
	heartbeat              heartbeatFlags
	distBackend            string
	useCkptArgs            bool
	recomputeGranularity   train.RecomputeGranularity
	ckptFormat             string
	rampup                 listFlag
	attentionBackend       string

	cfg            train.Config
	schedule       optim.SchedulerFlags
	lrDecayStyle   string
	wsdDecayStyle  string
	wdIncrStyle    string
	exitMins       float64
	data           dataArgs
	quickstartDir  string
	noProgress     bool
	cpuProfile     string
	profile        bool  // --profile: a CPU profile of iterations profStart+1..profEnd
	profStart      int64 // --profile-step-start
	profEnd        int64 // --profile-step-end
	device         string
	memFraction    float64
	promptAfter    string
	generateTokens int
	// compat are the Megatron arguments taken only for compatibility
	// (cmd/gotron/megatronargs.go).
	compat map[string]bool
	moe    moeFlags // moeflags.go
	mla    mlaFlags // mlaflags.go
	gdn    gdnFlags // gdnflags.go
	rl     rlFlags  // rlflags.go
	// finish copies float64 flag values into the float32 config fields.
	finish func()
}

// dataArgs are the data and tokenizer flags shared by train and data tools.
type dataArgs struct {
	dataPath, trainPath, validPath, testPath listFlag
	split, cachePath                         string
	mock                                     bool
	masks                                    datagpt.MaskOptions
	tok                                      tokenizer.Config
	fim                                      fimArgs // dataflags.go
}

func addDataArgs(fs *flag.FlagSet, d *dataArgs) {
	fs.Var(&d.dataPath, "data-path", "dataset prefixes with optional weights: 'PREFIX' or '30 a 70 b'")
	fs.Var(&d.trainPath, "train-data-path", "training-split blend (excludes --data-path)")
	fs.Var(&d.validPath, "valid-data-path", "validation-split blend")
	fs.Var(&d.testPath, "test-data-path", "test-split blend")
	fs.StringVar(&d.split, "split", "", "train,valid,test proportions (default 969,30,1)")
	fs.StringVar(&d.cachePath, "data-cache-path", "", "directory for index caches (Megatron's file names)")
	fs.BoolVar(&d.mock, "mock-data", false, "train on synthetic tokens")
	fs.BoolVar(&d.masks.ResetPositionIDs, "reset-position-ids", false, "restart position ids after each end-of-document token")
	fs.BoolVar(&d.masks.ResetAttentionMask, "reset-attention-mask", false, "mask attention across documents of a packed sequence")
	fs.BoolVar(&d.masks.EODMaskLoss, "eod-mask-loss", false, "no loss on end-of-document tokens")
	addFIMFlags(fs, &d.fim)
	addTokenizerFlags(fs, &d.tok)
}

func newTrainFlags() (*flag.FlagSet, *trainFlags) { return newTrainFlagsWith("train", nil) }

// newTrainFlagsWith is newTrainFlags for command name, with extra defining
// that command's own flags before the Megatron compatibility flags, which
// skip any name already defined (gotron inference takes train's parser plus
// Megatron's inference arguments, as Megatron's inference scripts do).
func newTrainFlagsWith(name string, extra func(*flag.FlagSet)) (*flag.FlagSet, *trainFlags) {
	fs := newFlags(name, trainSynopsis)
	f := &trainFlags{schedule: optim.DefaultSchedulerFlags()}
	m, c, s := &f.model, &f.cfg, &f.schedule
	fs.String("config", "", "YAML file of flag values (keys with - or _); command-line flags override it")
	fs.StringVar(&f.preset, "model", "", "architecture preset: tiny, gpt2-small, gpt2-medium, llama-tiny (flags override)")
	fs.IntVar(&m.NumLayers, "num-layers", 0, "transformer layers")
	fs.IntVar(&m.HiddenSize, "hidden-size", 0, "hidden size")
	fs.IntVar(&m.FFNHiddenSize, "ffn-hidden-size", 0, "MLP hidden size (default 4×hidden)")
	fs.IntVar(&m.NumAttentionHeads, "num-attention-heads", 0, "attention heads")
	fs.IntVar(&m.KVChannels, "kv-channels", 0, "head dimension (default hidden/heads)")
	fs.BoolVar(&f.gqa, "group-query-attention", false, "use grouped-query attention")
	fs.IntVar(&m.NumQueryGroups, "num-query-groups", 0, "key/value heads with --group-query-attention")
	fs.IntVar(&m.MaxPositionEmbeddings, "max-position-embeddings", 0, "position table size (default --seq-length)")
	fs.Var(&m.PositionEmbeddingType, "position-embedding-type", "learned_absolute, rope or none")
	fs.Float64Var(&m.RotaryBase, "rotary-base", 10000, "RoPE base")
	fs.Float64Var(&m.RotaryPercent, "rotary-percent", 1, "fraction of head dims RoPE rotates")
	fs.BoolVar(&m.RotaryInterleaved, "rotary-interleaved", false, "RoPE on (2i, 2i+1) pairs instead of halves")
	fs.Var(&m.Normalization, "normalization", "LayerNorm or RMSNorm")
	normEps := fs.Float64("norm-epsilon", 1e-5, "normalisation epsilon")
	fs.BoolVar(&m.QKLayerNorm, "qk-layernorm", false, "normalise each query and key head before RoPE (Megatron's q_layernorm, k_layernorm); with --multi-latent-attention, the query and key-value latents (q_layernorm, kv_layernorm)")
	fs.BoolVar(&m.LayerNorm1P, "apply-layernorm-1p", false, "norms scale by 1 + γ with γ initialised to 0 (Megatron's zero-centred gamma)")
	fs.BoolVar(&f.swiglu, "swiglu", false, "SwiGLU MLP (fc1 rows [gate; up])")
	fs.BoolVar(&f.openaiGELU, "openai-gelu", false, "tanh-approximated GELU (GPT-2's)")
	fs.BoolVar(&f.squaredReLU, "squared-relu", false, "squared-ReLU MLP activation, relu(x)² (Megatron's squared_relu; --device cpu and sim)")
	fs.BoolVar(&m.DisableBiasLinear, "disable-bias-linear", false, "no biases in linear layers")
	fs.BoolVar(&m.AddQKVBias, "add-qkv-bias", false, "keep the QKV bias with --disable-bias-linear")
	attnDrop := fs.Float64("attention-dropout", 0.1, "dropout on the attention probabilities")
	hidDrop := fs.Float64("hidden-dropout", 0.1, "dropout on residual branches and embeddings")
	fs.BoolVar(&m.UntieEmbeddingsAndOutputWeights, "untie-embeddings-and-output-weights", false, "separate output layer weight")
	initStd := fs.Float64("init-method-std", 0.02, "weight init standard deviation")
	fs.BoolVar(&m.MuP.Enabled, "use-mup", false, "Megatron's muP: with m = --hidden-size / --mup-base-hidden-size, hidden matrices init std/√m, attention scale 1/d, logits ×1/m, Adam lr and ε of hidden matrices ×1/m (SGD: vector-like lr ×m)")
	fs.IntVar(&m.MuP.BaseHiddenSize, "mup-base-hidden-size", 0, "with --use-mup: the base (proxy) model's hidden size (0: --hidden-size, m = 1)")
	fs.Float64Var(&m.MuP.EmbeddingMult, "mup-embedding-mult", 1, "with --use-mup: multiplier on the embeddings' output")
	fs.Float64Var(&m.MuP.OutputMult, "mup-output-mult", 1, "with --use-mup: multiplier on the logits (1: 1/m)")
	fs.Float64Var(&m.MuP.BaseHeadDim, "mup-base-head-dim", 0, "with --use-mup: attention scale √(this)/d^power (0: 1/d^power)")
	fs.Float64Var(&m.MuP.AttnScalePower, "mup-attn-scale-power", 1, "with --use-mup: attention scale 1/d^power (0.5: the standard 1/√d)")
	fs.IntVar(&f.divisibleBy, "make-vocab-size-divisible-by", 128, "pad the vocabulary to a multiple of this × TP")
	fs.IntVar(&f.tpSize, "tensor-model-parallel-size", 1, "tensor-parallel size: split every layer's matrices over this many ranks")
	fs.BoolVar(&c.SequenceParallel, "sequence-parallel", false, "with tensor parallelism: shard norms, dropouts and residuals along the sequence")
	fs.IntVar(&f.ppSize, "pipeline-model-parallel-size", 1, "pipeline-parallel size: split the layers into this many stages (train: the 1F1B schedule; inference: one rank each, the last draws the tokens)")
	ps := &c.Pipeline
	fs.IntVar(&ps.VPP, "num-virtual-stages-per-pipeline-rank", 0, "model chunks per pipeline rank: Megatron's interleaved schedule (0: one)")
	fs.IntVar(&ps.VPP, "virtual-pipeline-model-parallel-size", 0, "= --num-virtual-stages-per-pipeline-rank (Megatron's older name)")
	fs.IntVar(&ps.LayersPerVirtualStage, "num-layers-per-virtual-pipeline-stage", 0, "layers per model chunk: the other way to ask for the interleaved schedule")
	fs.IntVar(&ps.FirstLayers, "decoder-first-pipeline-num-layers", 0, "layers of the first pipeline stage (uneven split; 0: even)")
	fs.IntVar(&ps.LastLayers, "decoder-last-pipeline-num-layers", 0, "layers of the last pipeline stage (uneven split; 0: even)")
	fs.BoolVar(&ps.AccountForEmbedding, "account-for-embedding-in-pipeline-split", false, "count the embedding as a layer in the even pipeline split: the first stage builds one transformer layer fewer (Megatron's rule)")
	fs.BoolVar(&ps.AccountForLoss, "account-for-loss-in-pipeline-split", false, "count the loss as a layer in the even pipeline split: the last stage builds one transformer layer fewer (Megatron's rule)")
	fs.IntVar(&c.MicrobatchGroupSize, "microbatch-group-size-per-virtual-pipeline-stage", 0, "micro-batches each model chunk runs in a row in the interleaved schedule (0: the pipeline size)")
	fs.BoolVar(&f.tpPPDPMapping, "use-tp-pp-dp-mapping", false, "order the ranks "+parallel.TPPPDPOrder+" (data-parallel replicas farthest apart) instead of "+parallel.DefaultOrder+", as Megatron")
	fs.IntVar(&f.cpSize, "context-parallel-size", 1, "context-parallel size: each rank holds 2 of 2×N chunks of every sequence; attention runs over the group (--cp-comm-type)")
	f.cp.add(fs, c)
	f.fp8.add(fs)
	f.fsdp.add(fs)
	fs.BoolVar(&c.DDP.DistributedOptimizer, "use-distributed-optimizer", false, "shard optimizer state over data-parallel ranks (ZeRO-1): reduce-scatter grads, all-gather params")
	fs.IntVar(&f.distOptInstances, "num-distributed-optimizer-instances", 1, "with --use-distributed-optimizer: cut the data-parallel ranks into this many instances, each sharding the optimizer state over its own ranks; gradients are reduce-scattered within an instance and all-reduced across instances (Megatron's partial distributed optimizer)")
	fs.BoolVar(&c.DDP.OverlapGradReduce, "overlap-grad-reduce", false, "start each gradient bucket's reduction during backward of the last micro-batch")
	fs.BoolVar(&c.DDP.OverlapParamGather, "overlap-param-gather", false, "with --use-distributed-optimizer: leave parameter all-gathers in flight until the next forward")
	fs.IntVar(&c.DDP.BucketSize, "ddp-bucket-size", 0, "gradient bucket size in elements (default: max(40M, 1M×DP) with --overlap-grad-reduce, else one bucket)")
	fs.BoolVar(&c.DDP.AverageInCollective, "ddp-average-in-collective", false, "average gradients in the collective instead of pre-scaling by 1/DP")
	fs.Bool("accumulate-allreduce-grads-in-fp32", false, "accepted: gradients are accumulated and reduced in float32 unless --grad-reduce-in-bf16 (which overrides it, as in Megatron)")
	fs.BoolVar(&c.DDP.ReduceInBF16, "grad-reduce-in-bf16", false, "with --bf16: keep the gradient buffer in bfloat16 (rounded after every micro-batch) and reduce it over data parallelism as bfloat16, half the bytes")
	fs.Float64Var(&f.timeoutMins, "distributed-timeout-minutes", 0, "how long a rank waits for another inside a collective (default 10 minutes, as Megatron)")
	f.heartbeat.register(fs)
	fs.StringVar(&f.distBackend, "distributed-backend", "", "collectives between processes: nccl (GPUs, --device cuda: comm/nccl) or gloo/tcp (gotron's TCP process group); default nccl with --device cuda, else tcp; nccl on the CPU (Megatron's GPU configs) runs over tcp, with one line saying so")

	fs.IntVar(&c.SeqLength, "seq-length", 0, "tokens per sample")
	fs.IntVar(&c.MicroBatchSize, "micro-batch-size", 0, "samples per forward/backward")
	fs.IntVar(&c.GlobalBatchSize, "global-batch-size", 0, "samples per optimizer step (default micro batch)")
	fs.IntVar(&c.EvalGlobalBatchSize, "eval-global-batch-size", 0, "samples per evaluation batch (0: --global-batch-size), as Megatron")
	fs.IntVar(&c.EvalMicroBatchSize, "eval-micro-batch-size", 0, "samples per evaluation forward (0: --micro-batch-size), as Megatron")
	fs.Int64Var(&c.TrainIters, "train-iters", 0, "iterations to train")
	fs.Int64Var(&c.TrainSamples, "train-samples", 0, "samples to train (instead of --train-iters)")
	fs.Int64Var(&c.Seed, "seed", 1234, "random seed")
	fs.Var(&c.Optimizer, "optimizer", "adam (AdamW) or sgd")
	fs.Float64Var(&s.LR, "lr", 0, "peak learning rate")
	fs.Float64Var(&s.MinLR, "min-lr", 0, "final learning rate")
	fs.Float64Var(&s.LRWarmupInit, "lr-warmup-init", 0, "learning rate at the start of warmup")
	fs.StringVar(&f.lrDecayStyle, "lr-decay-style", "linear", "constant, linear, cosine, inverse-square-root or WSD")
	fs.StringVar(&f.wsdDecayStyle, "lr-wsd-decay-style", "exponential", "WSD anneal: exponential, linear, cosine or minus_sqrt")
	fs.Int64Var(&s.LRDecayIters, "lr-decay-iters", 0, "decay length in iterations (default --train-iters)")
	fs.Int64Var(&s.LRDecaySamples, "lr-decay-samples", 0, "decay length in samples")
	fs.Int64Var(&s.LRWSDDecayIters, "lr-wsd-decay-iters", 0, "WSD anneal length in iterations")
	fs.Int64Var(&s.LRWSDDecaySamples, "lr-wsd-decay-samples", 0, "WSD anneal length in samples")
	fs.Int64Var(&s.LRWarmupIters, "lr-warmup-iters", 0, "warmup length in iterations")
	fs.Int64Var(&s.LRWarmupSamples, "lr-warmup-samples", 0, "warmup length in samples")
	fs.Float64Var(&s.LRWarmupFraction, "lr-warmup-fraction", 0, "warmup as a fraction of the decay length")
	fs.Float64Var(&s.WeightDecay, "weight-decay", 0.01, "weight decay (not on biases and 1-D parameters)")
	fs.BoolVar(&c.ApplyWDToQKLayerNorm, "apply-wd-to-qk-layernorm", false, "apply weight decay to the --qk-layernorm query/key norms too (Megatron exempts 1-D parameters and biases otherwise)")
	fs.StringVar(&f.noWDCond, "no-weight-decay-cond-type", "", "apply_wd_to_qk_layernorm: Megatron's deprecated spelling of --apply-wd-to-qk-layernorm")
	fs.Float64Var(&s.StartWeightDecay, "start-weight-decay", 0, "initial weight decay for linear/cosine increments")
	fs.Float64Var(&s.EndWeightDecay, "end-weight-decay", 0, "final weight decay for linear/cosine increments")
	fs.StringVar(&f.wdIncrStyle, "weight-decay-incr-style", "constant", "constant, linear or cosine")
	fs.BoolVar(&s.OverrideOptParamScheduler, "override-opt_param-scheduler", false, "ignore the checkpoint's scheduler settings")
	fs.BoolVar(&s.UseCheckpointOptParamScheduler, "use-checkpoint-opt_param-scheduler", false, "take scheduler settings from the checkpoint")
	fs.Float64Var(&c.ClipGrad, "clip-grad", 1.0, "clip gradients to this global L2 norm (0: off)")
	fs.Float64Var(&c.Adam.Beta1, "adam-beta1", 0.9, "Adam β1")
	fs.Float64Var(&c.Adam.Beta2, "adam-beta2", 0.999, "Adam β2")
	fs.Float64Var(&c.Adam.Eps, "adam-eps", 1e-8, "Adam ε")
	fs.Float64Var(&c.SGDMomentum, "sgd-momentum", 0.9, "SGD momentum")
	fs.BoolVar(&c.BF16, "bf16", false, "matrix products on bfloat16-rounded operands with float32 accumulation (AVX512_BF16); weights, grads and optimizer stay float32")
	fs.BoolVar(&c.FP16, "fp16", false, "matrix products on fp16-rounded operands (emulated: fp16 numerics, fp32 speed) with float32 accumulation and float32 master weights, and loss scaling")
	ls := &c.LossScale
	fs.Float64Var(&ls.Constant, "loss-scale", 0, "with --fp16: a constant loss scale (0: dynamic scaling)")
	fs.Float64Var(&ls.InitialScale, "initial-loss-scale", 1<<32, "with --fp16: the dynamic loss scale's initial value")
	fs.Float64Var(&ls.MinScale, "min-loss-scale", 1, "with --fp16: the dynamic loss scale's floor")
	fs.IntVar(&ls.Window, "loss-scale-window", 1000, "with --fp16: clean iterations before the dynamic loss scale doubles")
	fs.IntVar(&ls.Hysteresis, "hysteresis", 2, "with --fp16: overflowing iterations before the dynamic loss scale halves")
	fs.IntVar(&c.MaxSkipsInARow, "max-nan-iterations", 10, "stop after this many NaN/Inf iterations in a row")
	fs.BoolVar(&c.CalculatePerTokenLoss, "calculate-per-token-loss", false, "normalise the loss by the global batch's unmasked tokens (Σ token losses / Σ tokens), not per micro-batch: micro-batches weigh by their tokens (e.g. with --eod-mask-loss); gradients are summed over data-parallel ranks and divided by the token count")
	fs.Int64Var(&c.CheckWeightHashInterval, "check-weight-hash-across-dp-replicas-interval", 0, "compare the SHA-1 hashes of every parameter across the data-parallel replicas before training and every this many iterations; a mismatch stops the run naming the ranks (0: never)")
	fs.BoolVar(&c.VerifyIntegrity, "verify-integrity", false, "on --load, read every shard of the checkpoint and check it against the CRC-32C its save recorded (every save records them) before resuming")
	fs.BoolVar(&c.TestMode, "test-mode", false, "Megatron's real-time tests: with --qk-layernorm, check before every iteration and evaluation that the query/key layer norms are the same on every data- and tensor-parallel rank")
	rr := &c.Rerun
	fs.StringVar(&rr.Mode, "rerun-mode", "disabled", "Megatron's rerun state machine: disabled (gotron's default: a NaN/Inf iteration is skipped, see --max-nan-iterations), validate_results (a NaN/Inf loss reruns the iteration in place: a different result exits 17 as transient, the same saves a checkpoint and exits 16 to be rerun from it on another device) or report_stats (reruns every iteration and reports the relative differences)")
	fs.IntVar(&rr.ErrorInjectionRate, "error-injection-rate", 0, "with --rerun-mode validate_results: reject one loss validation in this many, to test the machine (0: never)")
	fs.StringVar(&rr.ErrorInjectionType, "error-injection-type", "transient_error", "the kind of error --error-injection-rate injects: correct_result, transient_error or persistent_error")
	fs.BoolVar(&rr.CheckForSpikyLoss, "check-for-spiky-loss", false, "with --rerun-mode validate_results: also reject a loss 10 times the largest of the first 100 (not fatal)")

	fs.Int64Var(&c.EvalInterval, "eval-interval", 1000, "iterations between evaluations")
	fs.Int64Var(&c.EvalIters, "eval-iters", 100, "global batches per evaluation (0: no validation or test evaluation)")
	fs.IntVar(&c.NumWorkers, "num-workers", 2, "Megatron's data-loader workers: gotron reads in the training process, and with --fim-data micro-batch k is read as worker k mod N (each has its own FIM random stream)")
	fs.BoolVar(&c.SkipTrain, "skip-train", false, "no training: only the validation and test evaluation (with --load)")
	fs.Int64Var(&c.LogInterval, "log-interval", 100, "iterations between log lines")
	fs.StringVar(&c.MetricsFile, "metrics-file", "", "append one JSON object per log line to this file")
	tb := &c.TensorBoard
	fs.StringVar(&tb.Dir, "tensorboard-dir", "", "write TensorBoard event files here (lm loss, learning-rate, grad-norm, batch-size, loss-scale, validation)")
	fs.Int64Var(&tb.LogInterval, "tensorboard-log-interval", 1, "iterations between TensorBoard scalars")
	fs.BoolVar(&tb.LogTimers, "log-timers-to-tensorboard", false, "also write iteration-time and each --timing-log-level timer's max over the ranks (NAME-time, seconds per iteration) to TensorBoard")
	fs.IntVar(&c.TimingLogLevel, "timing-log-level", 0, "Megatron's timers after each log line: 0 only set-up, checkpoint and evaluation times; 1 also forward-backward, gradient reductions and optimizer phases; 2 also batch generator and forward/backward compute")
	fs.StringVar(&c.TimingLogOption, "timing-log-option", train.TimingMinMax, "how the timers are reported over the ranks: max, minmax or all (every rank's)")
	fs.BoolVar(&tb.LogThroughput, "log-throughput", false, "print the throughput (TFLOP/s per rank) on the log line (and to TensorBoard with --log-timers-to-tensorboard)")
	fs.BoolVar(&tb.LogValidationPPL, "log-validation-ppl-to-tensorboard", false, "also write the validation perplexity to TensorBoard")
	fs.BoolVar(&tb.LogMemory, "log-memory-to-tensorboard", false, "also write Go heap sizes (Megatron's mem-* scalars) to TensorBoard")
	fs.Int("tensorboard-queue-size", 1000, "accepted: gotron buffers events in memory and flushes them at every log line")
	fs.Float64Var(&c.PeakFLOPs, "peak-flops", 0, "per-process peak FLOP/s for MFU (0: measure this CPU's fp32 FMA peak over the kernel threads at start, doubled with --bf16; with --device cuda, the GPU's datasheet peak)")
	fs.BoolVar(&f.noProgress, "no-progress", false, "no progress bar even on a terminal")
	fs.StringVar(&f.device, "device", "cpu", deviceUsage)
	fs.Float64Var(&f.memFraction, "device-memory-fraction", 0, memFractionUsage)
	fs.StringVar(&f.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the training loop to this file (go tool pprof); under launch --inproc rank 0's covers every rank, other processes' ranks r write FILE.rank<r>")
	fs.BoolVar(&f.profile, "profile", false, "Megatron's --profile as a Go CPU profile of iterations --profile-step-start+1 to --profile-step-end, written to --cpu-profile FILE, else TENSORBOARD_DIR/cpu-profile.pb.gz (go tool pprof; one line says where)")
	fs.Int64Var(&f.profStart, "profile-step-start", 10, "with --profile: profiling starts after this many iterations")
	fs.Int64Var(&f.profEnd, "profile-step-end", 12, "with --profile: profiling stops after this many iterations")

	fs.StringVar(&c.Save, "save", "", "checkpoint directory to save to")
	fs.StringVar(&c.Load, "load", "", "checkpoint directory to resume from")
	fs.Int64Var(&c.SaveInterval, "save-interval", 0, "iterations between checkpoints")
	fs.Int64Var(&c.SaveRetainInterval, "save-retain-interval", 0, "when a checkpoint becomes the latest, delete the previous latest unless its iteration is a multiple of this (Megatron's rule; a multiple of --save-interval; 0: keep all)")
	fs.BoolVar(&c.LogProgress, "log-progress", false, "append Megatron's job log to SAVE/progress.txt: job start, each save with its throughput, FLOPs and tokens, deletions (Job ID from SLURM_JOB_ID)")
	fs.Int64Var(&c.ExitInterval, "exit-interval", 0, "save and exit at iterations divisible by this")
	fs.Float64Var(&f.exitMins, "exit-duration-in-mins", 0, "save and exit after this many minutes")
	fs.BoolVar(&c.NoSaveOptim, "no-save-optim", false, "do not save optimizer state")
	fs.BoolVar(&c.NoLoadOptim, "no-load-optim", false, "do not load optimizer state")
	fs.BoolVar(&c.NoLoadRNG, "no-load-rng", false, "do not load the dropout streams' state")
	fs.BoolVar(&c.Recompute.Selective, "recompute-activations", false, "recompute the attention core in backward (= --recompute-granularity selective)")
	fs.Var(&f.recomputeGranularity, "recompute-granularity", "activation recomputation: full or selective")
	fs.StringVar(&c.Recompute.Method, "recompute-method", "", "with --recompute-granularity full: uniform (chunks of --recompute-num-layers layers) or block (the first --recompute-num-layers layers)")
	fs.IntVar(&c.Recompute.NumLayers, "recompute-num-layers", 0, "layers per recomputed chunk (uniform) or recomputed layers (block)")
	fs.BoolVar(&c.Fusions.NoBiasGELU, "no-bias-gelu-fusion", false, "add fc1's bias and apply the GELU as two ops, not the fused bias-GELU (the same numbers, one more pass over memory)")
	fs.BoolVar(&c.Fusions.NoBiasSwiGLU, "no-bias-swiglu-fusion", false, "add fc1's bias and apply the SwiGLU as two ops, not the fused bias-SwiGLU (the same numbers, one more pass over memory)")
	fs.BoolVar(&c.Fusions.NoBiasDropout, "no-bias-dropout-fusion", false, "add the output projections' biases, drop out and add the residual as separate ops, not the fused bias-dropout-add (the same numbers; the tape then keeps the dropout mask and the dropped values)")
	fs.Float64Var(&c.DecoupledLR, "decoupled-lr", 0, "separate peak learning rate for the word embedding and output layer")
	fs.Float64Var(&c.DecoupledMinLR, "decoupled-min-lr", 0, "final learning rate with --decoupled-lr (default --min-lr)")
	fs.BoolVar(&f.useCkptArgs, "use-checkpoint-args", false, "take the model architecture from the --load checkpoint")
	fs.StringVar(&f.ckptFormat, "ckpt-format", ckpt.FormatName, "checkpoint format: "+ckpt.FormatName+" (gotron's sharded safetensors + checkpoint.json: every rank writes its shards, any layout loads them); torch_dist, and fsdp_dtensor with --use-megatron-fsdp, mean the same; torch: Megatron's legacy per-rank model_optim_rng.pt files (saved and loaded by one TP/PP layout, as Megatron; a Megatron torch checkpoint resumes directly)")
	fs.StringVar(&c.CkptConvertFormat, "ckpt-convert-format", "", "convert --load's checkpoint: save it at its iteration in this format (torch, or torch_dist: gotron's sharded one) under --ckpt-convert-save/<format>, then exit without training")
	fs.StringVar(&c.CkptConvertSave, "ckpt-convert-save", "", "directory for --ckpt-convert-format's converted checkpoint")
	fs.BoolVar(&c.AsyncSave, "async-save", false, "save checkpoints in the background: the saving iteration copies this rank's shards and training goes on while they are written")
	fs.Float64Var(&c.AsyncSaveRate, "async-save-rate", 0, "with --async-save, write at most this many MB/s per rank, spreading the disk I/O's CPU cost over more steps (0: as fast as the disk goes)")
	fs.StringVar(&c.DistCkptStrictness, "dist-ckpt-strictness", "assume_ok_unexpected", "checkpoint tensors the model does not use: "+strings.Join(train.StrictnessValues, ", ")+" (missing tensors and shape mismatches are always errors)")
	fs.Bool("use-cpu-initialization", false, "accepted: gotron always initialises on the CPU from the seed, whole (any parallel layout starts from the same model)")
	fs.BoolVar(&c.LogParamsNorm, "log-params-norm", false, "print the parameters' L2 norm on the log line")
	fs.BoolVar(&c.LogNumZerosInGrad, "log-num-zeros-in-grad", false, "count the zero gradient elements each iteration: 'num zeros: N' after the grad norm, TensorBoard num-zeros, metrics num_zeros")
	fs.StringVar(&c.StepBatchSizeSchedule, "step-batch-size-schedule", "", "\"THRESHOLD:BS ...\": global batch BS from THRESHOLD tokens on (K/M/B/T suffixes; first threshold 0); excludes --global-batch-size")
	fs.StringVar(&f.attentionBackend, "attention-backend", "auto", "auto, flash, fused, unfused or local: a GPU kernel choice; the CPU runs its one fused attention kernel")
	fs.Var(&f.rampup, "rampup-batch-size", "START INCR RAMP_SAMPLES: ramp the global batch up (needs --train-samples)")
	fs.BoolVar(&c.Finetune, "finetune", false, "load weights only; start at iteration 0")
	addDataArgs(fs, &f.data)
	addMoEFlags(fs, &f.moe)
	addMLAFlags(fs, &f.mla)
	addGDNFlags(fs, &f.gdn)
	addRLFlags(fs, &f.rl)
	fs.StringVar(&f.quickstartDir, "quickstart-dir", "gotron-quickstart", "where the quickstart keeps its corpus and checkpoint")
	fs.StringVar(&f.promptAfter, "sample-prompt", "", "after training, print a sample continuing this prompt")
	fs.IntVar(&f.generateTokens, "sample-tokens", 100, "tokens in the sample printed after training")
	for _, name := range acceptedNoOps {
		fs.Bool(name, false, "accepted for Megatron compatibility; no effect on CPU")
	}
	for name, why := range refusedFlags {
		if refusedTakesValue[name] {
			fs.String(name, "", "refused: "+why)
		} else {
			fs.Bool(name, false, "refused: "+why)
		}
	}
	if extra != nil {
		extra(fs)
	}
	f.compat = addCompatFlags(fs)
	noteRLGraphArgs(fs, f.compat)
	f.finish = func() {
		m.NormEpsilon, m.AttentionDropout, m.HiddenDropout = float32(*normEps), float32(*attnDrop), float32(*hidDrop)
		m.InitMethodStd = float32(*initStd)
	}
	return fs, f
}

// acceptedNoOps are Megatron flags that select GPU fusions or kernels; gotron
// accepts them so launch scripts port unchanged.
var acceptedNoOps = []string{"use-flash-attn", "no-masked-softmax-fusion", "no-gradient-accumulation-fusion", "use-mcore-models",
	"no-async-tensor-model-parallel-allreduce", "no-persist-layer-norm", "no-rope-fusion"}

// refusedTakesValue marks the refused flags that take a value.
var refusedTakesValue = map[string]bool{"wandb-project": true, "ft-num-warmup-iters": true}

// refusedFlags are Megatron flags for features this release does not run
// yet: accepting them silently would train something else than asked.
var refusedFlags = map[string]string{
	"wandb-project":       "Weights & Biases cannot be reached from here (no network but the package registries); use --tensorboard-dir",
	"calc-ft-timeouts":    ftRefused,
	"ft-num-warmup-iters": ftRefused,
}

// ftRefused is why the section-timeout flags of NVIDIA's fault-tolerance
// package are refused (trainheartbeat.go has the heartbeats that are built).
const ftRefused = "the fault-tolerance package's section timeouts are not built; rank liveness is checked by --heartbeat-timeout, hangs by --distributed-timeout-minutes"

func cmdTrain(ctx context.Context, env *cli, args []string) error {
	fs, f := newTrainFlags()
	if err := parseFlags(fs, args, env.stdout, trainSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	f.finish()
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if given["num-workers"] && !f.data.fim.data {
		fmt.Fprintf(env.stderr, "gotron train: --num-workers %d: no effect without --fim-data: gotron reads samples in the training process (the same samples)\n", f.cfg.NumWorkers)
	}
	if given["cache-mla-latents"] && f.promptAfter == "" {
		fmt.Fprintf(env.stderr, "gotron train: --cache-mla-latents: no effect without --sample-prompt (it changes how decoding caches multi-latent attention, not training)\n")
	}
	if given["tensorboard-queue-size"] {
		fmt.Fprintf(env.stderr, "gotron train: --tensorboard-queue-size has no effect: events are buffered in memory and flushed at every log line\n")
	}
	var noOps []string
	for _, name := range acceptedNoOps {
		if given[name] {
			noOps = append(noOps, "--"+name)
		}
	}
	if given["attention-backend"] {
		switch f.attentionBackend {
		case "auto", "flash", "fused", "unfused", "local":
			noOps = append(noOps, "--attention-backend "+f.attentionBackend)
		default:
			return fmt.Errorf("--attention-backend %q: want auto, flash, fused, unfused or local", f.attentionBackend)
		}
	}
	if given["step-batch-size-schedule"] && given["global-batch-size"] {
		return fmt.Errorf("--step-batch-size-schedule and --global-batch-size exclude each other (as Megatron: the schedule sets the global batch)")
	}
	noOps = append(noOps, f.moe.noOps(given)...)
	rlNotes, err := f.rl.check(given)
	if err != nil {
		return err
	}
	for _, n := range rlNotes {
		fmt.Fprintf(env.stderr, "gotron train: %s\n", n)
	}
	if err := f.megatronCompat(env, fs, given); err != nil {
		return err
	}
	if len(noOps) > 0 {
		fmt.Fprintf(env.stderr, "gotron train: %s: no effect on the CPU backend (GPU kernel and fusion choices)\n", strings.Join(noOps, ", "))
	}
	if f.cfg.VerifyIntegrity && f.ckptFormat == train.CkptFormatTorch {
		return fmt.Errorf("--verify-integrity is only supported with the torch_dist checkpoint format (gotron's own), as Megatron asserts; not with --ckpt-format torch")
	}
	if r := &f.cfg.Recompute; f.recomputeGranularity == train.RecomputeNone && !r.Selective && (r.Method != "" || r.NumLayers != 0) {
		// Megatron checks --recompute-method and --recompute-num-layers
		// only under a granularity; without one they do nothing
		// (gpt3_mcore_reruns_resume_check_grads passes the number alone).
		fmt.Fprintln(env.stderr, "gotron train: --recompute-method/--recompute-num-layers without --recompute-granularity: nothing is recomputed, as in Megatron")
		r.Method, r.NumLayers = "", 0
	}
	if f.cfg.BF16 && !tensor.HasBF16Matmul() {
		fmt.Fprintf(env.stderr, "gotron train: --bf16: this CPU has no AVX512_BF16: bf16-rounded matrix products run at float32 speed\n")
	}
	if len(given) == 0 || (len(given) == 1 && given["quickstart-dir"]) {
		return quickstart(ctx, env, f)
	}
	for name, why := range refusedFlags {
		if given[name] {
			return fmt.Errorf("--%s: %s", name, why)
		}
	}
	if err := checkNumbers(trainNumberRules, flagText(fs)); err != nil {
		return err
	}
	if err := f.missingRequired(); err != nil {
		return err
	}
	if !f.cfg.FP16 {
		for _, name := range []string{"initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis"} {
			if given[name] {
				return fmt.Errorf("--%s: dynamic loss scaling runs only with --fp16", name)
			}
		}
		if given["loss-scale"] && !f.cfg.BF16 {
			return fmt.Errorf("--loss-scale: loss scaling runs only with --fp16 or --bf16")
		}
	}
	if f.distOptInstances > 1 && !f.cfg.DDP.DistributedOptimizer {
		return fmt.Errorf("--num-distributed-optimizer-instances=%d needs --use-distributed-optimizer (as Megatron)", f.distOptInstances)
	}
	if f.ppSize < 1 {
		return fmt.Errorf("--pipeline-model-parallel-size=%d: want >= 1", f.ppSize)
	}
	f.cfg.Pipeline.PP = f.ppSize // the layer split is checked with the model's --num-layers in train.New
	timeout := defaultDistributedTimeout
	if f.timeoutMins > 0 {
		timeout = time.Duration(f.timeoutMins * float64(time.Minute))
	}
	jo, err := f.heartbeat.resolve(env, given, args)
	if err != nil {
		return err
	}
	backend, err := f.distributedBackend()
	if err != nil {
		return err
	}
	if backend == "nccl" { // the GPU first, so that NCCL joins on the one --device names
		if _, err := parseDevice(f.device, f.memFraction); err != nil {
			return err
		}
	}
	world, closeWorld, err := joinWorld(ctx, env, timeout, backend, jo)
	if err != nil {
		return err
	}
	defer closeWorld()
	world = simDeviceWorld(env, f.device, world)
	if f.moe.ep > 1 && f.moe.numExperts%f.moe.ep != 0 {
		return fmt.Errorf("--num-experts=%d is not divisible by --expert-model-parallel-size=%d", f.moe.numExperts, f.moe.ep)
	}
	if world == nil && f.moe.ep > 1 {
		return fmt.Errorf("--expert-model-parallel-size=%d needs %d ranks or a multiple: start them with gotron launch (or torchrun, srun, mpirun)", f.moe.ep, f.moe.ep)
	}
	if world == nil && f.moe.etp > 1 {
		return fmt.Errorf("--expert-tensor-parallel-size=%d needs %d ranks or a multiple: start them with gotron launch (or torchrun, srun, mpirun)", f.moe.etp, f.moe.etp)
	}
	if world == nil && f.distOptInstances > 1 {
		return fmt.Errorf("--num-distributed-optimizer-instances=%d needs %d data-parallel ranks or a multiple: start them with gotron launch (or torchrun, srun, mpirun)", f.distOptInstances, f.distOptInstances)
	}
	if world == nil && f.tpSize*f.ppSize > 1 {
		var sizes []string
		if f.tpSize > 1 {
			sizes = append(sizes, fmt.Sprintf("--tensor-model-parallel-size=%d", f.tpSize))
		}
		if f.ppSize > 1 {
			sizes = append(sizes, fmt.Sprintf("--pipeline-model-parallel-size=%d", f.ppSize))
		}
		return fmt.Errorf("%s needs %d ranks or a multiple: start them with gotron launch (or torchrun, srun, mpirun)",
			strings.Join(sizes, " with "), f.tpSize*f.ppSize)
	}
	var groups *parallel.Groups
	if world != nil {
		if groups, err = parallel.NewGroups(world, f.parallelConfig()); err != nil {
			return fmt.Errorf("%w (--tensor-model-parallel-size, --expert-model-parallel-size and --expert-tensor-parallel-size against the %d ranks)", err, world.Size())
		}
		// Rank 0 builds the dataset index caches first; the others then read them.
		if world.Rank() != 0 {
			if err := world.Barrier(ctx); err != nil {
				return fmt.Errorf("wait for rank 0 to open the data: %w", err)
			}
		}
	}
	cfg, src, err := f.build(ctx, given)
	if world != nil && world.Rank() == 0 {
		if berr := world.Barrier(ctx); err == nil && berr != nil {
			err = fmt.Errorf("data opened; tell the other ranks: %w", berr)
		}
	}
	if err != nil {
		return err
	}
	defer src.close()
	if world == nil || world.Rank() == 0 {
		for _, w := range src.warnings {
			fmt.Fprintf(env.stderr, "gotron train: %s\n", w)
		}
	}
	if world == nil || world.Rank() == 0 {
		if note := fusionNote(cfg.Model.Activation, cfg.Fusions); note != "" {
			fmt.Fprintf(env.stderr, "gotron train: %s\n", note)
		}
	}
	cfg.Parallel = groups
	if f.rl.perform {
		var printf func(string, ...any) // the logging rank's (Megatron's last)
		if world == nil || world.Rank() == world.Size()-1 {
			printf = func(format string, a ...any) { fmt.Fprintf(env.stdout, format+"\n", a...) }
		}
		c, err := f.rl.collector(&cfg, src.tok, f.data.tok, printf)
		if err != nil {
			return err
		}
		cfg.RL = c
	}
	if !f.noProgress && isTerminal(env.stdout) {
		cfg.Progress = env.stdout
	}
	cfg.Out = env.stdout
	cfg.Diag = env.stderr                  // every rank's rerun state machine messages
	cfg.JobID = env.getenv("SLURM_JOB_ID") // Megatron's progress.txt names the Slurm job
	cfg.CUDAUnverified = tensor.CUDAUnverified(env.getenv, "cp")
	cfg.CUDAUnverifiedFP8 = tensor.CUDAUnverified(env.getenv, "fp8")
	cfg.Args = map[string]any{"argv": args}
	if cfg.Load != "" && hf.IsHFDir(cfg.Load) {
		tmp, err := importHFForTraining(ctx, env, &cfg)
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
	}
	if err := train.CheckMemory(cfg); err != nil {
		return err
	}
	if cfg.Profile, err = f.stepProfile(given, cfg.TensorBoard.Dir, env.world != nil, worldRank(world), env.stderr); err != nil {
		return err
	}
	tr, err := train.New(cfg, src.train, src.valid)
	if err != nil {
		return err
	}
	defer tr.Close() // the --save lock, if Run is not reached
	if cfg.Save != "" && src.tok != nil && (groups == nil || groups.World.Rank() == 0) {
		// Before training, so that even an interrupted run's checkpoints
		// carry it: generate, serve and score then need no tokenizer flags.
		if err := carryRunTokenizer(cfg.Save, f.data.tok); err != nil {
			return err
		}
	}
	tr.SetTest(src.test)
	if groups == nil || groups.DP.Rank() == 0 {
		tp, pp := 0, 0
		if groups != nil {
			tp, pp = groups.Coords.TP, groups.Coords.PP
		}
		fmt.Fprintf(env.stdout, " > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %d\n", tp, pp, tr.NumLocalParams())
	}
	if groups != nil && groups.World.Rank() == groups.World.Size()-1 {
		how := "replicated on every data-parallel rank"
		if cfg.DDP.DistributedOptimizer {
			how = "this rank's shard (--use-distributed-optimizer)"
		}
		if cfg.FSDP != train.NoFSDP {
			how = "this rank's shard (fully sharded data parallelism)"
		}
		fmt.Fprintf(env.stdout, "gotron train: data-parallel size %d; optimizer state per rank: %.2f MB (%s)\n",
			groups.DPSize(), float64(tr.OptimizerStateBytes())/1e6, how)
		printFSDP(env.stdout, tr)
		printContextParallel(env.stdout, groups.CP.Size(), cfg)
	}
	logger := groups == nil || groups.World.Rank() == groups.World.Size()-1
	if !logger {
		env = &cli{stdout: io.Discard, stderr: env.stderr, stdin: env.stdin, getenv: env.getenv}
	}
	fmt.Fprintf(env.stdout, "gotron train: %d parameters, %d layers, hidden %d, vocab %d (padded), %d iterations of %d samples × %d tokens\n",
		tr.Model.NumParams(), cfg.Model.NumLayers, cfg.Model.HiddenSize, cfg.Model.VocabSize, tr.TrainIters(), max(cfg.GlobalBatchSize, cfg.MicroBatchSize), cfg.SeqLength)
	wholeLoop := f.cpuProfile
	if f.profile {
		wholeLoop = "" // --profile takes --cpu-profile's file for its iterations
	}
	stopProfile, err := startCPUProfile(cpuProfilePath(wholeLoop, env.world != nil, worldRank(world)))
	if err != nil {
		return err
	}
	_, err = tr.Run(ctx)
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	if f.promptAfter != "" && src.tok != nil {
		if f.ppSize > 1 {
			// The logging rank holds the last stage only.
			fmt.Fprintf(env.stdout, "gotron train: --sample-prompt: no sample under pipeline parallelism (this rank holds one stage); sample the checkpoint with gotron generate --load\n")
			return nil
		}
		tr.Model.CacheMLALatents = f.mla.cacheLatents // --multi-latent-attention checked by mlaFlags.apply
		return printSample(env, tr.Model, src.tok, f.promptAfter, f.generateTokens, cfg.Seed)
	}
	return nil
}

// distributedBackend resolves --distributed-backend: "nccl" or "tcp".
func (f *trainFlags) distributedBackend() (string, error) {
	onGPU := strings.HasPrefix(f.device, "cuda")
	switch f.distBackend {
	case "":
		if onGPU {
			return "nccl", nil
		}
		return "tcp", nil
	case "nccl":
		if !onGPU {
			return "", fmt.Errorf("--distributed-backend nccl: NCCL moves GPU memory; it needs --device cuda (on the CPU use gloo or tcp, the default)")
		}
		return "nccl", nil
	case "gloo", "tcp":
		return "tcp", nil
	}
	return "", fmt.Errorf("--distributed-backend %q: want nccl, gloo or tcp", f.distBackend)
}

// build turns the flags into a training config and data sources.
func (f *trainFlags) build(ctx context.Context, given map[string]bool) (train.Config, *dataSources, error) {
	cfg := f.cfg
	dev, err := parseDevice(f.device, f.memFraction)
	if err != nil {
		return cfg, nil, err
	}
	cfg.Device = dev
	m, err := f.modelConfig(given)
	if err != nil {
		return cfg, nil, err
	}
	if m.MaxPositionEmbeddings == 0 {
		m.MaxPositionEmbeddings = cfg.SeqLength
	}
	if cfg.SeqLength == 0 {
		return cfg, nil, fmt.Errorf("--seq-length is required")
	}
	if cfg.MicroBatchSize == 0 {
		return cfg, nil, fmt.Errorf("--micro-batch-size is required")
	}
	if f.schedule.LR == 0 {
		return cfg, nil, fmt.Errorf("--lr is required")
	}
	switch f.ckptFormat {
	case ckpt.FormatName, "torch_dist", "fsdp_dtensor":
	case train.CkptFormatTorch:
		cfg.CkptFormat = train.CkptFormatTorch
	default:
		return cfg, nil, fmt.Errorf("--ckpt-format=%s: want %s (also accepted as torch_dist, or fsdp_dtensor with --use-megatron-fsdp) or torch (Megatron's legacy per-rank files)", f.ckptFormat, ckpt.FormatName)
	}
	if err := f.cp.apply(&cfg); err != nil {
		return cfg, nil, err
	}
	if err := f.fsdp.apply(&cfg, given, f.ckptFormat, m.UntieEmbeddingsAndOutputWeights); err != nil {
		return cfg, nil, err
	}
	if len(f.rampup.values) > 0 {
		for _, v := range f.rampup.values {
			n, err := strconv.Atoi(v)
			if err != nil {
				return cfg, nil, fmt.Errorf("--rampup-batch-size %s: want three integers START INCR RAMP_SAMPLES", f.rampup.String())
			}
			cfg.RampupBatchSize = append(cfg.RampupBatchSize, n)
		}
	}
	if f.useCkptArgs {
		if cfg.Load == "" {
			return cfg, nil, fmt.Errorf("--use-checkpoint-args needs --load")
		}
		ra, err := train.ReadRunArgs(cfg.Load)
		if err != nil {
			return cfg, nil, fmt.Errorf("--use-checkpoint-args: %w", err)
		}
		// The architecture from the checkpoint; dropout and init from the flags.
		arch := ra.Model
		arch.AttentionDropout, arch.HiddenDropout, arch.InitMethodStd = m.AttentionDropout, m.HiddenDropout, m.InitMethodStd
		// muP from the flags, as Megatron's use_checkpoint_args (which does
		// not load use_mup); a checkpoint saved otherwise refuses the load
		arch.MuP = m.MuP
		m = arch
		if !given["seq-length"] && ra.SeqLength > 0 {
			cfg.SeqLength = ra.SeqLength
		}
	}
	if cfg.FP8, err = f.fp8.config(given, m.NumLayers, f.ppSize, cfg.DDP.DistributedOptimizer); err != nil {
		return cfg, nil, err
	}
	switch f.recomputeGranularity {
	case train.RecomputeSelective:
		cfg.Recompute.Selective = true
	case train.RecomputeFull:
		cfg.Recompute.Full = true
	}
	s := f.schedule
	s.LRDecayStyle = optim.DecayStyle(f.lrDecayStyle)
	s.LRWSDDecayStyle = optim.WSDDecayStyle(f.wsdDecayStyle)
	s.WeightDecayIncrStyle = optim.WDIncrStyle(f.wdIncrStyle)
	cfg.Schedule = s
	cfg.ExitDuration = time.Duration(f.exitMins * float64(time.Minute))
	dataStart := time.Now()
	var src *dataSources
	if f.rl.perform {
		src, err = openRLTokenizer(&f.data, f.divisibleBy*f.tpSize)
	} else {
		src, err = openData(ctx, &f.data, cfg, f.divisibleBy*f.tpSize, given)
	}
	if err != nil {
		return cfg, nil, err
	}
	cfg.DataSetupTime = time.Since(dataStart) // Megatron's train/valid/test-data-iterators-setup timer
	if f.useCkptArgs && m.VocabSize != src.paddedVocab {
		src.close()
		return cfg, nil, fmt.Errorf("--use-checkpoint-args: the checkpoint's padded vocabulary is %d, the tokenizer's %d", m.VocabSize, src.paddedVocab)
	}
	m.VocabSize = src.paddedVocab
	if f.promptAfter != "" {
		if err := m.CheckDecode(); err != nil { // before training, not after it
			src.close()
			return cfg, nil, fmt.Errorf("--sample-prompt: %w", err)
		}
	}
	cfg.Model = m
	cfg.MoEAllToAll = f.moe.dispatcher == "alltoall"
	return cfg, src, nil
}

// overlayModelFlags copies the model flags given on the command line over a
// preset.
func overlayModelFlags(p, flags *gpt.Config, given map[string]bool) {
	set := func(name string, apply func()) {
		if given[name] {
			apply()
		}
	}
	set("num-layers", func() { p.NumLayers = flags.NumLayers })
	set("hidden-size", func() { p.HiddenSize = flags.HiddenSize })
	set("ffn-hidden-size", func() { p.FFNHiddenSize = flags.FFNHiddenSize })
	set("num-attention-heads", func() { p.NumAttentionHeads = flags.NumAttentionHeads })
	set("kv-channels", func() { p.KVChannels = flags.KVChannels })
	set("num-query-groups", func() { p.NumQueryGroups = flags.NumQueryGroups })
	set("max-position-embeddings", func() { p.MaxPositionEmbeddings = flags.MaxPositionEmbeddings })
	set("position-embedding-type", func() { p.PositionEmbeddingType = flags.PositionEmbeddingType })
	set("normalization", func() { p.Normalization = flags.Normalization })
	set("disable-bias-linear", func() { p.DisableBiasLinear = flags.DisableBiasLinear })
	set("apply-layernorm-1p", func() { p.LayerNorm1P = flags.LayerNorm1P })
	set("qk-layernorm", func() { p.QKLayerNorm = flags.QKLayerNorm })
	set("untie-embeddings-and-output-weights", func() { p.UntieEmbeddingsAndOutputWeights = flags.UntieEmbeddingsAndOutputWeights })
	p.RotaryBase, p.RotaryPercent, p.RotaryInterleaved = flags.RotaryBase, flags.RotaryPercent, flags.RotaryInterleaved
	p.NormEpsilon, p.InitMethodStd = flags.NormEpsilon, flags.InitMethodStd
	p.AttentionDropout, p.HiddenDropout, p.AddQKVBias = flags.AttentionDropout, flags.HiddenDropout, flags.AddQKVBias
	p.MuP = flags.MuP // no preset sets muP
}

// dataSources are the opened datasets of a run.
type dataSources struct {
	train, valid, test datagpt.Source
	tok                tokenizer.Tokenizer
	paddedVocab        int
	closer             func() error
	warnings           []string // printed by train, one line each
}

func (d *dataSources) close() {
	if d != nil && d.closer != nil {
		d.closer()
	}
}

// openData opens the tokenizer and the datasets the data flags name.
func openData(ctx context.Context, d *dataArgs, cfg train.Config, divisor int, given map[string]bool) (*dataSources, error) {
	src := &dataSources{}
	vocab := 0
	if d.tok.Type == "" && d.tok.VocabFile != "" && d.tok.MergeFile != "" {
		// pretrain_gpt.py's default tokenizer: Megatron's GPT scripts give
		// --vocab-file and --merge-file without --tokenizer-type.
		d.tok.Type = tokenizer.TypeGPT2BPE
	}
	if d.tok.Type != "" {
		tok, err := tokenizer.New(d.tok)
		if err != nil {
			return nil, err
		}
		src.tok = tok
		vocab = tok.VocabSize()
	} else if d.tok.VocabSize > 0 {
		vocab = d.tok.VocabSize
	}
	fim, err := d.fim.fimConfig(src.tok, given, d.mock)
	if err != nil {
		return nil, err
	}
	if fim != nil {
		if w := fimMissingWarning(fim); w != "" {
			src.warnings = append(src.warnings, w)
		}
	}
	hasPaths := len(d.dataPath.values)+len(d.trainPath.values)+len(d.validPath.values)+len(d.testPath.values) > 0
	switch {
	case d.mock && hasPaths:
		return nil, fmt.Errorf("--mock-data excludes --data-path")
	case d.mock && d.tok.Type == "" && (d.tok.Model != "" || d.tok.VocabFile != "" || d.tok.MergeFile != ""):
		return nil, fmt.Errorf("--tokenizer-model/--vocab-file/--merge-file need --tokenizer-type (with --mock-data they would be ignored)")
	case d.mock:
		if d.split != "" {
			// checked as with real data, but the synthetic sequences
			// of each split are drawn on their own
			if _, err := datagpt.ParseSplit(d.split); err != nil {
				return nil, err
			}
			src.warnings = append(src.warnings, "--split has no effect with --mock-data: gotron draws each split's synthetic sequences on their own (Megatron's mock dataset divides one)")
		}
		if vocab == 0 {
			vocab = 50257
		}
		src.paddedVocab = tokenizer.PaddedVocabSize(vocab, divisor, 1)
		src.train = train.MockSource{SeqLength: cfg.SeqLength, VocabSize: vocab}
		src.valid = train.MockSource{SeqLength: cfg.SeqLength, VocabSize: vocab, Samples: 1 << 20}
		src.test = train.MockSource{SeqLength: cfg.SeqLength, VocabSize: vocab, Samples: 1 << 20}
		return src, nil
	case !hasPaths:
		return nil, fmt.Errorf("no data: set --data-path (or --train-data-path ...) or --mock-data")
	}
	if src.tok == nil {
		return nil, fmt.Errorf("--data-path needs --tokenizer-type (and its files) for the end-of-document id and vocabulary size")
	}
	src.paddedVocab = tokenizer.PaddedVocabSize(vocab, divisor, 1)
	gbs := int64(max(cfg.GlobalBatchSize, cfg.MicroBatchSize))
	iters := cfg.TrainIters
	if cfg.TrainSamples > 0 {
		iters = (cfg.TrainSamples + gbs - 1) / gbs
	}
	// get_train_valid_test_num_samples
	evalGBS := gbs
	if cfg.EvalGlobalBatchSize > 0 {
		evalGBS = int64(cfg.EvalGlobalBatchSize)
	}
	num, err := trainValidTestSamples(iters, gbs, evalGBS, cfg.EvalInterval, cfg.EvalIters)
	if err != nil {
		return nil, err
	}
	if cfg.TrainSamples > 0 {
		num[0] = cfg.TrainSamples
	}
	dc, err := d.gptConfig(cfg.SeqLength, cfg.Seed, num, int32(src.tok.EOD()))
	if err != nil {
		return nil, err
	}
	dc.VocabSize = vocab // ids beyond the tokenizer's vocabulary are refused, as serve refuses them
	dc.FIM = fim
	ds, err := datagpt.Build(ctx, dc)
	if err != nil {
		return nil, err
	}
	src.train, src.valid, src.test, src.closer = ds.Train, ds.Valid, ds.Test, ds.Close
	if src.train == nil {
		ds.Close()
		return nil, fmt.Errorf("--split %q gives the training split no data", d.split)
	}
	return src, nil
}

// importHFForTraining makes --load HF_DIR work: the architecture comes from
// the Hugging Face config (dropout and init flags still apply), the weights
// become a weights-only gotron checkpoint in a temporary directory, and
// training starts from it at iteration 0.
func importHFForTraining(ctx context.Context, env *cli, cfg *train.Config) (string, error) {
	m, info, err := hf.LoadModel(cfg.Load)
	if err != nil {
		return "", fmt.Errorf("--load %s: %w", cfg.Load, err)
	}
	mc := m.Config
	mc.AttentionDropout, mc.HiddenDropout, mc.InitMethodStd = cfg.Model.AttentionDropout, cfg.Model.HiddenDropout, cfg.Model.InitMethodStd
	mc.MuP = cfg.Model.MuP // training settings from the flags (Hugging Face configs have no muP)
	m.Config = mc
	cfg.Model = mc
	tmp, err := os.MkdirTemp("", "gotron-hf-import-")
	if err != nil {
		return "", err
	}
	if err := train.SaveModel(ctx, tmp, 0, m, cfg.SeqLength, nil); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	fmt.Fprintf(env.stdout, "gotron train: --load %s is a Hugging Face %s checkpoint (vocab %d, padded to %d): starting from its weights\n",
		cfg.Load, info.Arch, info.VocabSize, mc.VocabSize)
	cfg.Load = tmp
	return tmp, nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// startCPUProfile starts a CPU profile into path (nothing when path is empty)
// and returns the function that stops it and closes the file.
// cpuProfilePath is the file this rank writes its --cpu-profile to, or ""
// for none. Go's profiler is per process: under "gotron launch --inproc" the
// ranks share one, so only world rank 0 starts it and its profile covers
// every rank of the process; ranks in processes of their own each write
// one, rank 0 to path and rank r > 0 to path.rank<r>.
func cpuProfilePath(path string, inproc bool, rank int) string {
	if path == "" || rank == 0 {
		return path
	}
	if inproc {
		return ""
	}
	return fmt.Sprintf("%s.rank%d", path, rank)
}

// stepProfile resolves --profile (Megatron's nsys or PyTorch profiler
// range) into a Go CPU profile of the same iterations: to --cpu-profile's
// file, else to the TensorBoard directory (where Megatron's PyTorch
// profiler writes its traces); each process its own, as cpuProfilePath
// names them.
func (f *trainFlags) stepProfile(given map[string]bool, tensorboardDir string, inproc bool, rank int, log io.Writer) (train.Profile, error) {
	if !f.profile {
		for _, name := range []string{"profile-step-start", "profile-step-end"} {
			if given[name] {
				return train.Profile{}, fmt.Errorf("--%s needs --profile", name)
			}
		}
		return train.Profile{}, nil
	}
	path := f.cpuProfile
	if path == "" {
		if tensorboardDir == "" {
			return train.Profile{}, fmt.Errorf("--profile writes a Go CPU profile of iterations %d to %d: give --cpu-profile FILE or --tensorboard-dir DIR for it (gotron has no nsys or PyTorch profiler)", f.profStart+1, f.profEnd)
		}
		path = filepath.Join(tensorboardDir, "cpu-profile.pb.gz")
	}
	return train.Profile{Path: cpuProfilePath(path, inproc, rank), StepStart: f.profStart, StepEnd: f.profEnd, Log: log}, nil
}

// worldRank is world's rank, 0 without one.
func worldRank(world comm.ProcessGroup) int {
	if world == nil {
		return 0
	}
	return world.Rank()
}

func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("--cpu-profile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := out.Close(); err != nil {
			return fmt.Errorf("--cpu-profile %s: %w", path, err)
		}
		return nil
	}, nil
}

// fusionNote says when a bias-activation fusion flag names another
// activation than the model's: it changes nothing then (as in Megatron,
// whose bias_activation_fusion takes the flag of the model's activation).
func fusionNote(act gpt.Activation, f gpt.Fusions) string {
	switch {
	case f.NoBiasGELU && act != gpt.GELU && act != gpt.GELUTanh:
		return fmt.Sprintf("--no-bias-gelu-fusion: no effect on a %s model (it applies to GELU models, as Megatron's)", act)
	case f.NoBiasSwiGLU && act != gpt.SwiGLU:
		return fmt.Sprintf("--no-bias-swiglu-fusion: no effect on a %s model (it applies to --swiglu models, as Megatron's)", act)
	}
	return ""
}
