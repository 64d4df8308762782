// Package train is gotron's training loop, Megatron's pretrain_gpt.py in Go:
// the loop reads top to bottom like nanoGPT's train.py (setup, loop,
// evaluation, logging, checkpoints) with no callbacks to chase.
//
// Trainer.Run (loop.go) is the loop. It composes three parts
// (docs/design/trainer.md): the stepper runs one training step (the model
// laid out over the parallel groups, the optimizer, the gradient
// reduction), the checkpointer saves and resumes, the reporter logs. The
// model is reached through small interfaces (Model, Stage, Architecture in
// model.go), so a model family other than GPT plugs in through
// Config.Architecture. A process started alone is a world of one rank.
package train

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gotron/gotron/ckpt"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// Config is one training run. Field comments name the Megatron flag.
type Config struct {
	// Model is the model's configuration: its hyperparameters, checked
	// and recorded in checkpoints.
	Model gpt.Config
	// RL, when set, makes every iteration Megatron's RL step
	// (--perform-rl-step, train_rl.py): it is also the training data
	// (New's train is ignored), and its Loss replaces the model's.
	RL RLStep
	// Architecture builds and lays out the model (train/model.go); nil is
	// GPT{Config: Model, Recompute: Recompute, Fusions: Fusions}.
	Architecture Architecture

	SeqLength       int // --seq-length
	MicroBatchSize  int // --micro-batch-size
	GlobalBatchSize int // --global-batch-size; 0 means MicroBatchSize (× data-parallel size)
	// EvalGlobalBatchSize (--eval-global-batch-size) and
	// EvalMicroBatchSize (--eval-micro-batch-size) are the samples of one
	// evaluation batch and of one evaluation forward; 0 means
	// GlobalBatchSize and MicroBatchSize, as Megatron's defaults.
	EvalGlobalBatchSize, EvalMicroBatchSize int
	TrainIters                              int64 // --train-iters (or TrainSamples)
	TrainSamples                            int64 // --train-samples
	// RampupBatchSize is --rampup-batch-size START INCR RAMP_SAMPLES
	// (Megatron's ramp-up of the global batch; needs --train-samples).
	RampupBatchSize []int
	// StepBatchSizeSchedule is --step-batch-size-schedule "THRESHOLD:BS ..."
	// (Megatron HEAD): thresholds in tokens (K/M/B/T suffixes), divided by
	// --seq-length into samples; the global batch of the last entry reached.
	StepBatchSizeSchedule string
	Seed                  int64 // --seed (Megatron's default 1234 is the CLI's default)

	// Optimizer and schedule.
	Optimizer   Optimizer // --optimizer: Adam (AdamW, the zero value) or SGD
	Adam        optim.AdamWConfig
	SGDMomentum float64 // --sgd-momentum
	Schedule    optim.SchedulerFlags
	ClipGrad    float64 // --clip-grad; 0 disables clipping
	// Recompute is activation recomputation (--recompute-activations,
	// --recompute-granularity, --recompute-method, --recompute-num-layers).
	Recompute gpt.Recompute
	// Fusions turns off the layer's fused elementwise ops
	// (--no-bias-gelu-fusion, --no-bias-swiglu-fusion,
	// --no-bias-dropout-fusion); the zero value fuses, as Megatron.
	Fusions        gpt.Fusions
	DecoupledLR    float64 // --decoupled-lr: peak rate of the embedding and output layer; 0 means --lr
	DecoupledMinLR float64 // --decoupled-min-lr; 0 means --min-lr
	// TestMode (--test-mode) runs Megatron's real-time tests: with
	// --qk-layernorm, the query/key layer norms must match across the
	// data- and tensor-parallel ranks before every iteration and evaluation.
	TestMode bool
	// VerifyIntegrity (--verify-integrity) checks every shard of the
	// checkpoint loaded against its recorded CRC-32C before resuming.
	VerifyIntegrity bool
	// CheckWeightHashInterval (--check-weight-hash-across-dp-replicas-interval)
	// compares the parameters' hashes across the data-parallel replicas
	// before training and every this many iterations; 0: never.
	CheckWeightHashInterval int64
	// Rerun is Megatron's rerun state machine (--rerun-mode,
	// --error-injection-rate/-type, --check-for-spiky-loss); off by default.
	Rerun          RerunConfig
	MaxSkipsInARow int // consecutive NaN/Inf iterations before stopping; 0 means 10
	// ApplyWDToQKLayerNorm (--apply-wd-to-qk-layernorm) applies weight
	// decay to the query and key layer norms (optim.ApplyWDToQKLayerNorm),
	// which Megatron's default rule exempts as 1-D parameters.
	ApplyWDToQKLayerNorm bool
	// CalculatePerTokenLoss is --calculate-per-token-loss: the step's
	// objective is the sum of the global batch's token losses over its
	// number of unmasked tokens, instead of Megatron's default, the mean
	// over micro-batches (and data × context-parallel ranks) of each one's
	// token mean. As Megatron: each micro-batch's loss is a sum, the
	// gradients are summed over the data-parallel ranks (no 1/DP) and
	// divided by the global token count after the reduction
	// (finalize_model_grads), before the norm and clipping; MoE losses are
	// pre-multiplied by the router's tokens × TP·CP.
	CalculatePerTokenLoss bool

	// BF16 (--bf16) runs the training step's matrix products on
	// bfloat16-rounded operands with float32 accumulation
	// (tensor.MatmulBF16); weights, gradients, optimizer state and every
	// other op stay float32, like Megatron's fp32 main params and grads.
	// Evaluation multiplies in float32.
	BF16 bool
	// FP8 (--fp8-format, --fp8-recipe, ...), when set, runs the layers'
	// QKV, attention projection, fc1 and fc2 on FP8 operands, emulated
	// on the CPU (gpt.FP8Config, tensor.LinearFP8), in training and
	// evaluation. The delayed recipe's histories are not saved in
	// checkpoints (TE keeps them in _extra_state): a resumed run restarts
	// them.
	FP8 *gpt.FP8Config
	// FP16 (--fp16) runs the matrix products on fp16-rounded operands
	// (tensor.MatmulFP16, emulated on the CPU) with float32 accumulation and
	// float32 master weights, and scales the loss by LossScale's dynamic
	// (or constant) scale, as Megatron's DynamicGradScaler.
	FP16      bool
	LossScale optim.LossScalerConfig // --loss-scale, --initial-loss-scale, --min-loss-scale, --loss-scale-window, --hysteresis

	// Evaluation.
	EvalInterval int64 // --eval-interval; 0 disables evaluation during training
	EvalIters    int64 // --eval-iters; 0 turns evaluation off (Megatron's do_valid/do_test)
	SkipTrain    bool  // --skip-train: only the final validation and test evaluation

	// Logging.
	LogParamsNorm bool      // --log-params-norm: the L2 norm of the parameters on the log line
	LogInterval   int64     // --log-interval; 0 means 100
	MetricsFile   string    // JSONL metrics, one object per logged iteration
	PeakFLOPs     float64   // per-process peak for MFU, FLOP/s (--peak-flops); 0 means measured (tensor.CPUPeakFLOPs over this process's threads, doubled with BF16), or on a GPU its datasheet peak (tensor.CUDAPeakFLOPs)
	Out           io.Writer // log lines; nil means io.Discard
	// Diag takes every rank's own diagnostics (the rerun state machine's
	// warnings and errors, which Megatron logs on every rank); nil means
	// Out (which only the logging rank writes to).
	Diag     io.Writer
	Progress io.Writer // progress bar target (a terminal); nil means none

	// TimingLogLevel is --timing-log-level: Megatron's timers printed after
	// the log line, 1 (forward-backward, the gradient reductions, the
	// optimizer's phases) or 2 (also the batch generator and the forward
	// and backward compute); at 0, Megatron's default, only the level-0
	// timers (set-up, checkpoint load and save, evaluation) print. -1
	// prints no timers at all (gotron's quickstart).
	TimingLogLevel int
	// TimingLogOption is --timing-log-option: TimingMinMax (the zero
	// value), TimingMax or TimingAll.
	TimingLogOption string
	// Profile is --profile: a Go CPU profile of iterations
	// --profile-step-start+1 to --profile-step-end.
	Profile Profile
	// NumWorkers is --num-workers, Megatron's data-loader worker processes.
	// gotron reads samples in the training process, but a sample of FIM
	// data depends on the worker that reads it (each holds its own copy of
	// the random stream), so micro-batch k this run reads from a split is
	// read as worker k mod NumWorkers, as PyTorch's DataLoader deals them.
	// 0 and 1 mean one stream.
	NumWorkers int
	// DataSetupTime is how long opening the datasets took (Megatron's
	// train/valid/test-data-iterators-setup timer), measured by the caller.
	DataSetupTime time.Duration

	// LogNumZerosInGrad (--log-num-zeros-in-grad) counts the zero gradient
	// elements each iteration and prints "num zeros: N" after the grad norm.
	LogNumZerosInGrad bool

	// TensorBoard event files (--tensorboard-dir and friends).
	TensorBoard TensorBoard

	// Checkpoints.
	Save         string        // --save
	Load         string        // --load
	SaveInterval int64         // --save-interval
	ExitInterval int64         // --exit-interval
	ExitDuration time.Duration // --exit-duration-in-mins
	NoSaveOptim  bool          // --no-save-optim
	NoLoadOptim  bool          // --no-load-optim
	NoLoadRNG    bool          // --no-load-rng: the dropout streams start afresh
	// AsyncSave is --async-save: a save snapshots this rank's shards and
	// training goes on while they are written; finalised (metadata, tracker)
	// at a later iteration, at most one in flight.
	AsyncSave bool
	// AsyncSaveRate is --async-save-rate: at most this many MB per second
	// per rank written in the background (0: as fast as the disk goes).
	AsyncSaveRate float64
	// CkptFormat is --ckpt-format: "" (or gotron's) for gotron's sharded
	// format, CkptFormatTorch for Megatron's legacy per-rank files
	// (torchckpt.go).
	CkptFormat string
	// CkptConvertFormat and CkptConvertSave are Megatron's
	// --ckpt-convert-format and --ckpt-convert-save: Run loads --load, saves
	// it at its iteration in that format ("torch", or "torch_dist":
	// gotron's) under CkptConvertSave/<format>, and returns without
	// training (Megatron's setup_model_and_optimizer, then exit).
	CkptConvertFormat, CkptConvertSave string
	// DistCkptStrictness is --dist-ckpt-strictness (StrictnessValues):
	// whether checkpoint tensors the model does not use are accepted.
	DistCkptStrictness string
	Finetune           bool // --finetune: load weights only, start at iteration 0
	// SaveRetainInterval is --save-retain-interval: when a save becomes
	// the latest, the previous latest checkpoint is deleted unless its
	// iteration is a multiple of this (0 keeps every checkpoint).
	SaveRetainInterval int64
	// LogProgress is --log-progress: world rank 0 appends Megatron's job
	// log lines (start, saves, deletions) to --save's progress.txt.
	LogProgress bool
	// JobID is the job's id in the progress log (SLURM_JOB_ID; may be empty).
	JobID string
	Args  map[string]any // the command line, stored in checkpoints

	// Parallel holds this rank's process groups (parallel.NewGroups); nil
	// means one process, which New gives the groups of a world of one rank
	// (every group of size 1). Data, tensor, pipeline and context
	// parallelism run in this release (expert parallelism: EP = 1).
	Parallel *parallel.Groups
	// Pipeline is how the layers are cut into pipeline stages: virtual
	// stages and an uneven first/last split (its PP is the layout's
	// pipeline size, set by Parallel).
	Pipeline gpt.PipelineSplit
	// MicrobatchGroupSize is
	// --microbatch-group-size-per-virtual-pipeline-stage (0: the pipeline
	// size, Megatron's default).
	MicrobatchGroupSize int
	// CPCommType is --cp-comm-type: how attention communicates over the
	// context-parallel group (p2p ring attention, the zero value;
	// all_gather; a2a; a2a+p2p). Used with --context-parallel-size > 1.
	CPCommType cp.CommType
	// HierarchicalCPSizes is --hierarchical-context-parallel-sizes A P:
	// with CPCommType a2a+p2p, a2a within groups of A consecutive CP ranks,
	// then the ring over P (A·P = CP).
	HierarchicalCPSizes []int
	// SequenceParallel (--sequence-parallel) shards the activations outside
	// the tensor-parallel regions along the sequence (needs TP > 1).
	SequenceParallel bool
	// DDP configures the data-parallel gradient reduction and the
	// distributed optimizer (used when Parallel is set).
	DDP ddp.Config
	// FSDP is fully sharded data parallelism (fsdp.go): NoFSDP, or what
	// it shards over the data × context parallel group (it switches
	// DDP.DistributedOptimizer on).
	FSDP Sharding
	// MoEAllToAll (--moe-token-dispatcher-type alltoall) exchanges an
	// expert-parallel run's tokens by all-to-all; false, by all-gather and
	// reduce-scatter (Megatron's allgather dispatcher, its default).
	MoEAllToAll bool

	// Device is --device: where the parameters, gradients and optimizer
	// state live and compute. tensor.CPU is the zero value; tensor.Sim, the
	// simulated device, is a development aid that proves the device seam
	// (device storage is read only through counted copies at the I/O
	// boundaries) with results identical to the CPU's bit for bit.
	Device tensor.Device

	// CUDAUnverified (GOTRON_CUDA_UNVERIFIED=1, or a list naming cp) lets
	// --device cuda run context parallelism, whose block attention is built
	// for the GPU but not yet run on one (docs/design/cuda.md). Off, it is
	// refused naming the variable.
	CUDAUnverified bool

	// CUDAUnverifiedFP8 (GOTRON_CUDA_UNVERIFIED=1, or a list naming fp8)
	// lets --device cuda run --fp8-format (tensorwise) through cuBLASLt's
	// FP8 matmul, built but not yet run on a GPU; off, it is refused
	// naming the variable.
	CUDAUnverifiedFP8 bool

	// Now is the clock (tests replace it); nil means time.Now.
	Now func() time.Time

	// carryFP8 (Reshard) writes the loaded checkpoint's FP8 delayed
	// state back with the next save, for a run that does not use it.
	carryFP8 bool
}

// Optimizer is --optimizer.
type Optimizer uint8

const (
	Adam Optimizer = iota // "adam": AdamW, Adam with decoupled weight decay as Megatron's adam
	SGD                   // "sgd": SGD with --sgd-momentum
)

// ParseOptimizer parses --optimizer: "adam" or "sgd".
func ParseOptimizer(s string) (Optimizer, error) {
	switch s {
	case "adam":
		return Adam, nil
	case "sgd":
		return SGD, nil
	}
	return 0, fmt.Errorf("--optimizer=%q: want adam or sgd", s)
}

// String returns the flag's spelling.
func (o Optimizer) String() string {
	switch o {
	case Adam:
		return "adam"
	case SGD:
		return "sgd"
	}
	return fmt.Sprintf("Optimizer(%d)", uint8(o))
}

// Set makes *Optimizer a flag.Value (--optimizer).
func (o *Optimizer) Set(s string) error {
	v, err := ParseOptimizer(s)
	if err != nil {
		return errors.New("want adam or sgd")
	}
	*o = v
	return nil
}

// checkGlobalBatch checks that --global-batch-size splits into micro-batches
// of every data-parallel rank (Config and MemoryConfig).
func checkGlobalBatch(global, micro, dp int) error {
	if global%(micro*dp) != 0 {
		return fmt.Errorf("--global-batch-size=%d is not a multiple of --micro-batch-size=%d × data-parallel size %d", global, micro, dp)
	}
	return nil
}

func (c *Config) validate() error {
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if c.RL != nil {
		if err := c.validateRL(); err != nil {
			return err
		}
	}
	if c.Model.MoE.Enabled() {
		g := c.groups()
		l := g.Layout.Config
		moe := &c.Model.MoE
		switch {
		case l.TP > 1 && !c.SequenceParallel:
			return fmt.Errorf("train: --num-experts=%d with --tensor-model-parallel-size=%d needs --sequence-parallel (Megatron's MoE layer refuses tensor parallelism without it in training)", moe.NumExperts, l.TP)
		case l.ETP != 1 && l.ETP != l.TP:
			return fmt.Errorf("train: --expert-tensor-parallel-size=%d with --tensor-model-parallel-size=%d: not built yet (1, or the tensor-parallel size, is)", l.ETP, l.TP)
		case l.ETP > 1 && !slices.Equal(g.Layout.GroupOf(parallel.ExpertTP, g.World.Rank()), g.Layout.GroupOf(parallel.TP, g.World.Rank())):
			return fmt.Errorf("train: --expert-tensor-parallel-size=%d: rank order %q gives expert-tensor-parallel groups other than the tensor-parallel ones: not built yet", l.ETP, l.Order)
		case moe.FFNHiddenSize%l.ETP != 0:
			return fmt.Errorf("train: --moe-ffn-hidden-size=%d is not divisible by --expert-tensor-parallel-size=%d", moe.FFNHiddenSize, l.ETP)
		case moe.NumExperts%g.EP.Size() != 0:
			return fmt.Errorf("train: --num-experts=%d is not divisible by --expert-model-parallel-size=%d", moe.NumExperts, g.EP.Size())
		}
	}
	switch {
	case c.SeqLength <= 0:
		return fmt.Errorf("train: --seq-length=%d: want > 0", c.SeqLength)
	case c.Model.PositionEmbeddingType == gpt.LearnedAbsolute && c.SeqLength > c.Model.MaxPositionEmbeddings:
		return fmt.Errorf("train: --seq-length=%d exceeds --max-position-embeddings=%d", c.SeqLength, c.Model.MaxPositionEmbeddings)
	case c.MicroBatchSize <= 0:
		return fmt.Errorf("train: --micro-batch-size=%d: want > 0", c.MicroBatchSize)
	case c.TrainIters > 0 && c.TrainSamples > 0:
		return fmt.Errorf("train: set only one of --train-iters and --train-samples")
	case c.TrainIters <= 0 && c.TrainSamples <= 0:
		return fmt.Errorf("train: set --train-iters or --train-samples")
	case c.EvalIters < 0:
		return fmt.Errorf("train: --eval-iters=%d: want ≥ 0 (0 turns evaluation off)", c.EvalIters)
	case c.NumWorkers < 0 || c.NumWorkers > datagpt.MaxWorkers:
		return fmt.Errorf("train: --num-workers=%d: want 0 to %d", c.NumWorkers, datagpt.MaxWorkers)
	case c.SaveInterval > 0 && c.Save == "":
		return fmt.Errorf("train: --save-interval=%d needs --save", c.SaveInterval)
	case c.DistCkptStrictness != "" && !slices.Contains(StrictnessValues, c.DistCkptStrictness):
		return fmt.Errorf("train: --dist-ckpt-strictness=%s: want one of %v", c.DistCkptStrictness, StrictnessValues)
	case c.AsyncSaveRate < 0:
		return fmt.Errorf("train: --async-save-rate=%g: want ≥ 0 MB/s (0: unpaced)", c.AsyncSaveRate)
	case c.SaveRetainInterval < 0:
		return fmt.Errorf("train: --save-retain-interval=%d: want > 0 (or 0 to keep every checkpoint)", c.SaveRetainInterval)
	case c.SaveRetainInterval > 0 && (c.Save == "" || c.SaveInterval <= 0):
		return fmt.Errorf("train: --save-retain-interval=%d needs --save and --save-interval", c.SaveRetainInterval)
	case c.SaveRetainInterval > 0 && c.SaveRetainInterval%c.SaveInterval != 0:
		return fmt.Errorf("train: --save-retain-interval=%d: want a multiple of --save-interval=%d (as Megatron asserts)", c.SaveRetainInterval, c.SaveInterval)
	case c.TimingLogLevel < -1 || c.TimingLogLevel > 2:
		return fmt.Errorf("train: --timing-log-level=%d: want 0, 1 or 2", c.TimingLogLevel)
	case c.TimingLogOption != "" && c.TimingLogOption != TimingMax && c.TimingLogOption != TimingMinMax && c.TimingLogOption != TimingAll:
		return fmt.Errorf("train: --timing-log-option=%s: want max, minmax or all", c.TimingLogOption)
	case c.Profile.Path != "" && (c.Profile.StepStart < 0 || c.Profile.StepEnd <= c.Profile.StepStart):
		return fmt.Errorf("train: --profile-step-start=%d --profile-step-end=%d: want 0 <= start < end (iterations start+1 to end are profiled)", c.Profile.StepStart, c.Profile.StepEnd)
	case c.LogProgress && c.Save == "":
		return fmt.Errorf("train: --log-progress writes progress.txt in --save: it needs --save")
	case c.CkptFormat != "" && c.CkptFormat != CkptFormatTorch && c.CkptFormat != ckpt.FormatName:
		return fmt.Errorf("train: --ckpt-format=%s: want %s or %s", c.CkptFormat, ckpt.FormatName, CkptFormatTorch)
	case c.CkptConvertFormat != "" && c.CkptConvertFormat != CkptFormatTorch && c.CkptConvertFormat != "torch_dist":
		return fmt.Errorf("train: --ckpt-convert-format=%s: want torch or torch_dist (gotron's sharded format)", c.CkptConvertFormat)
	case c.CkptConvertFormat != "" && (c.CkptConvertSave == "" || c.Load == ""):
		return fmt.Errorf("train: --ckpt-convert-format needs --ckpt-convert-save and --load (as Megatron asserts)")
	case c.CkptConvertFormat == "" && c.CkptConvertSave != "":
		return fmt.Errorf("train: --ckpt-convert-save needs --ckpt-convert-format")
	case (c.CkptFormat == CkptFormatTorch || c.CkptConvertFormat == CkptFormatTorch) && c.Model.MuP.Enabled:
		return fmt.Errorf("train: --use-mup with the torch checkpoint format: not written yet (its args would not record muP); use --ckpt-format %s", ckpt.FormatName)
	case c.CkptFormat == CkptFormatTorch && c.AsyncSave:
		return fmt.Errorf("train: --async-save with --ckpt-format torch: the legacy torch format is written synchronously (Megatron saves asynchronously only in torch_dist); use --ckpt-format %s", ckpt.FormatName)
	case c.AsyncSave && c.Save == "":
		return fmt.Errorf("train: --async-save needs --save")
	case c.Optimizer > SGD:
		return fmt.Errorf("train: --optimizer=%v: want adam or sgd", c.Optimizer)
	case c.CalculatePerTokenLoss && c.DDP.AverageInCollective:
		return fmt.Errorf("train: --calculate-per-token-loss with --ddp-average-in-collective: the gradients must be summed over the data-parallel ranks, not averaged (Megatron asserts the same)")
	case c.MaxSkipsInARow < 0:
		return fmt.Errorf("train: --max-nan-iterations=%d: want > 0 (or 0 for 10)", c.MaxSkipsInARow)
	}
	if err := c.Model.CheckDevice(c.Device); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if c.BF16 && c.FP16 {
		return fmt.Errorf("train: --bf16 and --fp16 exclude each other")
	}
	if c.DDP.ReduceInBF16 {
		// Megatron's gradient buffer takes the parameters' type: the flag
		// means something only with bfloat16 parameters.
		switch {
		case !c.BF16:
			return fmt.Errorf("train: --grad-reduce-in-bf16 needs --bf16 (Megatron keeps float32 gradients otherwise)")
		case c.FSDP != NoFSDP:
			return fmt.Errorf("train: --grad-reduce-in-bf16 with --use-megatron-fsdp or --use-torch-fsdp2: not built (FSDP reduces float32 gradients)")
		}
	}
	if err := c.Recompute.Validate(c.Model.NumLayers); err != nil {
		return err
	}
	c.Parallel = c.groups()
	l := c.Parallel.Layout.Config
	if err := c.checkFP8(); err != nil {
		return err
	}
	if err := c.checkFSDP(); err != nil {
		return err
	}
	if l.EP > 1 && !c.Model.MoE.Enabled() {
		return fmt.Errorf("train: --expert-model-parallel-size=%d needs an MoE model (--num-experts)", l.EP)
	}
	if err := c.checkContextParallel(max(l.CP, 1), max(l.TP, 1)); err != nil {
		return err
	}
	// With CP each rank's sequence is SeqLength/CP tokens (what sequence
	// parallelism splits over TP).
	if err := c.Model.CheckTP(l.TP, c.SequenceParallel, c.SeqLength/max(l.CP, 1)); err != nil {
		return err
	}
	dp := c.Parallel.DPSize()
	if p := c.Pipeline; p.PP > 1 && p.PP != l.PP {
		return fmt.Errorf("train: --pipeline-model-parallel-size=%d needs a layout with that pipeline size (start %d ranks or a multiple with gotron launch)", p.PP, p.PP)
	}
	if _, err := c.pipelineSplit().Chunks(c.Model.NumLayers); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if c.MicrobatchGroupSize < 0 {
		return fmt.Errorf("train: --microbatch-group-size-per-virtual-pipeline-stage=%d: want > 0 (or 0 for the pipeline size)", c.MicrobatchGroupSize)
	}
	if c.GlobalBatchSize == 0 {
		c.GlobalBatchSize = c.MicroBatchSize * dp
	}
	if err := checkGlobalBatch(c.GlobalBatchSize, c.MicroBatchSize, dp); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if c.EvalGlobalBatchSize < 0 || c.EvalMicroBatchSize < 0 {
		return fmt.Errorf("train: --eval-global-batch-size=%d, --eval-micro-batch-size=%d: want > 0 (or 0 for the training batch sizes)", c.EvalGlobalBatchSize, c.EvalMicroBatchSize)
	}
	if c.EvalGlobalBatchSize == 0 {
		c.EvalGlobalBatchSize = c.GlobalBatchSize
	}
	if c.EvalMicroBatchSize == 0 {
		c.EvalMicroBatchSize = c.MicroBatchSize
	}
	if c.EvalGlobalBatchSize%(c.EvalMicroBatchSize*dp) != 0 { // Megatron's validate_args
		return fmt.Errorf("train: --eval-global-batch-size=%d is not a multiple of --eval-micro-batch-size=%d × data-parallel size %d (they default to --global-batch-size and --micro-batch-size)",
			c.EvalGlobalBatchSize, c.EvalMicroBatchSize, dp)
	}
	if c.LogInterval <= 0 {
		c.LogInterval = 100
	}
	if c.MaxSkipsInARow <= 0 {
		c.MaxSkipsInARow = 10
	}
	if c.PeakFLOPs < 0 {
		return fmt.Errorf("train: --peak-flops=%g: want > 0 (or 0 to measure this CPU)", c.PeakFLOPs)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// groups are the run's process groups: Parallel, or for a process started
// alone the groups of a world of one rank.
func (c *Config) groups() *parallel.Groups {
	if c.Parallel != nil {
		return c.Parallel
	}
	return soloGroups()
}

// memoryConfig is the MemoryConfig of the run's most loaded rank
// (CheckMemory, and the report with the first log line).
func (c *Config) memoryConfig() MemoryConfig {
	p := c.groups()
	l := p.Layout.Config
	mc := MemoryConfig{Model: c.Model, SeqLength: c.SeqLength, MicroBatchSize: c.MicroBatchSize,
		WorldSize: p.World.Size(), TensorParallel: l.TP, PipelineParallel: l.PP, ContextParallel: l.CP,
		VirtualPipeline: l.VPP, SequenceParallel: c.SequenceParallel, DistributedOptimizer: c.DDP.DistributedOptimizer}
	if c.Model.MoE.Enabled() { // the routed experts sharded over EP and expert TP
		mc.ExpertParallel, mc.ExpertTensorParallel = l.EP, l.ETP
	}
	mc.AccountForEmbedding, mc.AccountForLoss = c.Pipeline.AccountForEmbedding, c.Pipeline.AccountForLoss
	return mc
}

// checkFP8 checks the FP8 setting against the run.
func (c *Config) checkFP8() error {
	f := c.FP8
	if f == nil {
		return nil
	}
	if err := f.Validate(c.Model); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if c.Architecture != nil {
		if _, ok := c.Architecture.(GPT); !ok {
			return fmt.Errorf("train: FP8 (--fp8-format) needs the GPT architecture, not %T", c.Architecture)
		}
	}
	if c.Device == tensor.CUDA {
		if !c.CUDAUnverifiedFP8 {
			return fmt.Errorf("train: --fp8-format on --device cuda: the FP8 products through cuBLASLt are built but have not run on a GPU in this release; set GOTRON_CUDA_UNVERIFIED=fp8 to run them anyway, or use --device cpu or sim (the emulation)")
		}
	}
	if c.FP16 {
		return fmt.Errorf("train: --fp8-format with --fp16: not built (gotron's FP8 follows Megatron's --bf16 or float32 runs)")
	}
	return nil
}
