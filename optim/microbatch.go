package optim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// MicrobatchConfig configures the number-of-microbatches calculator
// (megatron/core/num_microbatches_calculator.py). At most one of
// RampupBatchSize and StepBatchSizeSchedule may be set; with neither the
// global batch is constant.
type MicrobatchConfig struct {
	// GlobalBatchSize is --global-batch-size (the final size with a ramp-up;
	// ignored with a step schedule, whose last entry is the final size).
	GlobalBatchSize int
	// MicroBatchSize is --micro-batch-size (> 0).
	MicroBatchSize int
	// DataParallelSize is the data-parallel size without context parallelism (> 0).
	DataParallelSize int
	// DecreaseBatchSizeIfNeeded is --decrease-batch-size-if-needed: round the
	// running global batch down to a multiple of micro×DP instead of failing.
	DecreaseBatchSizeIfNeeded bool
	// RampupBatchSize is --rampup-batch-size START INCR RAMP_SAMPLES
	// (Megatron ≤ core_v0.17; HEAD ignores it). nil: no ramp-up.
	RampupBatchSize []int
	// StepBatchSizeSchedule is --step-batch-size-schedule, e.g.
	// "0:768 250B:1536" (Megatron HEAD). "": none.
	StepBatchSizeSchedule string
	// SeqLength, when > 0 with a step schedule, makes its thresholds tokens
	// (converted to samples by integer division); 0: thresholds are samples.
	SeqLength int
}

// BatchStep is one parsed step-schedule entry.
type BatchStep struct {
	// ThresholdSamples is the consumed-sample count from which Size applies.
	ThresholdSamples int64
	// Size is the global batch size.
	Size int
}

// Microbatches tells the training loop how many microbatches make up the
// current global batch. It is a pure function of consumed samples: call
// Update(consumed) at the start of every iteration, as Megatron does.
type Microbatches struct {
	cfg  MicrobatchConfig
	mxd  int // micro batch × data parallel
	kind int // 0 constant, 1 ramp-up, 2 step schedule

	// ramp-up
	start, incr, final int
	rampSamples        int64
	perIncrement       float64
	// step schedule
	steps []BatchStep

	current, running, num int
}

// NewMicrobatches validates cfg with Megatron's assertions (errors name the
// flags and values) and returns a calculator at 0 consumed samples.
func NewMicrobatches(cfg MicrobatchConfig) (*Microbatches, error) {
	m := &Microbatches{cfg: cfg}
	if cfg.MicroBatchSize <= 0 {
		return nil, fmt.Errorf("optim: microbatches: --micro-batch-size %d: want > 0", cfg.MicroBatchSize)
	}
	if cfg.DataParallelSize <= 0 {
		return nil, fmt.Errorf("optim: microbatches: data-parallel size %d: want > 0", cfg.DataParallelSize)
	}
	m.mxd = cfg.MicroBatchSize * cfg.DataParallelSize
	switch {
	case cfg.RampupBatchSize != nil && cfg.StepBatchSizeSchedule != "":
		return nil, fmt.Errorf("optim: microbatches: --rampup-batch-size and --step-batch-size-schedule are both set; give one")
	case cfg.StepBatchSizeSchedule != "":
		if cfg.DecreaseBatchSizeIfNeeded {
			return nil, fmt.Errorf("optim: microbatches: cannot specify both --step-batch-size-schedule and --decrease-batch-size-if-needed")
		}
		steps, err := ParseBatchSchedule(cfg.StepBatchSizeSchedule, cfg.SeqLength)
		if err != nil {
			return nil, err
		}
		m.kind, m.steps = 2, steps
	case cfg.RampupBatchSize != nil:
		if err := m.initRampup(); err != nil {
			return nil, err
		}
	default:
		if err := m.initConstant(); err != nil {
			return nil, err
		}
		return m, nil
	}
	m.update(0)
	return m, nil
}

// initConstant is ConstantNumMicroBatchesCalculator.
func (m *Microbatches) initConstant() error {
	c := m.cfg
	if c.GlobalBatchSize <= 0 {
		return fmt.Errorf("optim: microbatches: --global-batch-size %d: want > 0", c.GlobalBatchSize)
	}
	running := c.GlobalBatchSize
	if c.DecreaseBatchSizeIfNeeded {
		running = c.GlobalBatchSize / m.mxd * m.mxd
	} else if c.GlobalBatchSize%m.mxd != 0 {
		return fmt.Errorf("optim: microbatches: global batch size (%d) is not divisible by micro batch size (%d) times data parallel size (%d)",
			c.GlobalBatchSize, c.MicroBatchSize, c.DataParallelSize)
	}
	if running/m.mxd < 1 {
		return fmt.Errorf("optim: microbatches: number of microbatches should be at least 1, got %d (--global-batch-size %d, --micro-batch-size %d, data-parallel size %d)",
			running/m.mxd, c.GlobalBatchSize, c.MicroBatchSize, c.DataParallelSize)
	}
	m.current, m.running, m.num = c.GlobalBatchSize, running, running/m.mxd
	return nil
}

// initRampup is RampupBatchsizeNumMicroBatchesCalculator's constructor.
func (m *Microbatches) initRampup() error {
	c := m.cfg
	r := c.RampupBatchSize
	if len(r) != 3 {
		return fmt.Errorf("optim: microbatches: --rampup-batch-size has %d values, expected <start batch size> <batch size increment> <ramp-up samples>", len(r))
	}
	m.kind, m.start, m.incr, m.rampSamples, m.final = 1, r[0], r[1], int64(r[2]), c.GlobalBatchSize
	switch {
	case m.final <= 0:
		return fmt.Errorf("optim: microbatches: --global-batch-size %d: global batch size should be positive", m.final)
	case m.start <= 0:
		return fmt.Errorf("optim: microbatches: --rampup-batch-size start batch size %d: should be positive", m.start)
	case m.incr <= 0:
		return fmt.Errorf("optim: microbatches: --rampup-batch-size batch size increment %d: should be positive", m.incr)
	case m.rampSamples <= 0:
		// Megatron asserts >= 0, then divides 0 by 0 samples per increment.
		return fmt.Errorf("optim: microbatches: --rampup-batch-size ramp-up samples %d: should be positive", m.rampSamples)
	case m.final < m.start:
		return fmt.Errorf("optim: microbatches: expected --global-batch-size %d to be >= the ramp-up start batch size %d", m.final, m.start)
	case (m.final-m.start)%m.incr != 0:
		return fmt.Errorf("optim: microbatches: expected --global-batch-size %d minus start batch size %d to be divisible by the batch size increment %d",
			m.final, m.start, m.incr)
	case m.final == m.start:
		// Megatron divides by zero increments here.
		return fmt.Errorf("optim: microbatches: --rampup-batch-size start batch size equals --global-batch-size %d: nothing to ramp", m.final)
	}
	m.perIncrement = float64(m.rampSamples) / float64((m.final-m.start)/m.incr)
	return nil
}

// ParseBatchSchedule parses a --step-batch-size-schedule string: entries
// "THRESHOLD:SIZE" separated by spaces or commas, numbers with an optional
// K/M/B/T suffix (×1e3/1e6/1e9/1e12, parsed as a float then truncated, as
// Megatron's int(float(x)·mult)). With seqLength > 0 thresholds are tokens and
// become samples by integer division. Entries are sorted; the first threshold
// must be 0, thresholds strictly increasing and sizes positive.
func ParseBatchSchedule(schedule string, seqLength int) ([]BatchStep, error) {
	const flag = "--step-batch-size-schedule"
	var steps []BatchStep
	for _, e := range strings.Fields(strings.ReplaceAll(schedule, ",", " ")) {
		ts, bs, ok := strings.Cut(e, ":")
		if !ok {
			return nil, fmt.Errorf("optim: %s: invalid entry %q, expected format THRESHOLD:BATCH_SIZE", flag, e)
		}
		t, err := parseSuffixed(ts)
		if err != nil {
			return nil, fmt.Errorf("optim: %s: entry %q: threshold: %w", flag, e, err)
		}
		b, err := parseSuffixed(bs)
		if err != nil {
			return nil, fmt.Errorf("optim: %s: entry %q: batch size: %w", flag, e, err)
		}
		if seqLength > 0 {
			t = floorDiv(t, int64(seqLength))
		}
		if b > 1<<31 {
			return nil, fmt.Errorf("optim: %s: entry %q: batch size %d is too large", flag, e, b)
		}
		steps = append(steps, BatchStep{ThresholdSamples: t, Size: int(b)})
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].ThresholdSamples < steps[j].ThresholdSamples })
	if len(steps) == 0 {
		return nil, fmt.Errorf("optim: %s %q: schedule must have at least one entry", flag, schedule)
	}
	if steps[0].ThresholdSamples != 0 {
		return nil, fmt.Errorf("optim: %s: first schedule entry must have threshold 0, got %d", flag, steps[0].ThresholdSamples)
	}
	for i := 1; i < len(steps); i++ {
		if steps[i].ThresholdSamples <= steps[i-1].ThresholdSamples {
			return nil, fmt.Errorf("optim: %s: schedule thresholds must be strictly increasing, got %d before %d (in samples)",
				flag, steps[i-1].ThresholdSamples, steps[i].ThresholdSamples)
		}
	}
	for _, s := range steps {
		if s.Size <= 0 {
			return nil, fmt.Errorf("optim: %s: batch size must be positive, got %d", flag, s.Size)
		}
	}
	return steps, nil
}

// parseSuffixed is Megatron's _parse_numeric_value: int(float(x) * mult).
func parseSuffixed(s string) (int64, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	mult := 1.0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'T':
			mult, s = 1e12, s[:n-1]
		case 'B':
			mult, s = 1e9, s[:n-1]
		case 'M':
			mult, s = 1e6, s[:n-1]
		case 'K':
			mult, s = 1e3, s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != f || f > 9e18 || f < -9e18 {
		return 0, fmt.Errorf("%q is not a number with an optional K/M/B/T suffix", s)
	}
	v := f * mult
	if v > 9e18 || v < -9e18 {
		return 0, fmt.Errorf("%q×%g is out of range", s, mult)
	}
	return int64(v), nil // truncates toward zero, like Python int()
}

// floorDiv is Python's // for int64.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Update sets the batch sizes for consumedSamples without the divisibility
// check (Megatron's consistency_check=False, used at start-up and when
// simulating the schedule).
func (m *Microbatches) Update(consumedSamples int64) { m.update(consumedSamples) }

// UpdateChecked is Update followed by Megatron's consistency check: the
// current global batch must be divisible by micro batch × DP (unless
// --decrease-batch-size-if-needed). The training loop calls it each iteration.
func (m *Microbatches) UpdateChecked(consumedSamples int64) error {
	m.update(consumedSamples)
	if m.kind != 0 && !m.cfg.DecreaseBatchSizeIfNeeded && m.current%m.mxd != 0 {
		return fmt.Errorf("optim: microbatches: at %d consumed samples the current global batch size (%d) is not divisible by micro batch size (%d) times data parallel size (%d)",
			consumedSamples, m.current, m.cfg.MicroBatchSize, m.cfg.DataParallelSize)
	}
	return nil
}

// update is the calculators' update() without the consistency check.
func (m *Microbatches) update(consumed int64) {
	switch m.kind {
	case 0:
		return
	case 1:
		if consumed > m.rampSamples {
			m.current = m.final
		} else {
			m.current = m.start + int(float64(consumed)/m.perIncrement)*m.incr
		}
	case 2:
		m.current = m.steps[0].Size
		for _, s := range m.steps {
			if consumed < s.ThresholdSamples {
				break
			}
			m.current = s.Size
		}
	}
	m.running = m.current
	if m.cfg.DecreaseBatchSizeIfNeeded && m.current%m.mxd != 0 {
		m.running = m.current / m.mxd * m.mxd
	}
	m.num = m.running / m.mxd
}

// Num returns the number of microbatches per iteration (get_num_microbatches).
func (m *Microbatches) Num() int { return m.num }

// CurrentGlobalBatchSize returns the scheduled global batch size.
func (m *Microbatches) CurrentGlobalBatchSize() int { return m.current }

// CurrentRunningGlobalBatchSize returns the global batch actually run: the
// scheduled one rounded down to a multiple of micro×DP with
// --decrease-batch-size-if-needed, else equal to CurrentGlobalBatchSize.
func (m *Microbatches) CurrentRunningGlobalBatchSize() int { return m.running }

// MicroBatchSize returns --micro-batch-size.
func (m *Microbatches) MicroBatchSize() int { return m.cfg.MicroBatchSize }

// NumMicroBatches returns the number of microbatches at consumedSamples
// (Update then Num).
func (m *Microbatches) NumMicroBatches(consumedSamples int64) int {
	m.update(consumedSamples)
	return m.num
}

// TrainIters is Megatron's update_train_iters for --train-samples runs: with
// a constant batch, trainSamples // GBS; with a step schedule, iterations
// simulated until consumed >= trainSamples; with a ramp-up (core_v0.17),
// iterations simulated while consumed <= ramp samples and <= trainSamples,
// plus the remaining samples // GBS. The calculator is reset to 0 samples.
func (m *Microbatches) TrainIters(trainSamples int64) int64 {
	defer m.update(0)
	switch m.kind {
	case 1:
		var it, consumed int64
		for consumed <= m.rampSamples && consumed <= trainSamples {
			m.update(consumed)
			consumed += int64(m.current)
			it++
		}
		if trainSamples > consumed {
			it += (trainSamples - consumed) / int64(m.final)
		}
		return it
	case 2:
		var it, consumed int64
		for consumed < trainSamples {
			m.update(consumed)
			consumed += int64(m.current)
			it++
		}
		return it
	default:
		return trainSamples / int64(m.cfg.GlobalBatchSize)
	}
}
