package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/gotron/gotron/tensor"
)

// logIteration accumulates the loss and, every --log-interval iterations,
// prints Megatron's log line (training_log in megatron/training/training.py)
// plus tokens/s and MFU, and appends a JSON object to the metrics file.
//
// It returns the iteration's metrics record (nil when nothing is logged or
// there is no metrics file); the caller adds this iteration's evaluation and
// writes it with writeMetrics.
func (t *Trainer) logIteration(loss float64) map[string]any {
	cfg := &t.cfg
	// Megatron leaves skipped iterations out of the logged mean.
	if !math.IsNaN(loss) && !math.IsInf(loss, 0) && !t.overflow {
		t.lossSinceLog += loss
		t.itersSinceLog++
	}
	if t.progress != nil {
		t.progress.update(t.Iteration, loss)
	}
	if t.Iteration%cfg.LogInterval != 0 && t.Iteration != t.trainIters {
		return nil
	}
	now := cfg.Now()
	iters := t.Iteration - t.lastLogIter
	if iters <= 0 {
		return nil
	}
	perIter := now.Sub(t.lastLog).Seconds() / float64(iters)
	gbs := t.mb.CurrentGlobalBatchSize()
	flops := FLOPsPerIteration(t.cfg.Model, gbs, cfg.SeqLength)
	// Megatron's "throughput per GPU" divides by the world size; MFU is
	// against each process's peak.
	world := float64(t.par.World.Size())
	tflops := flops / perIter / 1e12 / world
	tokensPerSec := float64(gbs*cfg.SeqLength) / perIter
	mfu := flops / perIter / world / cfg.PeakFLOPs
	avg := math.NaN()
	if t.itersSinceLog > 0 {
		avg = t.lossSinceLog / float64(t.itersSinceLog)
	}
	// Megatron counts skipped and NaN iterations per log interval.
	skipped, nans := t.Skipped-t.skippedAtLog, t.NaNIterations-t.nanAtLog
	var b strings.Builder
	fmt.Fprintf(&b, "iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): %.1f | throughput per GPU (TFLOP/s/GPU): %.3f | learning rate: %.6E | global batch size: %5d | lm loss: %.6E | loss scale: %.1f | grad norm: %.3f | number of skipped iterations: %3d | number of nan iterations: %3d | tokens/s: %.1f | MFU: %.1f%% |",
		t.Iteration, t.trainIters, t.Consumed, perIter*1e3, tflops, t.lastLR, gbs, avg, t.lossScale(), t.lastGradNorm, skipped, nans, tokensPerSec, 100*mfu)
	if t.lastLogIter == t.startIter && t.isLogger() {
		t.printTheoreticalMemory()
	}
	if cfg.LogParamsNorm {
		pn := t.paramsNorm()
		fmt.Fprintf(&b, " params norm: %.3f |", pn)
		t.tbScalar("params-norm", pn, true)
	}
	t.printf("%s", b.String())
	t.tbLogLine(perIter, tflops)
	var record map[string]any
	if t.metrics != nil {
		// valid_loss is added by the caller when this iteration evaluates.
		record = map[string]any{
			"iteration": t.Iteration, "timestamp": now.Format(time.RFC3339Nano), "consumed_samples": t.Consumed,
			"elapsed_ms_per_iteration": perIter * 1e3, "tflops": tflops, "learning_rate": t.lastLR, "global_batch_size": gbs,
			"lm_loss": jsonFloat(avg), "grad_norm": jsonFloat(t.lastGradNorm), "skipped_iterations": skipped,
			"nan_iterations": nans, "loss_scale": t.lossScale(), "tokens_per_second": tokensPerSec, "mfu": mfu,
			"grad_sync_wait_ms_per_iteration": t.syncWaitSinceLog(iters),
			"tp_comm_ms_per_iteration":        t.tpCommSinceLog(iters),
		}
	}
	t.lastLog, t.lastLogIter, t.lastLoggedLoss = now, t.Iteration, avg
	t.lossSinceLog, t.itersSinceLog = 0, 0
	t.skippedAtLog, t.nanAtLog = t.Skipped, t.NaNIterations
	return record
}

// writeMetrics appends record to the metrics file (nothing for nil).
func (t *Trainer) writeMetrics(record map[string]any) {
	if t.metrics != nil && record != nil {
		t.metrics.write(record)
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
func (t *Trainer) printTheoreticalMemory() {
	mc := t.cfg.memoryConfig()
	mc.NumMicrobatches = t.mb.Num()
	r, err := TheoreticalMemory(mc)
	if err != nil {
		return
	}
	if t.progress != nil {
		t.progress.clear()
	}
	r.WriteTo(t.cfg.Out)
}

// paramsNorm is the L2 norm of every parameter, each counted once across
// tensor-parallel ranks (Megatron's calc_params_l2_norm for
// --log-params-norm). Collective under tensor parallelism.
func (t *Trainer) paramsNorm() float64 {
	var counted []*tensor.Tensor
	cp := t.embeddingCopy()
	for _, p := range t.localParams() {
		if (t.region.Rank() != 0 && t.replicated(p.Name)) || p == cp {
			continue
		}
		counted = append(counted, p)
	}
	l, err := tensor.NewTensorList(counted...)
	if err != nil { // parameters are contiguous float32 tensors
		panic(fmt.Sprintf("train: params norm: %v", err))
	}
	sq := tensor.SumSquares(l)
	if err := sumOver(t.cctx, t.par.MP, &sq); err != nil {
		return math.NaN()
	}
	return math.Sqrt(sq)
}
