package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/tensor"
)

// reporter reports a run as Megatron does: the log line every
// --log-interval iterations (with tokens/s and MFU), evaluation blocks,
// the metrics file, TensorBoard (tblog.go) and a progress bar. Only the
// logging rank writes (others discard their output).
type reporter struct {
	*position
	cfg     *Config
	par     *parallel.Groups
	stepper *stepper // the step's outcome (learning rate, grad norm, loss scale) and communication times

	metrics  *metricsWriter
	progress *progressBar

	// Since the last log line.
	lastLog        time.Time
	lastLogIter    int64
	lossSinceLog   float64
	itersSinceLog  int64
	skippedAtLog   int64 // Skipped and NaNIterations at the last log line
	nanAtLog       int64
	lastLoggedLoss float64            // the lm loss of the last log line
	moeSinceLog    map[string]float64 // MoE losses summed since the last log line (skipped iterations too, as Megatron)
	lastSyncWait   time.Duration      // the gradient reduction's wait at the last log line
	lastTPComm     time.Duration      // region.CommTime at the last log line
	startIter      int64              // the iteration Run started at
	memoryReported bool               // the theoretical memory report was printed
}

// open starts reporting a Run at the current position: it opens the
// metrics file, the progress bar and TensorBoard; close undoes it.
func (rp *reporter) open() (close func(), err error) {
	cfg := rp.cfg
	rp.lastLog, rp.lastLogIter, rp.startIter = rp.stepper.startTime, rp.Iteration, rp.Iteration
	rp.memoryReported = false
	rp.skippedAtLog, rp.nanAtLog = rp.Skipped, rp.NaNIterations
	var closers []func()
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if cfg.MetricsFile != "" {
		mw, err := openMetrics(cfg.MetricsFile)
		if err != nil {
			return close, err
		}
		closers = append(closers, func() { mw.Close() })
		rp.metrics = mw
	}
	if cfg.Progress != nil {
		rp.progress = newProgressBar(cfg.Progress, rp.Iteration, rp.trainIters, cfg.Now)
		closers = append(closers, rp.progress.finish)
	}
	if err := rp.openTensorBoard(); err != nil {
		return close, err
	}
	closers = append(closers, func() { rp.closeTensorBoard() })
	return close, nil
}

// logIteration accumulates the loss and, every --log-interval iterations
// and after a run's first, prints Megatron's log line (training_log in megatron/training/training.py)
// plus tokens/s and MFU, and appends a JSON object to the metrics file.
//
// It returns the iteration's metrics record (nil when nothing is logged or
// there is no metrics file); the caller adds this iteration's evaluation and
// writes it with writeMetrics.
func (rp *reporter) logIteration(loss float64) map[string]any {
	cfg := rp.cfg
	// Megatron leaves skipped iterations out of the logged mean.
	if !math.IsNaN(loss) && !math.IsInf(loss, 0) && !rp.stepper.overflow {
		rp.lossSinceLog += loss
		rp.itersSinceLog++
	}
	for name, v := range rp.stepper.moeMetrics {
		if rp.moeSinceLog == nil {
			rp.moeSinceLog = map[string]float64{}
		}
		rp.moeSinceLog[name] += v
	}
	if rp.progress != nil {
		rp.progress.update(rp.Iteration, loss)
	}
	// Megatron (d98e8a6) also logs the first iteration of every run, to
	// show the start-up cost, without resetting the interval: the next
	// line's loss, time and counts still cover that iteration.
	regular := rp.Iteration%cfg.LogInterval == 0 || rp.Iteration == rp.trainIters
	first := rp.Iteration == rp.startIter+1
	if !regular && !first {
		return nil
	}
	now := cfg.Now()
	iters := rp.Iteration - rp.lastLogIter
	if iters <= 0 {
		return nil
	}
	perIter := now.Sub(rp.lastLog).Seconds() / float64(iters)
	gbs := rp.batchSize()
	flops := FLOPsPerIteration(rp.cfg.Model, gbs, cfg.SeqLength)
	// Megatron's "throughput per GPU" divides by the world size; MFU is
	// against each process's peak.
	world := float64(rp.par.World.Size())
	tflops := flops / perIter / 1e12 / world
	tokensPerSec := float64(gbs*cfg.SeqLength) / perIter
	mfu := flops / perIter / world / cfg.PeakFLOPs
	avg := math.NaN()
	if rp.itersSinceLog > 0 {
		avg = rp.lossSinceLog / float64(rp.itersSinceLog)
	}
	// Megatron counts skipped and NaN iterations per log interval.
	skipped, nans := rp.Skipped-rp.skippedAtLog, rp.NaNIterations-rp.nanAtLog
	line := logLine{Time: now, Iteration: rp.Iteration, TrainIters: rp.trainIters, ConsumedSamples: rp.Consumed, ConsumedBins: rp.stepper.consumedBins,
		ElapsedMS: perIter * 1e3, LogThroughput: cfg.TensorBoard.LogThroughput, Throughput: tflops,
		LearningRate: rp.stepper.lastLR, GlobalBatchSize: gbs, LMLoss: avg, LossScale: float64(rp.stepper.lossScale()),
		GradNorm: rp.stepper.lastGradNorm, NumZeros: rp.stepper.lastNumZeros, HasNumZeros: rp.stepper.lastNumZeros >= 0, ParamsNorm: math.NaN(), SkippedIterations: skipped, NaNIterations: nans,
		TokensPerSecond: tokensPerSec, MFU: mfu}
	// The MoE losses follow the lm loss, as in Megatron's total_loss_dict,
	// averaged over the advanced iterations since the last log line.
	moe := map[string]float64{}
	for _, name := range moeMetricNames {
		if v, ok := rp.moeSinceLog[name]; ok {
			moe[name] = v / float64(max(rp.itersSinceLog, 1))
			line.MoELosses = append(line.MoELosses, namedValue{name, moe[name]})
		}
	}
	if regular {
		clear(rp.moeSinceLog)
	}
	if cfg.LogParamsNorm {
		line.ParamsNorm = rp.stepper.paramsNorm()
		rp.tbScalar("params-norm", line.ParamsNorm, true)
	}
	rp.rawf("%s", line.String())
	if !rp.memoryReported && isLogger(rp.par) {
		rp.memoryReported = true
		rp.printTheoreticalMemory() // after the first line, as Megatron's report_memory_flag
	}
	if err := rp.logTimers(first); err != nil {
		rp.printf("WARNING: %v", err)
	}
	rp.lastLoggedLoss = avg
	if !regular {
		return nil // TensorBoard and the metrics file keep --log-interval
	}
	rp.tbLogLine(perIter, tflops)
	var record map[string]any
	if rp.metrics != nil {
		// valid_loss is added by the caller when this iteration evaluates.
		record = map[string]any{
			"iteration": rp.Iteration, "timestamp": now.Format(time.RFC3339Nano), "consumed_samples": rp.Consumed,
			"elapsed_ms_per_iteration": perIter * 1e3, "tflops": tflops, "learning_rate": rp.stepper.lastLR, "global_batch_size": gbs,
			"lm_loss": jsonFloat(avg), "grad_norm": jsonFloat(rp.stepper.lastGradNorm), "skipped_iterations": skipped,
			"nan_iterations": nans, "loss_scale": rp.stepper.lossScale(), "tokens_per_second": tokensPerSec, "mfu": mfu,
			"grad_sync_wait_ms_per_iteration": rp.syncWaitSinceLog(iters),
			"tp_comm_ms_per_iteration":        rp.tpCommSinceLog(iters),
		}
		if rp.stepper.consumedBins > 0 {
			record["consumed_bins"] = rp.stepper.consumedBins
		}
		for name, v := range moe {
			record[name] = jsonFloat(v)
		}
		if rp.stepper.lastNumZeros >= 0 {
			record["num_zeros"] = rp.stepper.lastNumZeros
		}
	}
	rp.lastLog, rp.lastLogIter = now, rp.Iteration
	rp.lossSinceLog, rp.itersSinceLog = 0, 0
	rp.skippedAtLog, rp.nanAtLog = rp.Skipped, rp.NaNIterations
	return record
}

// namedValue is one of the log line's named losses.
type namedValue struct {
	name  string
	value float64
}

// moeMetricNames are the MoE losses Megatron logs, in its order.
var moeMetricNames = []string{"load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss", gpt.IndexerLossName}

// writeMetrics appends record to the metrics file (nothing for nil).
func (rp *reporter) writeMetrics(record map[string]any) {
	if rp.metrics != nil && record != nil {
		rp.metrics.write(record)
	}
}

// jsonFloat maps NaN/Inf (not representable in JSON) to nil.
func jsonFloat(x float64) any {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return x
}

type metricsWriter struct {
	f *os.File
	w *bufio.Writer
}

func openMetrics(path string) (*metricsWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("train: metrics file: %w", err)
	}
	return &metricsWriter{f: f, w: bufio.NewWriter(f)}, nil
}

func (m *metricsWriter) write(v map[string]any) {
	b, _ := json.Marshal(v)
	m.w.Write(append(b, '\n'))
	m.w.Flush()
}

func (m *metricsWriter) Close() error {
	m.w.Flush()
	return m.f.Close()
}

// progressBar draws "[#####.....] 120/500 loss 3.21 ETA 1m20s" on a
// terminal, redrawn in place.
type progressBar struct {
	w          io.Writer
	start, end int64
	t0         time.Time
	now        func() time.Time
	drawn      bool
}

func newProgressBar(w io.Writer, start, end int64, now func() time.Time) *progressBar {
	return &progressBar{w: w, start: start, end: end, t0: now(), now: now}
}

func (p *progressBar) update(it int64, loss float64) {
	const width = 30
	done := float64(it-p.start) / float64(max(p.end-p.start, 1))
	fill := int(done * width)
	elapsed := p.now().Sub(p.t0)
	eta := time.Duration(0)
	if it > p.start {
		eta = time.Duration(float64(elapsed) / float64(it-p.start) * float64(p.end-it))
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d loss %.4f ETA %s   ", strings.Repeat("#", fill), strings.Repeat(".", width-fill),
		it, p.end, loss, eta.Round(time.Second))
	p.drawn = true
}

func (p *progressBar) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

func (p *progressBar) finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// printTheoreticalMemory prints Megatron's report_theoretical_memory lines
// with the first log line (after the optimizer state exists).
func (rp *reporter) printTheoreticalMemory() {
	mc := rp.cfg.memoryConfig()
	mc.NumMicrobatches = rp.stepper.mb.Num()
	r, err := TheoreticalMemory(mc)
	if err != nil {
		return
	}
	if rp.progress != nil {
		rp.progress.clear()
	}
	r.WriteTo(rp.cfg.Out)
}

// paramsNorm is the L2 norm of every parameter, each counted once across
// tensor-parallel ranks (Megatron's calc_params_l2_norm for
// --log-params-norm). Collective under tensor parallelism.
func (st *stepper) paramsNorm() float64 {
	var counted []*tensor.Tensor
	cp := st.embeddingCopy()
	group := st.par.MP
	if st.fsdp != nil {
		// the shards: each element on one rank of the data × context
		// parallel group, so the sum is over the world
		group = st.par.World
		for _, g := range st.opt.Groups() {
			for _, p := range g.Params {
				name, _, _ := strings.Cut(p.Name, "[")
				if st.region.Rank() == 0 || !st.replicated(name) {
					counted = append(counted, p.Data)
				}
			}
		}
	}
	for _, p := range st.localParams() {
		if st.fsdp != nil || (st.region.Rank() != 0 && st.replicated(p.Name)) || p == cp {
			continue
		}
		counted = append(counted, p)
	}
	l, err := tensor.NewTensorList(counted...)
	if err != nil { // parameters are contiguous float32 tensors
		panic(fmt.Sprintf("train: params norm: %v", err))
	}
	sq := tensor.SumSquares(l)
	if err := sumOver(st.cctx, group, &sq); err != nil {
		return math.NaN()
	}
	return math.Sqrt(sq)
}

func (rp *reporter) printf(format string, args ...any) {
	if rp.progress != nil {
		rp.progress.clear()
	}
	fmt.Fprintf(rp.cfg.Out, "[%s] "+format+"\n", append([]any{rp.cfg.Now().Format("2006-01-02 15:04:05")}, args...)...)
}

// printEval prints Megatron's evaluation result block (evaluate_and_print_results).
func (rp *reporter) printEval(prefix string, loss float64) {
	s := fmt.Sprintf(" validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", prefix, loss, math.Exp(math.Min(20, loss)))
	dashes := strings.Repeat("-", len(s)+1)
	rp.rawf("%s", dashes)
	rp.rawf("%s", s)
	rp.rawf("%s", dashes)
}

// rawf prints a line without the timestamp (Megatron's print_rank_last).
func (rp *reporter) rawf(format string, args ...any) {
	if rp.progress != nil {
		rp.progress.clear()
	}
	fmt.Fprintf(rp.cfg.Out, format+"\n", args...)
}

// finalEvaluation reports an evaluation after training on set (the
// validation or the test set): the result block, TensorBoard (under the
// validation tags, unless training was skipped) and the metrics file
// (under key).
func (rp *reporter) finalEvaluation(set, key string, loss float64) {
	rp.printEval(fmt.Sprintf("iteration %d on %s", rp.Iteration, set), loss)
	if !rp.cfg.SkipTrain {
		rp.tbValidation(loss)
	}
	rp.writeMetrics(map[string]any{"iteration": rp.Iteration, "timestamp": rp.cfg.Now().Format(time.RFC3339Nano), key: jsonFloat(loss)})
}

// logLine is one of Megatron's training_log lines (megatron/training/
// training.py, NVIDIA/Megatron-LM d98e8a6), with gotron's tokens/s and MFU
// after Megatron's fields.
type logLine struct {
	Time                  time.Time
	Iteration, TrainIters int64
	ConsumedSamples       int64
	// ConsumedBins is printed after it when > 0 (RL sequence packing:
	// get_sequence_packing_log_info).
	ConsumedBins    int64
	ElapsedMS       float64 // per iteration
	LogThroughput   bool    // --log-throughput: print Throughput
	Throughput      float64 // TFLOP/s per rank
	LearningRate    float64
	GlobalBatchSize int
	// LMLoss is the interval's mean loss over the iterations that were not
	// skipped; NaN (none) leaves it out, as Megatron prints a loss only
	// when its average is >= 0.
	LMLoss float64
	// MoELosses are an MoE model's losses (Megatron's load_balancing_loss,
	// ..., z_loss), printed after the lm loss when >= 0.
	MoELosses []namedValue
	LossScale float64
	// GradNorm is the logged iteration's gradient norm; NaN (the iteration
	// was skipped: Megatron's optimizer returns None) leaves it out.
	GradNorm float64
	// NumZeros is the logged iteration's count of zero gradient elements,
	// printed when HasNumZeros (--log-num-zeros-in-grad, and the iteration
	// was not skipped).
	NumZeros    int64
	HasNumZeros bool
	// ParamsNorm is printed unless NaN (--log-params-norm off).
	ParamsNorm                       float64
	SkippedIterations, NaNIterations int64
	TokensPerSecond, MFU             float64
}

// String formats the line as training_log's log_string, field for field:
//
//	log_string = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
//	log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
//	log_string += ' consumed samples: {:12d} |'.format(args.consumed_train_samples)
//	if args.rl_use_sequence_packing: log_string += f' consumed bins: {args.consumed_train_bins:12d} |' (when > 0)
//	log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(...)
//	if args.log_throughput: log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
//	log_string += f' learning rate: {learning_rate:.6E} |'
//	log_string += f' global batch size: {batch_size:5d} |'
//	... if avg >= 0.0: log_string += ' {}: {:.6E} |'.format(key, avg)
//	log_string += f' loss scale: {loss_scale:.1f} |'
//	if grad_norm is not None: log_string += f' grad norm: {grad_norm:.3f} |'
//	if num_zeros_in_grad is not None: log_string += f' num zeros: {num_zeros_in_grad} |'
//	if params_norm is not None: log_string += f' params norm: {params_norm:.3f} |'
//	log_string += ' number of skipped iterations: {:3d} |'.format(...)
//	log_string += ' number of nan iterations: {:3d} |'.format(...)
//
// Megatron's lm loss after an interval of only skipped iterations is 0
// (the reset accumulator over max(1, 0) iterations) once a loss was ever
// added, and absent before; gotron leaves it out in both cases.
func (l logLine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, " [%s]", l.Time.Format("2006-01-02 15:04:05.000000"))
	fmt.Fprintf(&b, " iteration %8d/%8d |", l.Iteration, l.TrainIters)
	fmt.Fprintf(&b, " consumed samples: %12d |", l.ConsumedSamples)
	if l.ConsumedBins > 0 {
		fmt.Fprintf(&b, " consumed bins: %12d |", l.ConsumedBins)
	}
	fmt.Fprintf(&b, " elapsed time per iteration (ms): %s |", pyFixed(l.ElapsedMS, 1))
	if l.LogThroughput {
		fmt.Fprintf(&b, " throughput per GPU (TFLOP/s/GPU): %s |", pyFixed(l.Throughput, 1))
	}
	fmt.Fprintf(&b, " learning rate: %s |", pyExp(l.LearningRate))
	fmt.Fprintf(&b, " global batch size: %5d |", l.GlobalBatchSize)
	if l.LMLoss >= 0 {
		fmt.Fprintf(&b, " lm loss: %s |", pyExp(l.LMLoss))
	}
	for _, v := range l.MoELosses {
		if v.value >= 0 {
			fmt.Fprintf(&b, " %s: %s |", v.name, pyExp(v.value))
		}
	}
	fmt.Fprintf(&b, " loss scale: %s |", pyFixed(l.LossScale, 1))
	if !math.IsNaN(l.GradNorm) {
		fmt.Fprintf(&b, " grad norm: %s |", pyFixed(l.GradNorm, 3))
	}
	if l.HasNumZeros {
		fmt.Fprintf(&b, " num zeros: %d |", l.NumZeros)
	}
	if !math.IsNaN(l.ParamsNorm) {
		fmt.Fprintf(&b, " params norm: %s |", pyFixed(l.ParamsNorm, 3))
	}
	fmt.Fprintf(&b, " number of skipped iterations: %3d |", l.SkippedIterations)
	fmt.Fprintf(&b, " number of nan iterations: %3d |", l.NaNIterations)
	fmt.Fprintf(&b, " tokens/s: %s | MFU: %s%% |", pyFixed(l.TokensPerSecond, 1), pyFixed(100*l.MFU, 1))
	return b.String()
}

// pyFixed is Python's format(x, '.Nf'): Go's %.Nf but for the infinities
// and NaN, which Python spells inf, -inf and nan.
func pyFixed(x float64, prec int) string {
	if s, ok := pyNonFinite(x); ok {
		return s
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

// pyExp is Python's format(x, '.6E'): Go's %.6E (both write at least two
// exponent digits) but for inf and nan, which Python writes in upper case.
func pyExp(x float64) string {
	if s, ok := pyNonFinite(x); ok {
		return strings.ToUpper(s)
	}
	return fmt.Sprintf("%.6E", x)
}

func pyNonFinite(x float64) (string, bool) {
	switch {
	case math.IsNaN(x):
		return "nan", true
	case math.IsInf(x, 1):
		return "inf", true
	case math.IsInf(x, -1):
		return "-inf", true
	}
	return "", false
}

// logTimers is the end of Megatron's training_log: with
// --log-timers-to-tensorboard each timer's max over the ranks (seconds per
// iteration of the interval) goes to TensorBoard as NAME-time, then
// timers.log prints the --timing-log-level timers, normalised by
// --log-interval, reset unless this is the run's first iteration
// (Megatron's should_reset). Every rank takes part.
func (rp *reporter) logTimers(first bool) error {
	tm := rp.stepper.tm
	names := logNames(rp.cfg.TimingLogLevel)
	if tm == nil || len(names) == 0 {
		return nil
	}
	times, err := tm.allRanks(rp.stepper.cctx, rp.par.World, names, !first)
	if err != nil {
		return err
	}
	norm := float64(rp.cfg.LogInterval)
	if rp.cfg.TensorBoard.LogTimers {
		kept, _, maxs := minMax(names, times, norm)
		for i, name := range kept {
			rp.tbScalar(name+"-time", maxs[i], false)
		}
	}
	if block := tm.format(names, times, norm); block != "" {
		rp.rawf("%s", timersLogPrefix+block)
	}
	return nil
}

// batchSize is the logged global batch size: Megatron's mbs × DP ×
// micro-batches, which with RL packing is the bins the last iteration ran.
func (rp *reporter) batchSize() int {
	if rp.stepper.packedBatch > 0 {
		return rp.stepper.packedBatch
	}
	return rp.stepper.mb.CurrentGlobalBatchSize()
}
