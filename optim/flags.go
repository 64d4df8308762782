package optim

import "fmt"

// SchedulerFlags holds the Megatron command-line values that determine the
// scheduler, as cmd/gotron parses them. Integer fields use 0 for "not given"
// (Megatron's None, or its default 0); DefaultSchedulerFlags has Megatron's
// defaults for the rest.
type SchedulerFlags struct {
	LR                float64 // --lr
	MinLR             float64 // --min-lr
	LRWarmupInit      float64 // --lr-warmup-init
	LRDecayStyle      DecayStyle
	LRWSDDecayStyle   WSDDecayStyle
	LRDecayIters      int64   // --lr-decay-iters; 0: --train-iters
	LRDecaySamples    int64   // --lr-decay-samples; 0: --train-samples
	LRWSDDecayIters   int64   // --lr-wsd-decay-iters
	LRWSDDecaySamples int64   // --lr-wsd-decay-samples
	LRWarmupFraction  float64 // --lr-warmup-fraction; 0: not given
	LRWarmupIters     int64   // --lr-warmup-iters
	LRWarmupSamples   int64   // --lr-warmup-samples
	TrainIters        int64   // --train-iters; exactly one of TrainIters, TrainSamples
	TrainSamples      int64   // --train-samples
	GlobalBatchSize   int64   // --global-batch-size (iteration-based runs)

	WeightDecay          float64     // --weight-decay (Megatron default 0.01)
	StartWeightDecay     float64     // --start-weight-decay; only with linear/cosine incr
	EndWeightDecay       float64     // --end-weight-decay; only with linear/cosine incr
	WeightDecayIncrStyle WDIncrStyle // --weight-decay-incr-style; "" constant

	OverrideOptParamScheduler      bool // --override-opt_param-scheduler
	UseCheckpointOptParamScheduler bool // --use-checkpoint-opt_param-scheduler
}

// DefaultSchedulerFlags returns Megatron's flag defaults (--weight-decay 0.01,
// --lr-decay-style linear, --lr-wsd-decay-style exponential,
// --weight-decay-incr-style constant); --lr and the run length are left 0.
func DefaultSchedulerFlags() SchedulerFlags {
	return SchedulerFlags{WeightDecay: 0.01, LRDecayStyle: DecayLinear,
		LRWSDDecayStyle: WSDExponential, WeightDecayIncrStyle: WDConstant}
}

// Config converts flags into a SchedulerConfig the way Megatron's
// arguments.py checks and training.get_optimizer_param_scheduler do:
//
//	iterations: decay = lr_decay_iters·GBS (default train_iters), wd_incr = train_iters·GBS,
//	            wsd = lr_wsd_decay_iters·GBS, warmup = fraction·decay or lr_warmup_iters·GBS
//	samples:    decay = lr_decay_samples (default train_samples), wd_incr = train_samples,
//	            wsd = lr_wsd_decay_samples, warmup = fraction·decay or lr_warmup_samples
//
// It errors, naming the flags, on mixed iteration/sample options and then
// on anything SchedulerConfig.Validate rejects.
func (f SchedulerFlags) Config() (SchedulerConfig, error) {
	bad := func(format string, a ...any) (SchedulerConfig, error) {
		return SchedulerConfig{}, fmt.Errorf("optim: "+format, a...)
	}
	style := f.WeightDecayIncrStyle
	if style == "" {
		style = WDConstant
	}
	startWD, endWD := f.StartWeightDecay, f.EndWeightDecay
	if style == WDConstant {
		if startWD != 0 || endWD != 0 {
			return bad("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine (use --weight-decay for a constant value)")
		}
		startWD, endWD = f.WeightDecay, f.WeightDecay
	}
	if f.LRWarmupFraction < 0 || f.LRWarmupFraction >= 1 {
		return bad("--lr-warmup-fraction %v: want 0 <= fraction < 1", f.LRWarmupFraction)
	}
	for _, v := range []struct {
		flag string
		x    int64
	}{{"--lr-decay-iters", f.LRDecayIters}, {"--lr-decay-samples", f.LRDecaySamples},
		{"--lr-wsd-decay-iters", f.LRWSDDecayIters}, {"--lr-wsd-decay-samples", f.LRWSDDecaySamples},
		{"--lr-warmup-iters", f.LRWarmupIters}, {"--lr-warmup-samples", f.LRWarmupSamples},
		{"--train-iters", f.TrainIters}, {"--train-samples", f.TrainSamples}, {"--global-batch-size", f.GlobalBatchSize}} {
		if v.x < 0 {
			return bad("%s %d: want >= 0", v.flag, v.x)
		}
	}
	c := SchedulerConfig{
		InitLR: f.LRWarmupInit, MaxLR: f.LR, MinLR: f.MinLR,
		DecayStyle: f.LRDecayStyle, WSDDecayStyle: f.LRWSDDecayStyle,
		StartWD: startWD, EndWD: endWD, WDIncrStyle: style,
		UseCheckpoint: f.UseCheckpointOptParamScheduler, Override: f.OverrideOptParamScheduler,
	}
	switch {
	case f.TrainIters > 0 && f.TrainSamples > 0:
		return bad("--train-iters and --train-samples are both set; give one")
	case f.TrainIters > 0:
		switch {
		case f.LRDecaySamples != 0:
			return bad("--lr-decay-samples with --train-iters: expected iteration-based learning rate decay (--lr-decay-iters)")
		case f.LRWarmupSamples != 0:
			return bad("--lr-warmup-samples with --train-iters: expected iteration-based learning rate warmup (--lr-warmup-iters)")
		case f.LRWSDDecaySamples != 0:
			return bad("--lr-wsd-decay-samples with --train-iters: use --lr-wsd-decay-iters")
		case f.LRWarmupFraction != 0 && f.LRWarmupIters != 0:
			return bad("can only specify one of --lr-warmup-fraction and --lr-warmup-iters")
		case f.GlobalBatchSize <= 0:
			return bad("--global-batch-size %d: iteration-based scheduling needs a positive global batch size", f.GlobalBatchSize)
		}
		decayIters := f.LRDecayIters
		if decayIters == 0 {
			decayIters = f.TrainIters
		}
		c.DecaySteps = decayIters * f.GlobalBatchSize
		c.WDIncrSteps = f.TrainIters * f.GlobalBatchSize
		c.WSDDecaySteps = f.LRWSDDecayIters * f.GlobalBatchSize
		if f.LRWarmupFraction != 0 {
			c.WarmupSteps = f.LRWarmupFraction * float64(c.DecaySteps)
		} else {
			c.WarmupSteps = float64(f.LRWarmupIters * f.GlobalBatchSize)
		}
	case f.TrainSamples > 0:
		switch {
		case f.LRDecayIters != 0:
			return bad("--lr-decay-iters with --train-samples: expected sample-based learning rate decay (--lr-decay-samples)")
		case f.LRWarmupIters != 0:
			return bad("--lr-warmup-iters with --train-samples: expected sample-based learning rate warmup (--lr-warmup-samples)")
		case f.LRWSDDecayIters != 0:
			return bad("--lr-wsd-decay-iters with --train-samples: use --lr-wsd-decay-samples")
		case f.LRWarmupFraction != 0 && f.LRWarmupSamples != 0:
			return bad("can only specify one of --lr-warmup-fraction and --lr-warmup-samples")
		}
		c.DecaySteps = f.LRDecaySamples
		if c.DecaySteps == 0 {
			c.DecaySteps = f.TrainSamples
		}
		c.WDIncrSteps = f.TrainSamples
		c.WSDDecaySteps = f.LRWSDDecaySamples
		if f.LRWarmupFraction != 0 {
			c.WarmupSteps = f.LRWarmupFraction * float64(c.DecaySteps)
		} else {
			c.WarmupSteps = float64(f.LRWarmupSamples)
		}
	default:
		return bad("either --train-iters or --train-samples should be provided")
	}
	if err := c.Validate(); err != nil {
		return SchedulerConfig{}, err
	}
	return c.withDefaults(), nil
}
