package train

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Megatron's rerun state machine (megatron/core/rerun_state_machine.py),
// ported for gotron's training step: validate_result checks the loss (NaN,
// Inf, a spike), an iteration whose result is rejected is run again in
// place from the same saved state (dropout RNG, data position; the
// optimizer has not stepped), and the two results give a verdict:
//
//   - different: a transient error; the job exits with
//     ExitFailedOnResultValidation (17) (fatal checks) or carries on;
//   - the same: the result may be correct, or the device may be faulty; the
//     job saves a checkpoint at the last completed iteration with the
//     machine's state and exits with ExitResumeToDisambiguate (16), so the
//     iteration is run a third time from that checkpoint on another device:
//     different there means a persistent error on the first device (17),
//     the same means the result was correct (17 for a fatal check); resumed
//     on the same device, it asks to be resumed again (16).
//
// Error injection (--error-injection-rate, --error-injection-type) marks a
// result rejected and makes the reruns compare as the injected kind says,
// as Megatron's RerunErrorInjector.

// Exit statuses of Megatron's rerun state machine.
const (
	ExitResumeToDisambiguate     = 16 // EXIT_CODE_RESUME_TO_DISAMBIGUATE
	ExitFailedOnResultValidation = 17 // EXIT_CODE_FAILED_ON_RESULT_VALIDATION
)

// Rerun modes (--rerun-mode).
const (
	RerunDisabled        = "disabled"
	RerunValidateResults = "validate_results"
	RerunReportStats     = "report_stats"
)

// Injected result kinds (--error-injection-type), Megatron's RerunDiagnostic.
const (
	InjectCorrectResult   = "correct_result"
	InjectTransientError  = "transient_error"
	InjectPersistentError = "persistent_error"
)

// spikyLossFactor is pretrain_gpt.py's SPIKY_LOSS_FACTOR: a loss at least
// this many times the largest of the first spikySamples losses is a spike.
const (
	spikyLossFactor = 10
	spikySamples    = 100
	// reportStatsInterval is REPORTING_INTERVAL_ITERATIONS.
	reportStatsInterval = 2
)

// RerunConfig configures the rerun state machine; the zero value is
// gotron's default: disabled.
type RerunConfig struct {
	Mode               string // RerunDisabled (or ""), RerunValidateResults, RerunReportStats
	ErrorInjectionRate int    // inject into one validation in this many (0: never)
	ErrorInjectionType string // InjectTransientError (or ""), InjectCorrectResult, InjectPersistentError
	// CheckForSpikyLoss validates the loss against spikyLossFactor times
	// its largest early value (--check-for-spiky-loss), a non-fatal check.
	CheckForSpikyLoss bool
}

func (c RerunConfig) enabled() bool { return c.Mode != "" && c.Mode != RerunDisabled }

func (c RerunConfig) validate() error {
	switch c.Mode {
	case "", RerunDisabled, RerunValidateResults, RerunReportStats:
	default:
		return fmt.Errorf("train: --rerun-mode %q: want disabled, validate_results or report_stats", c.Mode)
	}
	switch c.ErrorInjectionType {
	case "", InjectCorrectResult, InjectTransientError, InjectPersistentError:
	default:
		return fmt.Errorf("train: --error-injection-type %q: want correct_result, transient_error or persistent_error", c.ErrorInjectionType)
	}
	if c.ErrorInjectionRate < 0 {
		return fmt.Errorf("train: --error-injection-rate %d: want 0 (off) or more", c.ErrorInjectionRate)
	}
	if c.ErrorInjectionRate > 0 && c.Mode != RerunValidateResults {
		return fmt.Errorf("train: --error-injection-rate %d needs --rerun-mode validate_results (Megatron injects only where results are validated)", c.ErrorInjectionRate)
	}
	return nil
}

// rerunState is Megatron's RerunState.
type rerunState int

const (
	notRunningYet rerunState = iota
	initialRun
	rerunningInPlace
	willRerunFromCheckpoint
	rerunningFromCheckpoint
	rerunningAgainFromCheckpoint
)

// Injected kinds as numbers (RerunErrorInjector.injected_error_type), none
// when no injection is pending.
const (
	injectNone = iota
	injectCorrect
	injectTransient
	injectPersistent
)

func injectKind(name string) int {
	switch name {
	case InjectCorrectResult:
		return injectCorrect
	case InjectPersistentError:
		return injectPersistent
	}
	return injectTransient
}

var injectNames = map[int]string{injectCorrect: "Expected result", injectTransient: "Transient error", injectPersistent: "Persistent error"}

// The validation messages of pretrain_gpt.py's loss_func, in the order it
// calls validate_result; a call is identified by its message and its
// sequence number within the iteration.
const (
	msgNaN   = "found NaN in local forward loss calculation"
	msgInf   = "found Inf in local forward loss calculation"
	msgSpiky = "Spiky loss"
)

var validationMessages = []string{msgNaN, msgInf, msgSpiky}

type validationCall struct {
	message  string
	sequence int
}

// rerunMachine is one rank's rerun state machine. The requests are
// agreed over the world (reduceAny) as Megatron's _reduce_any.
type rerunMachine struct {
	cfg      RerunConfig
	state    rerunState
	iter     int64 // current_iteration, 0-based
	rank     int
	node     string // this process's host
	device   int    // this process's device: gotron's world rank (one CPU or GPU per rank)
	logf     func(format string, args ...any)
	injRand  *rand.Rand
	injected int // injector's injected_error_type

	firstIterationComplete bool
	rerunRequested         bool
	checkpointRequested    bool
	restartAgainRequested  bool
	continueRequested      bool
	loggedEnabled          bool

	counts         map[string]int
	failedCall     validationCall
	initialResult  float64
	suspiciousNode string
	suspiciousDev  int
	largeCounts    map[string]int
	maxValues      map[string]float64
	savedResults   map[validationCall]float64
	stats          map[string]*quickStats
	reduceAny      func(flags []bool) ([]bool, error)
	saveState      func() // saves what a rerun restores (the dropout streams)
	restoreState   func()
}

func newRerunMachine(cfg RerunConfig, rank int, node string, device int, seed uint64, logf func(string, ...any)) *rerunMachine {
	m := &rerunMachine{cfg: cfg, iter: -1, rank: rank, node: node, device: device, logf: logf,
		injRand: rand.New(rand.NewPCG(seed, uint64(rank))), counts: map[string]int{},
		largeCounts: map[string]int{}, maxValues: map[string]float64{}, savedResults: map[validationCall]float64{},
		stats: map[string]*quickStats{}, suspiciousDev: -1,
		reduceAny: func(f []bool) ([]bool, error) { return f, nil }, saveState: func() {}, restoreState: func() {}}
	if cfg.Mode == "" {
		m.cfg.Mode = RerunDisabled
	}
	if cfg.ErrorInjectionType == "" {
		m.cfg.ErrorInjectionType = InjectTransientError
	}
	if m.cfg.enabled() && rank == 0 {
		logf("WARNING: RerunStateMachine initialized in mode RerunMode.%s", strings.ToUpper(rerunModeEnum(m.cfg.Mode)))
	}
	return m
}

func rerunModeEnum(mode string) string {
	if mode == RerunReportStats {
		return "report_determinism_stats"
	}
	return mode
}

// shouldRunForwardBackward is Megatron's should_run_forward_backward: true
// while the step's forward and backward passes are to be (re)run.
func (m *rerunMachine) shouldRunForwardBackward() (bool, error) {
	clear(m.counts)
	switch m.state {
	case notRunningYet:
		m.iter++
		m.state = initialRun
		if m.cfg.Mode == RerunDisabled {
			return true, nil
		}
		m.saveState()
		m.rerunRequested, m.checkpointRequested, m.restartAgainRequested, m.continueRequested = false, false, false, false
		return true, nil
	case initialRun:
		if m.cfg.Mode == RerunDisabled {
			m.state = notRunningYet
			return false, nil
		}
		r, err := m.reduceAny([]bool{m.rerunRequested})
		if err != nil {
			return false, err
		}
		if !r[0] {
			m.state = notRunningYet
			return false, nil
		}
		if m.cfg.Mode == RerunValidateResults && m.rank == 0 {
			m.logf("WARNING: Need to rerun step to check reproducibility of initial result")
		}
		m.state = rerunningInPlace
		m.restoreState()
		return true, nil
	case rerunningInPlace:
		if m.cfg.Mode == RerunReportStats {
			m.state = notRunningYet
			m.maybeReportStats()
			clear(m.savedResults)
			return false, nil
		}
		r, err := m.reduceAny([]bool{m.continueRequested, m.checkpointRequested})
		if err != nil {
			return false, err
		}
		if r[0] {
			m.warn0("Continuing normal execution because failed validation was not fatal")
			m.state = notRunningYet
			return false, nil
		}
		if r[1] {
			m.state = willRerunFromCheckpoint
		}
		m.restoreState()
		return false, nil
	case willRerunFromCheckpoint:
		m.state = rerunningFromCheckpoint
		return true, nil
	case rerunningFromCheckpoint:
		r, err := m.reduceAny([]bool{m.restartAgainRequested, m.continueRequested})
		if err != nil {
			return false, err
		}
		if r[0] {
			m.warn0("Need to restart job from the same checkpoint because it was scheduled on the same node/GPU")
			m.state = rerunningAgainFromCheckpoint
		} else if r[1] {
			m.warn0("Continuing normal execution because failed validation was not fatal")
			m.state = notRunningYet
		}
		return false, nil
	}
	return false, fmt.Errorf("train: rerun state machine: iteration %d: no run in state %d", m.iter+1, m.state)
}

func (m *rerunMachine) warn0(msg string) {
	if m.rank == 0 {
		m.logf("WARNING: %s", msg)
	}
}

// checkpointAndExit is Megatron's should_checkpoint_and_exit: whether to
// save a checkpoint, whether to exit, and the exit status.
func (m *rerunMachine) checkpointAndExit() (checkpoint, exit bool, code int) {
	m.firstIterationComplete = true
	if m.cfg.Mode != RerunValidateResults {
		return false, false, 0
	}
	switch m.state {
	case rerunningInPlace:
		m.warn0("Exiting now. The job can be resumed from a previous checkpoint")
		return false, true, ExitFailedOnResultValidation
	case willRerunFromCheckpoint:
		m.warn0("Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun the last iteration and establish a diagnostic")
		return true, true, ExitResumeToDisambiguate
	case rerunningFromCheckpoint:
		m.warn0("Exiting now. A checkpoint at the last iteration already exists if further examination is needed")
		return false, true, ExitFailedOnResultValidation
	case rerunningAgainFromCheckpoint:
		m.warn0("Exiting now. Please resume the job from the same checkpoint to rerun the last iteration and establish a diagnostic")
		return false, true, ExitResumeToDisambiguate
	}
	return false, false, 0
}

// validateLoss makes pretrain_gpt.py's loss_func checks of one
// micro-batch's local loss: NaN and Inf (fatal), and with
// --check-for-spiky-loss a spike (not fatal). With the machine disabled a
// NaN/Inf loss is left to gotron's NaN-iteration skipping.
func (m *rerunMachine) validateLoss(loss float64) {
	if m.cfg.Mode == RerunDisabled {
		return
	}
	m.validate(loss, math.IsNaN, msgNaN, true)
	m.validate(loss, func(v float64) bool { return math.IsInf(v, 0) }, msgInf, true)
	if m.cfg.CheckForSpikyLoss {
		m.validate(loss, func(v float64) bool { return m.unexpectedlyLarge(v, spikyLossFactor, "loss") }, msgSpiky, false)
	}
}

// validate is Megatron's validate_result with tolerance 0 (the forward
// pass is deterministic) and the default float comparison.
func (m *rerunMachine) validate(result float64, reject func(float64) bool, message string, fatal bool) {
	m.counts[message]++
	call := validationCall{message: message, sequence: m.counts[message]}
	if m.cfg.Mode == RerunReportStats {
		switch m.state {
		case initialRun:
			m.rerunRequested = true
			m.savedResults[call] = result
		case rerunningInPlace:
			if m.stats[message] == nil {
				m.stats[message] = &quickStats{}
			}
			m.stats[message].record(compareFloats(m.savedResults[call], result))
		}
		return
	}
	where := fmt.Sprintf("Rank %d, node %s, device %d, iteration #%d", m.rank, m.node, m.device, m.iter+1)
	logFailure := func(msg string, fatal bool) {
		level := "ERROR"
		if !fatal {
			level = "WARNING"
		}
		m.logf("%s: %s: %s!", level, where, msg)
	}
	if !m.loggedEnabled {
		m.loggedEnabled = true
		m.warn0("Result validation enabled")
	}
	switch {
	case m.state == initialRun && !m.rerunRequested:
		// Not on the first iteration: a checkpoint cannot be taken before
		// the optimizer has stepped once.
		if !m.firstIterationComplete {
			return
		}
		if m.maybeInject() || reject(result) {
			m.failedCall, m.initialResult, m.rerunRequested = call, result, true
			m.logf("ERROR: Unexpected result %s on rank %d at iteration #%d invocation #%d (message='%s')", fmtResult(result), m.rank, m.iter+1, call.sequence, message)
		}
	case (m.state == rerunningInPlace || m.state == rerunningFromCheckpoint) && call == m.failedCall:
		cmp := m.maybeMiscompare(m.initialResult, result)
		if m.state == rerunningInPlace {
			if cmp > 0 {
				if !fatal {
					m.continueRequested = true
				}
				logFailure(fmt.Sprintf("First rerun: unexpected result is not reproducible within the tolerance (%s != %s)", fmtResult(result), fmtResult(m.initialResult)), fatal)
				logFailure("Possible transient error", fatal)
			} else {
				if fatal {
					m.checkpointRequested = true
				} else {
					m.continueRequested = true
				}
				m.suspiciousNode, m.suspiciousDev = m.node, m.device
				logFailure(fmt.Sprintf("First rerun: unexpected result is reproducible within the tolerance (%s = %s). Need to rerun on a different GPU to verify correctness", fmtResult(result), fmtResult(m.initialResult)), fatal)
			}
			return
		}
		switch {
		case m.node == m.suspiciousNode && m.device == m.suspiciousDev:
			m.logf("ERROR: Got rescheduled on the same GPU. Need to resume again from the same checkpoint (node: %s, gpu: %d)", m.suspiciousNode, m.suspiciousDev)
			m.restartAgainRequested = true
		case cmp > 0:
			m.logf("WARNING: Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely incorrect (%s != %s)", fmtResult(result), fmtResult(m.initialResult))
			logFailure("Possible persistent error", true)
			if !fatal {
				m.continueRequested = true
			}
		default:
			m.logf("WARNING: Second rerun: unexpected result is reproducible on a different GPU, therefore it was likely correct (%s = %s)", fmtResult(result), fmtResult(m.initialResult))
			logFailure(fmt.Sprintf("Correct result (but possible Application error) (%s)", message), true)
			if !fatal {
				m.continueRequested = true
			}
		}
	}
}

// fmtResult prints a loss as a 0-dim float tensor's value.
func fmtResult(v float64) string { return fmt.Sprintf("%.4g", v) }

// unexpectedlyLarge is Megatron's is_unexpectedly_large: the first
// spikySamples values set the maximum; a later value at least threshold
// times it is rejected. NaN and Inf are left to their own checks.
func (m *rerunMachine) unexpectedlyLarge(v, threshold float64, context string) bool {
	v = math.Abs(v)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	if m.largeCounts[context] < spikySamples {
		m.largeCounts[context]++
		m.maxValues[context] = max(m.maxValues[context], v)
		if m.largeCounts[context] == spikySamples {
			m.logf("WARNING: Max value for %s: %v", context, m.maxValues[context])
		}
		return false
	}
	return v >= m.maxValues[context]*threshold
}

// maybeInject is RerunErrorInjector.maybe_inject: at most one injection
// pending; each validation is chosen with probability 1/rate (offset by
// the rank, as Megatron's).
func (m *rerunMachine) maybeInject() bool {
	rate := m.cfg.ErrorInjectionRate
	if rate <= 0 || m.injected != injectNone {
		return false
	}
	if (m.injRand.IntN(rate)+m.rank)%rate != 0 {
		return false
	}
	m.injected = injectKind(m.cfg.ErrorInjectionType)
	m.logf("WARNING: Injecting error type %s", injectNames[m.injected])
	return true
}

// maybeMiscompare is RerunErrorInjector.maybe_miscompare: with an
// injection pending the reruns compare as its kind says, else as the
// results do.
func (m *rerunMachine) maybeMiscompare(a, b float64) float64 {
	if m.injected == injectNone {
		return compareFloats(a, b)
	}
	if m.state == rerunningInPlace {
		if m.injected == injectTransient {
			m.injected = injectNone
			return math.Inf(1)
		}
		return 0
	}
	kind := m.injected
	m.injected = injectNone
	if kind == injectPersistent {
		return math.Inf(1)
	}
	return 0
}

// compareFloats is Megatron's _compare_floats: 0 for equal results (NaN
// equals NaN), +Inf when one is NaN or Inf and the other not, else the
// relative difference.
func compareFloats(a, b float64) float64 {
	if a == b || (math.IsNaN(a) && math.IsNaN(b)) {
		return 0
	}
	if math.IsNaN(a) != math.IsNaN(b) || math.IsInf(a, 0) != math.IsInf(b, 0) {
		return math.Inf(1)
	}
	return math.Abs((a - b) / (a + b) * 2)
}

func (m *rerunMachine) maybeReportStats() {
	// Megatron gathers the ranks' samples to rank 0; here each rank that
	// validated (the last pipeline stage's) prints its own.
	if m.iter%reportStatsInterval != 0 || len(m.stats) == 0 {
		return
	}
	m.logf("Stats on computation determinism in validation calls (rank %d)", m.rank)
	names := make([]string, 0, len(m.stats))
	for k := range m.stats {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		m.logf("  From validation call '%s':", k)
		m.logf("    %s", m.stats[k].String())
	}
}

// quickStats is Megatron's QuickStats: the distribution of the relative
// differences between a result and its rerun.
type quickStats struct {
	samples []float64
	zero    int
	max     float64
}

func (q *quickStats) record(v float64) {
	if v == 0 {
		q.zero++
		return
	}
	q.samples = append(q.samples, v)
	q.max = max(q.max, v)
}

// String is QuickStats.print_stats.
func (q *quickStats) String() string {
	sort.Float64s(q.samples)
	z, n := q.zero, len(q.samples)
	if n == 0 {
		return fmt.Sprintf("%s samples, all identical", commaInt(z))
	}
	t := z + n
	var s float64
	for _, v := range q.samples {
		s += v
	}
	ps := map[float64]string{}
	for _, p := range []float64{0.5, 0.9, 0.99, 0.999} {
		i := int(float64(t)*p) - z
		ps[p] = "0.0"
		if i >= 0 {
			ps[p] = pyE(q.samples[i])
		}
	}
	return fmt.Sprintf("%s/%s total/identical samples, rel. variability: avg= %s, p50= %s, p90= %s, p99= %s, p99.9= %s, max: %s",
		commaInt(t), commaInt(z), pyE(s/float64(t)), ps[0.5], ps[0.9], ps[0.99], ps[0.999], pyE(q.max))
}

// pyE formats as Python's "{:.3E}" (a two-digit exponent at least).
func pyE(v float64) string {
	s := fmt.Sprintf("%.3E", v)
	return s
}

func commaInt(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// RerunExit is the error a run stops with when the rerun state machine
// ends the job (Megatron's sys.exit(exit_code) in train): Code is the exit
// status; Checkpoint whether a checkpoint was saved first at Iteration, the
// last completed iteration, for the job to be resumed from.
type RerunExit struct {
	Code       int
	Checkpoint bool
	Iteration  int64
}

func (e *RerunExit) Error() string {
	if e.Code == ExitResumeToDisambiguate {
		return fmt.Sprintf("train: the rerun state machine stopped the job at iteration %d (exit status %d): resume it from the checkpoint to rerun iteration %d and establish a diagnostic", e.Iteration, e.Code, e.Iteration+1)
	}
	return fmt.Sprintf("train: the rerun state machine stopped the job at iteration %d: result validation failed (exit status %d)", e.Iteration+1, e.Code)
}

// ExitCode is the process's exit status.
func (e *RerunExit) ExitCode() int { return e.Code }

// setupRerun builds the stepper's rerun state machine: its requests agreed
// over the world, and what a rerun restores (the dropout streams; the data
// position and the optimizer do not move before the step ends).
func (st *stepper) setupRerun() error {
	c := st.cfg.Rerun
	if err := c.validate(); err != nil {
		return err
	}
	if c.enabled() && st.cfg.Model.MoE.Enabled() {
		return fmt.Errorf("train: --rerun-mode %s with --num-experts: gotron's MoE layers accumulate their logged losses and expert-bias counts over the step's forward passes, which a rerun would count twice; use --rerun-mode disabled", c.Mode)
	}
	node, _ := os.Hostname()
	rank := st.par.World.Rank()
	logf := st.printf
	if w := st.cfg.Diag; w != nil {
		logf = func(format string, args ...any) {
			fmt.Fprintf(w, "[%s] "+format+"\n", append([]any{st.cfg.Now().Format("2006-01-02 15:04:05")}, args...)...)
		}
	}
	m := newRerunMachine(c, rank, node, rank, uint64(st.cfg.Seed), logf)
	m.iter = st.Iteration - 1
	var saved [2]tensor.RNGState
	m.saveState = func() {
		saved[0] = st.rng.State()
		if st.rankRNG != nil {
			saved[1] = st.rankRNG.State()
		}
	}
	m.restoreState = func() {
		st.rng.SetState(saved[0])
		if st.rankRNG != nil {
			st.rankRNG.SetState(saved[1])
		}
	}
	if st.par.World.Size() > 1 {
		m.reduceAny = func(flags []bool) ([]bool, error) {
			v := make([]float32, len(flags))
			for i, f := range flags {
				if f {
					v[i] = 1
				}
			}
			if err := st.par.World.AllReduce(st.cctx, comm.Float32s(v), comm.Sum); err != nil {
				return nil, fmt.Errorf("train: iteration %d: rerun state machine: %w", st.Iteration+1, err)
			}
			out := make([]bool, len(v))
			for i, x := range v {
				out[i] = x > 0
			}
			return out, nil
		}
	}
	st.rerun = m
	return nil
}

// RerunCheckpoint is the rerun state machine's state in a checkpoint
// (Megatron's RerunStateMachine.state_dict): the state common to all
// ranks, and each world rank's own part (its pending requests, the failed
// validation, the injection pending, the device that reproduced the
// result, the spiky-loss maximum).
type RerunCheckpoint struct {
	Mode      string           `json:"mode"`
	State     int              `json:"state"`
	Iteration int64            `json:"current_iteration"`
	Ranks     []RerunRankState `json:"sharded"`
}

// RerunRankState is one rank's part of RerunCheckpoint.
type RerunRankState struct {
	RerunRequested        bool   `json:"rerun_requested"`
	CheckpointRequested   bool   `json:"checkpoint_requested"`
	RestartAgainRequested bool   `json:"restart_again_requested"`
	ContinueRequested     bool   `json:"continue_requested"`
	InjectedErrorType     int    `json:"injected_error_type"`       // 0 none, 1 correct_result, 2 transient_error, 3 persistent_error
	FailedMessage         int    `json:"failed_validation_message"` // index into the loss checks; -1 none
	FailedSequence        int    `json:"failed_validation_sequence"`
	InitialResultBits     uint64 `json:"initial_result_bits"` // the float64's bits: NaN and Inf survive JSON
	SuspiciousNodeHash    uint64 `json:"suspicious_node_fnv64"`
	SuspiciousDevice      int    `json:"suspicious_device"`
	LossSamples           int    `json:"large_value_count_loss"`
	LossMaxBits           uint64 `json:"max_value_loss_bits"`
}

const rerunRankFields = 12

func nodeHash(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	return h.Sum64()
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// rankState packs this rank's part for the all-gather.
func (m *rerunMachine) rankState() []int64 {
	failed := -1
	for i, msg := range validationMessages {
		if msg == m.failedCall.message {
			failed = i
		}
	}
	var susp uint64
	if m.suspiciousNode != "" {
		susp = nodeHash(m.suspiciousNode)
	}
	return []int64{b2i(m.rerunRequested), b2i(m.checkpointRequested), b2i(m.restartAgainRequested), b2i(m.continueRequested),
		int64(m.injected), int64(failed), int64(m.failedCall.sequence), int64(math.Float64bits(m.initialResult)),
		int64(susp), int64(m.suspiciousDev), int64(m.largeCounts["loss"]), int64(math.Float64bits(m.maxValues["loss"]))}
}

// checkpointState is the machine's state for a checkpoint, all ranks'
// parts gathered; nil when the machine is disabled (Megatron saves none).
func (st *stepper) rerunCheckpointState() (*RerunCheckpoint, error) {
	m := st.rerun
	if m == nil || !m.cfg.enabled() {
		return nil, nil
	}
	mine := m.rankState()
	all := mine
	if w := st.par.World.Size(); w > 1 {
		all = make([]int64, rerunRankFields*w)
		if err := st.par.World.AllGather(st.cctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
			return nil, fmt.Errorf("train: --save: gather the rerun state machine's state: %w", err)
		}
	}
	c := &RerunCheckpoint{Mode: m.cfg.Mode, State: int(m.state), Iteration: m.iter}
	for r := 0; r < len(all)/rerunRankFields; r++ {
		c.Ranks = append(c.Ranks, unpackRank(all[r*rerunRankFields:]))
	}
	return c, nil
}

// unpackRank is the inverse of rankState.
func unpackRank(v []int64) RerunRankState {
	return RerunRankState{RerunRequested: v[0] != 0, CheckpointRequested: v[1] != 0, RestartAgainRequested: v[2] != 0,
		ContinueRequested: v[3] != 0, InjectedErrorType: int(v[4]), FailedMessage: int(v[5]), FailedSequence: int(v[6]),
		InitialResultBits: uint64(v[7]), SuspiciousNodeHash: uint64(v[8]), SuspiciousDevice: int(v[9]),
		LossSamples: int(v[10]), LossMaxBits: uint64(v[11])}
}

// loadRerunState restores the machine from a checkpoint's state, as
// Megatron's load_state_dict: only a state with a rerun pending is loaded,
// and a disabled machine ignores it (saying so).
func (st *stepper) loadRerunState(root string, c *RerunCheckpoint) error {
	return st.rerun.load(root, c, st.par.World.Size(), st.rerun.logf)
}

func (m *rerunMachine) load(root string, c *RerunCheckpoint, worldSize int, printf func(string, ...any)) error {
	if c == nil || rerunState(c.State) == notRunningYet {
		return nil
	}
	if !m.cfg.enabled() {
		printf("WARNING: RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint")
		return nil
	}
	if c.State < int(notRunningYet) || c.State > int(rerunningAgainFromCheckpoint) {
		return fmt.Errorf("train: --load %s: rerun_state_machine state %d: want 0 to %d", root, c.State, rerunningAgainFromCheckpoint)
	}
	if len(c.Ranks) != worldSize {
		return fmt.Errorf("train: --load %s: the rerun state machine's state was saved by %d ranks, this run has %d: resume the rerun with the world size that saved it", root, len(c.Ranks), worldSize)
	}
	printf("WARNING: Getting RerunStateMachine state from checkpoint. Will rerun step.")
	r := c.Ranks[m.rank]
	if r.FailedMessage < -1 || r.FailedMessage >= len(validationMessages) {
		return fmt.Errorf("train: --load %s: rerun_state_machine rank %d: failed_validation_message %d: want -1 to %d", root, m.rank, r.FailedMessage, len(validationMessages)-1)
	}
	if r.InjectedErrorType < injectNone || r.InjectedErrorType > injectPersistent {
		return fmt.Errorf("train: --load %s: rerun_state_machine rank %d: injected_error_type %d: want 0 to 3", root, m.rank, r.InjectedErrorType)
	}
	m.cfg.Mode, m.state, m.iter = c.Mode, rerunState(c.State), c.Iteration
	m.rerunRequested, m.checkpointRequested, m.restartAgainRequested, m.continueRequested = r.RerunRequested, r.CheckpointRequested, r.RestartAgainRequested, r.ContinueRequested
	m.injected = r.InjectedErrorType
	m.failedCall = validationCall{}
	if r.FailedMessage >= 0 {
		m.failedCall = validationCall{message: validationMessages[r.FailedMessage], sequence: r.FailedSequence}
	}
	m.initialResult = math.Float64frombits(r.InitialResultBits)
	m.suspiciousNode, m.suspiciousDev = "", r.SuspiciousDevice
	if r.SuspiciousNodeHash != 0 && r.SuspiciousNodeHash == nodeHash(m.node) {
		m.suspiciousNode = m.node // the same host saved it
	} else if r.SuspiciousNodeHash != 0 {
		m.suspiciousNode = fmt.Sprintf("host with FNV-64 %016x", r.SuspiciousNodeHash)
	}
	m.largeCounts["loss"], m.maxValues["loss"] = r.LossSamples, math.Float64frombits(r.LossMaxBits)
	return nil
}
