package optim

import (
	"fmt"
)

// SchedulerState is the scheduler's checkpoint record, field for field
// Megatron's OptimizerParamScheduler.state_dict() (JSON names are its keys).
// Megatron does not save --lr-warmup-init or the WSD settings; neither does
// this, so those always come from the current flags.
type SchedulerState struct {
	MaxLR         float64     `json:"max_lr"`
	LRWarmupSteps float64     `json:"lr_warmup_steps"`
	NumSteps      int64       `json:"num_steps"`
	LRDecayStyle  DecayStyle  `json:"lr_decay_style"`
	LRDecaySteps  int64       `json:"lr_decay_steps"`
	MinLR         float64     `json:"min_lr"`
	StartWD       float64     `json:"start_wd"`
	EndWD         float64     `json:"end_wd"`
	WDIncrStyle   WDIncrStyle `json:"wd_incr_style"`
	WDIncrSteps   int64       `json:"wd_incr_steps"`
}

// State returns the checkpoint record.
func (s *Scheduler) State() SchedulerState {
	c := s.cfg
	return SchedulerState{
		MaxLR: c.MaxLR, LRWarmupSteps: c.WarmupSteps, NumSteps: s.numSteps,
		LRDecayStyle: c.DecayStyle, LRDecaySteps: c.DecaySteps, MinLR: c.MinLR,
		StartWD: c.StartWD, EndWD: c.EndWD, WDIncrStyle: c.WDIncrStyle, WDIncrSteps: c.WDIncrSteps,
	}
}

// LoadState restores a checkpoint record with Megatron's load_state_dict
// rules, field by field: with Override the scheduler keeps its own value;
// with UseCheckpoint it takes the checkpoint's; otherwise the two must be
// equal and a mismatch is an error naming the field and both values. Then
// it advances by the saved num_steps (Megatron calls step(num_steps), so
// load into a fresh scheduler). The result must still pass Validate. On
// error the scheduler is unchanged.
func (s *Scheduler) LoadState(st SchedulerState) error {
	c := s.cfg
	var err error
	pick := func(name, flag string, cls, ckpt any) any {
		if err != nil || s.cfg.Override {
			return cls
		}
		if !s.cfg.UseCheckpoint && cls != ckpt {
			err = fmt.Errorf("optim: scheduler: load state: %s: %s gives %v but the checkpoint has %v "+
				"(pass --override-opt_param-scheduler to keep the flags or --use-checkpoint-opt_param-scheduler to take the checkpoint)",
				name, flag, cls, ckpt)
			return cls
		}
		return ckpt
	}
	c.MaxLR = pick("max_lr", "--lr", c.MaxLR, st.MaxLR).(float64)
	c.MinLR = pick("min_lr", "--min-lr", c.MinLR, st.MinLR).(float64)
	c.WarmupSteps = pick("lr_warmup_steps", "--lr-warmup-*", c.WarmupSteps, st.LRWarmupSteps).(float64)
	c.DecaySteps = pick("lr_decay_steps", "--lr-decay-iters/--lr-decay-samples", c.DecaySteps, st.LRDecaySteps).(int64)
	c.DecayStyle = pick("lr_decay_style", "--lr-decay-style", c.DecayStyle, st.LRDecayStyle).(DecayStyle)
	c.StartWD = pick("start_wd", "--start-weight-decay", c.StartWD, st.StartWD).(float64)
	c.EndWD = pick("end_wd", "--end-weight-decay", c.EndWD, st.EndWD).(float64)
	c.WDIncrSteps = pick("wd_incr_steps", "--train-iters/--train-samples", c.WDIncrSteps, st.WDIncrSteps).(int64)
	c.WDIncrStyle = pick("wd_incr_style", "--weight-decay-incr-style", c.WDIncrStyle, st.WDIncrStyle).(WDIncrStyle)
	if err != nil {
		return err
	}
	if st.NumSteps < 0 {
		return fmt.Errorf("optim: scheduler: load state: num_steps %d: want >= 0", st.NumSteps)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("optim: scheduler: load state: values taken from the checkpoint are inconsistent: %w", err)
	}
	s.cfg = c.withDefaults()
	s.numSteps += st.NumSteps
	return nil
}
