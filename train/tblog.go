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
// with --log-throughput, the throughput; at evaluations the validation loss
// (and its perplexity with --log-validation-ppl-to-tensorboard); with
// --log-memory-to-tensorboard the Go heap's counterparts of Megatron's CUDA
// memory scalars.

// TensorBoard configures the event files. The zero value writes none.
type TensorBoard struct {
	Dir                string // --tensorboard-dir; "" writes nothing
	LogInterval        int64  // --tensorboard-log-interval; 0 means 1
	LogTimers          bool   // --log-timers-to-tensorboard
	LogThroughput      bool   // --log-throughput
	LogValidationPPL   bool   // --log-validation-ppl-to-tensorboard
	LogMemory          bool   // --log-memory-to-tensorboard
	maxHeapAllocBytes  uint64
	writer             *tensorboard.Writer
	writeErrorReported bool
}

// openTensorBoard opens the writer on the logging rank.
func (t *Trainer) openTensorBoard() error {
	tb := &t.cfg.TensorBoard
	if tb.Dir == "" || !t.isLogger() {
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
func (t *Trainer) closeTensorBoard() error {
	tb := &t.cfg.TensorBoard
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
func (t *Trainer) tbScalar(tag string, v float64, vsSamples bool) {
	tb := &t.cfg.TensorBoard
	if tb.writer == nil || math.IsNaN(v) {
		return
	}
	err := tb.writer.AddScalar(tag, v, t.Iteration)
	if err == nil && vsSamples {
		err = tb.writer.AddScalar(tensorboard.VsSamples(tag), v, t.Consumed)
	}
	if err != nil && !tb.writeErrorReported {
		tb.writeErrorReported = true
		t.printf("WARNING: --tensorboard-dir: %v: no more TensorBoard output", err)
	}
}

// tbIteration writes the per-iteration scalars.
func (t *Trainer) tbIteration(loss float64) {
	tb := &t.cfg.TensorBoard
	if tb.writer == nil || t.Iteration%max(tb.LogInterval, 1) != 0 {
		return
	}
	t.tbScalar(tensorboard.TagLearningRate, t.lastLR, true)
	t.tbScalar(tensorboard.TagBatchSize, float64(t.mb.CurrentGlobalBatchSize()), true)
	t.tbScalar(tensorboard.TagLMLoss, loss, true)
	t.tbScalar(tensorboard.TagLossScale, float64(t.lossScale()), true)
	t.tbScalar(tensorboard.TagGradNorm, t.lastGradNorm, true)
	if tb.LogMemory {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		tb.maxHeapAllocBytes = max(tb.maxHeapAllocBytes, ms.HeapAlloc)
		t.tbScalar(tensorboard.TagMemReservedBytes, float64(ms.Sys), false)
		t.tbScalar(tensorboard.TagMemAllocatedBytes, float64(ms.HeapAlloc), false)
		t.tbScalar(tensorboard.TagMemMaxAllocatedBytes, float64(tb.maxHeapAllocBytes), false)
		t.tbScalar(tensorboard.TagMemAllocatedCount, float64(ms.Mallocs-ms.Frees), false)
	}
}

// tbLogLine writes the scalars of a log line (timers, throughput).
func (t *Trainer) tbLogLine(secondsPerIteration, tflopsPerRank float64) {
	tb := &t.cfg.TensorBoard
	if tb.writer == nil {
		return
	}
	if tb.LogTimers {
		t.tbScalar(tensorboard.TagIterationTime, secondsPerIteration, false)
	}
	if tb.LogThroughput {
		t.tbScalar(tensorboard.TagThroughput, tflopsPerRank, false)
	}
	if err := tb.writer.Flush(); err != nil && !tb.writeErrorReported {
		tb.writeErrorReported = true
		t.printf("WARNING: --tensorboard-dir: %v: no more TensorBoard output", err)
	}
}

// tbValidation writes an evaluation's loss (and perplexity).
func (t *Trainer) tbValidation(loss float64) {
	t.tbScalar(tensorboard.TagLMLossValidation, loss, true)
	if t.cfg.TensorBoard.LogValidationPPL {
		t.tbScalar(tensorboard.TagLMLossValidationPPL, math.Exp(math.Min(20, loss)), true)
	}
}
