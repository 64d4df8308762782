package train

import (
	"fmt"
	"math"
	"runtime"

	"github.com/gotron/gotron/train/tensorboard"
)

// TensorBoard logging as Megatron's training_log: the logging rank writes,
// every --tensorboard-log-interval iterations, the learning rate, batch size,
// lm loss, loss scale and grad norm (each also "vs samples"); at
// --log-interval, with --log-timers-to-tensorboard, the iteration time and,
// with --log-throughput too, the throughput; at evaluations the validation loss
// (and its perplexity with --log-validation-ppl-to-tensorboard); with
// --log-memory-to-tensorboard the Go heap's counterparts of Megatron's CUDA
// memory scalars.

// TensorBoard configures the event files. The zero value writes none.
type TensorBoard struct {
	Dir                string // --tensorboard-dir; "" writes nothing
	LogInterval        int64  // --tensorboard-log-interval; 0 means 1
	LogTimers          bool   // --log-timers-to-tensorboard
	LogThroughput      bool   // --log-throughput: the throughput on the log line (and here with LogTimers)
	LogValidationPPL   bool   // --log-validation-ppl-to-tensorboard
	LogMemory          bool   // --log-memory-to-tensorboard
	maxHeapAllocBytes  uint64
	writer             *tensorboard.Writer
	writeErrorReported bool
}

// openTensorBoard opens the writer on the logging rank.
func (rp *reporter) openTensorBoard() error {
	tb := &rp.cfg.TensorBoard
	if tb.Dir == "" || !isLogger(rp.par) {
		return nil
	}
	w, err := tensorboard.New(tb.Dir)
	if err != nil {
		return fmt.Errorf("train: --tensorboard-dir: %w", err)
	}
	tb.writer = w
	return nil
}

// closeTensorBoard flushes and closes the writer.
func (rp *reporter) closeTensorBoard() error {
	tb := &rp.cfg.TensorBoard
	if tb.writer == nil {
		return nil
	}
	err := tb.writer.Close()
	tb.writer = nil
	if err != nil {
		return fmt.Errorf("train: --tensorboard-dir: %w", err)
	}
	return nil
}

// tbScalar writes one scalar (and its "vs samples" twin when vsSamples); a
// write error is reported once on the log and stops TensorBoard output
// (training goes on).
func (rp *reporter) tbScalar(tag string, v float64, vsSamples bool) {
	tb := &rp.cfg.TensorBoard
	if tb.writer == nil || math.IsNaN(v) {
		return
	}
	err := tb.writer.AddScalar(tag, v, rp.Iteration)
	if err == nil && vsSamples {
		err = tb.writer.AddScalar(tensorboard.VsSamples(tag), v, rp.Consumed)
	}
	if err != nil && !tb.writeErrorReported {
		tb.writeErrorReported = true
		rp.printf("WARNING: --tensorboard-dir: %v: no more TensorBoard output", err)
	}
}

// tbIteration writes the per-iteration scalars.
func (rp *reporter) tbIteration(loss float64) {
	tb := &rp.cfg.TensorBoard
	if tb.writer == nil || rp.Iteration%max(tb.LogInterval, 1) != 0 {
		return
	}
	rp.tbScalar(tensorboard.TagLearningRate, rp.stepper.lastLR, true)
	rp.tbScalar(tensorboard.TagBatchSize, float64(rp.batchSize()), true)
	if rp.stepper.consumedBins > 0 { // get_sequence_packing_tensorboard_metrics
		rp.tbScalar(tensorboard.TagConsumedBins, float64(rp.stepper.consumedBins), false)
	}
	rp.tbScalar(tensorboard.TagLMLoss, loss, true)
	rp.tbScalar(tensorboard.TagLossScale, float64(rp.stepper.lossScale()), true)
	rp.tbScalar(tensorboard.TagGradNorm, rp.stepper.lastGradNorm, true)
	if rp.stepper.lastNumZeros >= 0 {
		rp.tbScalar("num-zeros", float64(rp.stepper.lastNumZeros), true)
	}
	for _, name := range moeMetricNames { // Megatron's MoEMetricsTracker: add_scalar(name, value, iteration)
		if v, ok := rp.stepper.moeMetrics[name]; ok {
			rp.tbScalar(name, v, false)
		}
	}
	if tb.LogMemory {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		tb.maxHeapAllocBytes = max(tb.maxHeapAllocBytes, ms.HeapAlloc)
		rp.tbScalar(tensorboard.TagMemReservedBytes, float64(ms.Sys), false)
		rp.tbScalar(tensorboard.TagMemAllocatedBytes, float64(ms.HeapAlloc), false)
		rp.tbScalar(tensorboard.TagMemMaxAllocatedBytes, float64(tb.maxHeapAllocBytes), false)
		rp.tbScalar(tensorboard.TagMemAllocatedCount, float64(ms.Mallocs-ms.Frees), false)
	}
}

// tbLogLine writes the scalars of a log line (timers, throughput).
func (rp *reporter) tbLogLine(secondsPerIteration, tflopsPerRank float64) {
	tb := &rp.cfg.TensorBoard
	if tb.writer == nil {
		return
	}
	if tb.LogTimers {
		rp.tbScalar(tensorboard.TagIterationTime, secondsPerIteration, false)
	}
	if tb.LogTimers && tb.LogThroughput { // Megatron writes it only with both
		rp.tbScalar(tensorboard.TagThroughput, tflopsPerRank, false)
	}
	if err := tb.writer.Flush(); err != nil && !tb.writeErrorReported {
		tb.writeErrorReported = true
		rp.printf("WARNING: --tensorboard-dir: %v: no more TensorBoard output", err)
	}
}

// tbValidation writes an evaluation's loss (and perplexity).
func (rp *reporter) tbValidation(loss float64) {
	rp.tbScalar(tensorboard.TagLMLossValidation, loss, true)
	if rp.cfg.TensorBoard.LogValidationPPL {
		rp.tbScalar(tensorboard.TagLMLossValidationPPL, math.Exp(math.Min(20, loss)), true)
	}
}
