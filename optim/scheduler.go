package optim

import (
	"fmt"
	"math"
)

// DecayStyle is --lr-decay-style.
type DecayStyle string

// Learning-rate decay styles (Megatron's spellings).
const (
	DecayConstant          DecayStyle = "constant"
	DecayLinear            DecayStyle = "linear"
	DecayCosine            DecayStyle = "cosine"
	DecayInverseSquareRoot DecayStyle = "inverse-square-root"
	DecayWSD               DecayStyle = "WSD"
)

// WSDDecayStyle is --lr-wsd-decay-style, the shape of WSD's final anneal.
type WSDDecayStyle string

// WSD anneal styles.
const (
	WSDExponential WSDDecayStyle = "exponential"
	WSDLinear      WSDDecayStyle = "linear"
	WSDCosine      WSDDecayStyle = "cosine"
	WSDMinusSqrt   WSDDecayStyle = "minus_sqrt"
)

// WDIncrStyle is --weight-decay-incr-style.
type WDIncrStyle string

// Weight-decay increment styles.
const (
	WDConstant WDIncrStyle = "constant"
	WDLinear   WDIncrStyle = "linear"
	WDCosine   WDIncrStyle = "cosine"
)

// SchedulerConfig configures a Scheduler (Megatron's OptimizerParamScheduler
// constructor arguments). All step counts are in samples, as Megatron's
// scheduler counts them; SchedulerFlags.Config converts iteration flags.
type SchedulerConfig struct {
	// InitLR is --lr-warmup-init, the LR at step 0 of warmup (default 0).
	InitLR float64
	// MaxLR is --lr, the peak LR reached at the end of warmup.
	MaxLR float64
	// MinLR is --min-lr, the floor after decay (default 0).
	MinLR float64
	// WarmupSteps is the linear warmup length in samples; 0 means none. It is
	// a float because --lr-warmup-fraction × DecaySteps need not be whole.
	WarmupSteps float64
	// DecaySteps is the decay length in samples (> WarmupSteps, > 0).
	DecaySteps int64
	// DecayStyle is --lr-decay-style; "" means linear (Megatron's default).
	DecayStyle DecayStyle
	// WSDDecaySteps is the WSD anneal length in samples (required for WSD).
	WSDDecaySteps int64
	// WSDDecayStyle is --lr-wsd-decay-style; "" means exponential.
	WSDDecayStyle WSDDecayStyle
	// StartWD and EndWD bound the weight decay (--start-weight-decay,
	// --end-weight-decay; both --weight-decay for the constant style).
	StartWD, EndWD float64
	// WDIncrSteps is the weight-decay increment length in samples (train
	// iters × global batch, or train samples).
	WDIncrSteps int64
	// WDIncrStyle is --weight-decay-incr-style; "" means constant.
	WDIncrStyle WDIncrStyle
	// UseCheckpoint is --use-checkpoint-opt_param-scheduler: LoadState takes
	// the checkpoint's values. False (default): they must match this config.
	UseCheckpoint bool
	// Override is --override-opt_param-scheduler: LoadState keeps this
	// config's values and ignores the checkpoint's (only num_steps is loaded).
	Override bool
}

// withDefaults fills the empty style strings with Megatron's defaults.
func (c SchedulerConfig) withDefaults() SchedulerConfig {
	if c.DecayStyle == "" {
		c.DecayStyle = DecayLinear
	}
	if c.WSDDecayStyle == "" {
		c.WSDDecayStyle = WSDExponential
	}
	if c.WDIncrStyle == "" {
		c.WDIncrStyle = WDConstant
	}
	return c
}

// Validate applies Megatron's constructor assertions, naming the flags.
func (c SchedulerConfig) Validate() error {
	c = c.withDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("optim: scheduler: "+format, a...)
	}
	for _, v := range []struct {
		flag string
		x    float64
	}{{"--lr", c.MaxLR}, {"--min-lr", c.MinLR}, {"--lr-warmup-init", c.InitLR},
		{"--start-weight-decay", c.StartWD}, {"--end-weight-decay", c.EndWD}, {"lr warmup steps", c.WarmupSteps}} {
		if math.IsNaN(v.x) || math.IsInf(v.x, 0) {
			return bad("%s %v: want a finite number", v.flag, v.x)
		}
	}
	switch {
	case c.MinLR < 0:
		return bad("--min-lr %v: want >= 0", c.MinLR)
	case c.MaxLR < c.MinLR:
		return bad("--lr %v is below --min-lr %v", c.MaxLR, c.MinLR)
	case c.InitLR > c.MaxLR:
		return bad("--lr-warmup-init %v is above --lr %v", c.InitLR, c.MaxLR)
	case c.DecaySteps <= 0:
		return bad("lr decay steps %d (--lr-decay-iters × global batch, or --lr-decay-samples): want > 0", c.DecaySteps)
	case c.WarmupSteps < 0:
		return bad("lr warmup steps %v: want >= 0", c.WarmupSteps)
	case !(c.WarmupSteps < float64(c.DecaySteps)):
		return bad("lr warmup steps %v (--lr-warmup-iters/-samples/-fraction) must be below lr decay steps %d", c.WarmupSteps, c.DecaySteps)
	case c.StartWD < 0:
		return bad("--start-weight-decay %v: want >= 0", c.StartWD)
	case c.EndWD < c.StartWD:
		return bad("--end-weight-decay %v is below --start-weight-decay %v", c.EndWD, c.StartWD)
	case c.Override && c.UseCheckpoint:
		return bad("both --override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are set")
	}
	switch c.DecayStyle {
	case DecayConstant, DecayLinear, DecayCosine, DecayInverseSquareRoot:
	case DecayWSD:
		if c.WSDDecaySteps <= 0 {
			return bad("--lr-decay-style WSD needs --lr-wsd-decay-iters or --lr-wsd-decay-samples (got %d steps)", c.WSDDecaySteps)
		}
		switch c.WSDDecayStyle {
		case WSDExponential, WSDLinear, WSDCosine, WSDMinusSqrt:
		default:
			return bad("--lr-wsd-decay-style %q: want exponential, linear, cosine or minus_sqrt", c.WSDDecayStyle)
		}
	default:
		return bad("--lr-decay-style %q: want constant, linear, cosine, inverse-square-root or WSD", c.DecayStyle)
	}
	switch c.WDIncrStyle {
	case WDConstant:
		if c.StartWD != c.EndWD {
			return bad("--weight-decay-incr-style constant needs --start-weight-decay %v == --end-weight-decay %v", c.StartWD, c.EndWD)
		}
	case WDLinear, WDCosine:
		if c.WDIncrSteps <= 0 {
			return bad("weight decay increment steps %d (--train-iters × global batch, or --train-samples): want > 0 for --weight-decay-incr-style %s", c.WDIncrSteps, c.WDIncrStyle)
		}
	default:
		return bad("--weight-decay-incr-style %q: want constant, linear or cosine", c.WDIncrStyle)
	}
	return nil
}

// Scheduler is Megatron's OptimizerParamScheduler
// (megatron/core/optimizer_param_scheduler.py): learning rate and weight
// decay as pure functions of the number of samples consumed. It is a plain
// value with no clock; not safe for concurrent use.
//
// Megatron's training loop, which gotron's follows:
//
//	sched.Apply(opt.Groups()) // lr/wd for the current sample count
//	opt.Step()
//	sched.Step(globalBatch)   // only if the step was not skipped (found_inf)
//
// A fresh scheduler stands at 0 samples, so with warmup the first update uses
// --lr-warmup-init, as in Megatron.
type Scheduler struct {
	cfg      SchedulerConfig
	numSteps int64
}

// NewScheduler validates cfg and returns a scheduler at 0 samples.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Scheduler{cfg: cfg.withDefaults()}, nil
}

// Config returns the scheduler's current configuration (after LoadState,
// the values it settled on), with default styles filled in.
func (s *Scheduler) Config() SchedulerConfig { return s.cfg }

// NumSteps returns the samples consumed so far (Megatron's num_steps).
func (s *Scheduler) NumSteps() int64 { return s.numSteps }

// Step advances the schedule by incrementSamples (the iteration's global
// batch size). A negative increment is a programming error and panics.
func (s *Scheduler) Step(incrementSamples int64) {
	if incrementSamples < 0 {
		panic(fmt.Sprintf("optim: Scheduler.Step(%d): negative increment", incrementSamples))
	}
	s.numSteps += incrementSamples
}

// LR returns the learning rate of a group using the scheduler's --lr/--min-lr.
func (s *Scheduler) LR() float64 { return s.lr(s.cfg.MaxLR, s.cfg.MinLR) }

// GroupLR returns the learning rate of g: its MaxLR/MinLR when OverrideLR is
// set (Megatron's per-group max_lr/min_lr), the scheduler's otherwise.
func (s *Scheduler) GroupLR(g *Group) float64 {
	if g.OverrideLR {
		return s.lr(g.MaxLR, g.MinLR)
	}
	return s.LR()
}

// WD returns the scheduled weight decay before any group's WDMult.
func (s *Scheduler) WD() float64 { return wdAt(s.cfg, s.numSteps) }

// Apply sets every group's LR to GroupLR and WD to WD()·WDMult, as
// Megatron's step() does for each param_group.
func (s *Scheduler) Apply(groups []Group) {
	wd := s.WD()
	for i := range groups {
		groups[i].LR = s.GroupLR(&groups[i])
		groups[i].WD = wd * groups[i].WDMult
	}
}

// lr is get_lr for one group's max/min, evaluated in Megatron's order and
// with its float64 operation order. The float64(...) conversions around
// products stop the compiler fusing a·b+c into an FMA (GOAMD64=v3 does),
// which Python never does.
func (s *Scheduler) lr(maxLR, minLR float64) float64 {
	c := &s.cfg
	n := float64(s.numSteps)
	w := c.WarmupSteps
	if w > 0 && n <= w {
		return c.InitLR + float64((maxLR-c.InitLR)*n)/w
	}
	if c.DecayStyle == DecayConstant {
		return maxLR
	}
	if s.numSteps > c.DecaySteps {
		return minLR
	}
	if c.DecayStyle == DecayInverseSquareRoot {
		lr := maxLR * math.Sqrt(max(w, 1)) / math.Sqrt(max(n, 1))
		return max(minLR, lr)
	}
	ratio := (n - w) / (float64(c.DecaySteps) - w)
	var coeff float64
	switch c.DecayStyle {
	case DecayLinear:
		coeff = 1.0 - ratio
	case DecayCosine:
		coeff = 0.5 * (crCos(float64(math.Pi*ratio)) + 1.0)
	case DecayWSD:
		annealStart := c.DecaySteps - c.WSDDecaySteps
		if s.numSteps <= annealStart {
			coeff = 1.0
		} else {
			r := float64(s.numSteps-annealStart) / float64(c.WSDDecaySteps)
			switch c.WSDDecayStyle {
			case WSDLinear:
				coeff = 1.0 - r
			case WSDCosine:
				coeff = 0.5 * (crCos(float64(math.Pi*r)) + 1.0)
			case WSDExponential:
				coeff = float64(2.0*crPowHalf(r)) - 1.0
			case WSDMinusSqrt:
				coeff = 1.0 - math.Sqrt(r)
			}
		}
	}
	return minLR + float64(coeff*(maxLR-minLR))
}

// wdAt is get_wd at n samples.
func wdAt(c SchedulerConfig, n int64) float64 {
	if n > c.WDIncrSteps {
		return c.EndWD
	}
	if c.WDIncrStyle == WDConstant {
		return c.EndWD
	}
	ratio := float64(n) / float64(c.WDIncrSteps)
	var coeff float64
	switch c.WDIncrStyle {
	case WDLinear:
		coeff = ratio
	case WDCosine:
		coeff = 0.5 * (crCos(float64(math.Pi*(1-ratio))) + 1.0)
	}
	return c.StartWD + float64(coeff*(c.EndWD-c.StartWD))
}
