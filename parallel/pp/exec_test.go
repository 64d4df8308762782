package pp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/tensor"
)

// The toy model: virtual stage s is y = gelu(x·W_sᵀ) on (b, h) activations;
// the first stage reads micro-batch mb's input, the last returns mean(y²).
// Every stage has the same shapes, so any split runs it.
type toyModel struct {
	b, h, stages, m int
	xs              []*tensor.Tensor // per micro-batch input (b, h)
}

func newToy(stages, m int) *toyModel {
	t := &toyModel{b: 2, h: 8, stages: stages, m: m}
	rng := tensor.NewRNG(7)
	for i := range m {
		x := tensor.Zeros(t.b, t.h)
		rng.Fork(fmt.Sprint("x", i)).Normal(x.Float32s(), 0, 1)
		t.xs = append(t.xs, x)
	}
	return t
}

// weights returns fresh parameters of every virtual stage (the same values
// on every call).
func (t *toyModel) weights() []*tensor.Tensor {
	rng := tensor.NewRNG(11)
	var ws []*tensor.Tensor
	for s := range t.stages {
		w := tensor.Param(fmt.Sprint("w", s), t.h, t.h)
		rng.Fork(w.Name).Normal(w.Float32s(), 0, 0.5)
		ws = append(ws, w)
	}
	return ws
}

func (t *toyModel) stage(tp *tensor.Tape, s int, w, in *tensor.Tensor, mb int) *tensor.Tensor {
	if s == 0 {
		in = t.xs[mb]
	}
	y := tp.GELU(tp.Linear(in, w, nil), tensor.GELUTanh)
	if s == t.stages-1 {
		return tp.Mean(tp.Mul(y, y))
	}
	return y
}

// reference runs the whole model in one process: forward, loss/M, backward
// per micro-batch (gradient accumulation). It returns the mean loss.
func (t *toyModel) reference(ws []*tensor.Tensor) float64 {
	tp := tensor.NewTape()
	var sum float64
	for mb := range t.m {
		var x *tensor.Tensor
		for s, w := range ws {
			x = t.stage(tp, s, w, x, mb)
		}
		sum += float64(x.Float32s()[0])
		if err := tp.Backward(tp.Scale(x, 1/float32(t.m))); err != nil {
			panic(err)
		}
		tp.Reset()
	}
	return sum / float64(t.m)
}

// toyStage is one virtual stage of toyModel as a pp.Stage.
type toyStage struct {
	t     *toyModel
	s     int
	w     *tensor.Tensor
	shape []int              // InputShape; nil means (b, h)
	fail  func(mb int) error // optional error from Forward
	onFwd func(mb int)       // optional observer of forwards
	// hook, if set, is applied to the output: a tape function (as a
	// tensor-parallel collective) that may block or fail.
	hook func(mb int) tensor.Function
}

func (st *toyStage) Forward(tp *tensor.Tape, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if st.onFwd != nil {
		st.onFwd(mb)
	}
	if st.fail != nil {
		if err := st.fail(mb); err != nil {
			return nil, err
		}
	}
	out := st.t.stage(tp, st.s, st.w, in, mb)
	if st.hook != nil {
		if f := st.hook(mb); f != nil {
			out = tp.Apply(f, out)[0]
		}
	}
	return out, nil
}

// tapeFunc is an identity tape function whose passes call fwd and bwd with
// their tape.
type tapeFunc struct{ fwd, bwd func(tp *tensor.Tape) }

func (f tapeFunc) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	if f.fwd != nil {
		f.fwd(tp)
	}
	return []*tensor.Tensor{tp.Scale(in[0], 1)}
}

func (f tapeFunc) Backward(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
	if f.bwd != nil {
		f.bwd(tp)
	}
	return []*tensor.Tensor{g[0]}
}

func (st *toyStage) InputShape(int) []int {
	if st.shape != nil {
		return st.shape
	}
	return []int{st.t.b, st.t.h}
}

// rankStages builds rank's toy stages: chunk c is virtual stage c·PP + rank.
func rankStages(t *toyModel, cfg Config, rank int, ws []*tensor.Tensor) ([]Stage, []*toyStage) {
	c := cfg.withDefaults()
	var out []Stage
	var toys []*toyStage
	for ch := range c.VPP {
		s := ch*c.PP + rank
		st := &toyStage{t: t, s: s, w: ws[s]}
		out = append(out, st)
		toys = append(toys, st)
	}
	return out, toys
}

// runRanks runs fn on n inproc ranks; the first error cancels the others'
// context, so a failing rank never leaves its peers waiting.
func runRanks(t *testing.T, n int, fn func(ctx context.Context, pg comm.ProcessGroup) error) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := inproc.New(inproc.Config{Size: n, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = fn(ctx, w.Group(r)); errs[r] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	return errs
}

// pipelineToy runs one step of cfg on toy stages over inproc ranks and
// returns the last rank's loss, every virtual stage's weight (gradients
// set) and each rank's stats.
func pipelineToy(t *testing.T, tm *toyModel, cfg Config, unbatched bool) (float64, []*tensor.Tensor, []Stats, error) {
	c := cfg.withDefaults()
	ws := tm.weights()
	var loss float64
	stats := make([]Stats, c.PP)
	errs := runRanks(t, c.PP, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, _ := rankStages(tm, cfg, pg.Rank(), ws)
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages, Unbatched: unbatched})
		if err != nil {
			return err
		}
		l, err := e.Step(ctx)
		if err != nil {
			return err
		}
		stats[pg.Rank()] = e.Stats()
		if e.HasLoss() {
			loss = l
		}
		return nil
	})
	return loss, ws, stats, errors.Join(errs...)
}

func sameGrads(t *testing.T, what string, got, want []*tensor.Tensor) {
	t.Helper()
	for i := range want {
		g, w := got[i].Grad.Float32s(), want[i].Grad.Float32s()
		for j := range w {
			if g[j] != w[j] {
				t.Errorf("%s: %s.grad[%d] = %v, one process %v", what, want[i].Name, j, g[j], w[j])
				break
			}
		}
	}
}

// Every valid schedule up to PP = 4, VPP = 3, M = 8 (every group size),
// batched and one transfer at a time, computes exactly the one-process
// loss and gradients, and holds at most Megatron's in-flight bound.
func TestExecutorMatchesOneProcess(t *testing.T) {
	n := 0
	for _, cfg := range validConfigs(4, 3, 8) {
		c := cfg.withDefaults()
		tm := newToy(c.PP*c.VPP, c.Microbatches)
		ref := tm.weights()
		want := tm.reference(ref)
		for _, unbatched := range []bool{false, true} {
			what := fmt.Sprintf("%+v unbatched=%v", cfg, unbatched)
			loss, ws, stats, err := pipelineToy(t, tm, cfg, unbatched)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if loss != want {
				t.Errorf("%s: loss %v, one process %v", what, loss, want)
			}
			sameGrads(t, what, ws, ref)
			for r, st := range stats {
				if bound, _ := MaxInFlight(cfg, r); st.PeakInFlight != bound {
					t.Errorf("%s rank %d: %d micro-batches in flight, Megatron's bound is %d", what, r, st.PeakInFlight, bound)
				}
			}
		}
		n++
	}
	if n < 150 {
		t.Errorf("only %d configurations", n)
	}
}

// The caller hears of each chunk's last backward just before it runs:
// once per chunk, after every forward the list puts before it.
func TestExecutorLastBackwardHook(t *testing.T) {
	cfg := Config{PP: 2, VPP: 2, Microbatches: 4}
	tm := newToy(4, 4)
	ws := tm.weights()
	errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
		forwards := 0
		for _, st := range toys {
			st.onFwd = func(int) { forwards++ }
		}
		list, _ := Actions(cfg, pg.Rank())
		var calls []string
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages, LastBackward: func(chunk int) {
			calls = append(calls, fmt.Sprintf("c%d after %d forwards", chunk, forwards))
		}})
		if err != nil {
			return err
		}
		if _, err := e.Step(ctx); err != nil {
			return err
		}
		// Expected: in list order of the chunks' last backwards, each with
		// the forwards before it.
		var want []string
		fwd := 0
		for i, a := range list {
			switch {
			case a.Op == Forward:
				fwd++
			case a.Op == Backward && !slices.ContainsFunc(list[i+1:], func(b Action) bool { return b.Op == Backward && b.Chunk == a.Chunk }):
				want = append(want, fmt.Sprintf("c%d after %d forwards", a.Chunk, fwd))
			}
		}
		if fmt.Sprint(calls) != fmt.Sprint(want) || len(want) != 2 {
			return fmt.Errorf("hook calls %v, want %v", calls, want)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// A stage expecting another activation shape stops at the first exchange,
// naming both shapes, whether the element counts differ (the transport
// fails the sender too) or not (the sender fails when its peer stops).
func TestExecutorShapeMismatch(t *testing.T) {
	for _, expect := range [][]int{{2, 9}, {4, 4}} {
		for _, unbatched := range []bool{false, true} {
			cfg := Config{PP: 2, Microbatches: 2}
			tm := newToy(2, 2)
			ws := tm.weights()
			errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
				stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
				if pg.Rank() == 1 {
					toys[0].shape = expect
				}
				e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages, Unbatched: unbatched})
				if err != nil {
					return err
				}
				_, err = e.Step(ctx)
				return err
			})
			want := fmt.Sprintf("recv-act c0 m0 from 0: the activation has shape [2 8] but chunk 0 expects %v", expect)
			if errs[1] == nil || !strings.Contains(errs[1].Error(), want) {
				t.Errorf("%v unbatched=%v: rank 1: %v, want an error saying %q", expect, unbatched, errs[1], want)
			}
			if errs[0] == nil {
				t.Errorf("%v unbatched=%v: rank 0 finished a step its peer abandoned", expect, unbatched)
			}
		}
	}
}

// A stage's error ends the step with the action named.
func TestExecutorStageError(t *testing.T) {
	cfg := Config{PP: 2, Microbatches: 3}
	tm := newToy(2, 3)
	ws := tm.weights()
	errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
		if pg.Rank() == 1 {
			toys[0].fail = func(mb int) error {
				if mb == 1 {
					return errors.New("tp: all_reduce: peer lost")
				}
				return nil
			}
		}
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages})
		if err != nil {
			return err
		}
		_, err = e.Step(ctx)
		return err
	})
	if want := "pp: rank 1: F c0 m1: tp: all_reduce: peer lost"; errs[1] == nil || !strings.Contains(errs[1].Error(), want) {
		t.Errorf("rank 1: %v, want %q", errs[1], want)
	}
}

// A failure a stage's tape function records on its tape (as a
// tensor-parallel collective does) ends the step with the action named,
// whether in the forward or the backward pass; the tapes start the next
// step without it.
func TestExecutorTapeFailure(t *testing.T) {
	cfg := Config{PP: 2, Microbatches: 3}
	for _, c := range []struct {
		backward bool
		want     string
	}{
		{false, "pp: rank 1: F c0 m1: tp: rank 0: all_reduce: peer lost"},
		{true, "pp: rank 1: B c0 m1: tp: rank 0: all_reduce: peer lost"},
	} {
		tm := newToy(2, 3)
		ws := tm.weights()
		lost := errors.New("tp: rank 0: all_reduce: peer lost")
		var second error // rank 1's tapes after the step
		errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
			if pg.Rank() == 1 {
				toys[0].hook = func(mb int) tensor.Function {
					if mb != 1 {
						return nil
					}
					f := func(tp *tensor.Tape) { tp.Fail(lost) }
					if c.backward {
						return tapeFunc{bwd: f}
					}
					return tapeFunc{fwd: f}
				}
			}
			e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages})
			if err != nil {
				return err
			}
			_, err = e.Step(ctx)
			if pg.Rank() == 1 {
				// The abandoned step's tapes went back reset.
				for _, tp := range e.free[0] {
					if tp.Err() != nil {
						second = fmt.Errorf("a free tape keeps the failure %v", tp.Err())
					}
				}
			}
			return err
		})
		if errs[1] == nil || !strings.Contains(errs[1].Error(), c.want) || !errors.Is(errs[1], lost) {
			t.Errorf("backward=%v: rank 1: %v, want %q", c.backward, errs[1], c.want)
		}
		if second != nil {
			t.Errorf("backward=%v: rank 1: %v", c.backward, second)
		}
	}
}

// Canceling Step's context stops a step blocked in a stage's tape
// function: the tapes carry Step's context, and the blocked function
// records its error.
func TestExecutorTapeContextCanceled(t *testing.T) {
	cfg := Config{PP: 2, Microbatches: 3}
	tm := newToy(2, 3)
	ws := tm.weights()
	errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if pg.Rank() == 1 {
			toys[0].hook = func(mb int) tensor.Function {
				if mb != 1 {
					return nil
				}
				return tapeFunc{fwd: func(tp *tensor.Tape) {
					go func() { time.Sleep(10 * time.Millisecond); cancel() }()
					select {
					case <-tp.Context().Done():
						tp.Fail(fmt.Errorf("tp: all_reduce: %w", tp.Context().Err()))
					case <-time.After(10 * time.Second):
						tp.Fail(errors.New("the tape does not carry Step's context"))
					}
				}}
			}
		}
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages})
		if err != nil {
			return err
		}
		_, err = e.Step(ctx)
		return err
	})
	if want := "pp: rank 1: F c0 m1: tp: all_reduce: context canceled"; errs[1] == nil || !strings.Contains(errs[1].Error(), want) || !errors.Is(errs[1], context.Canceled) {
		t.Errorf("rank 1: %v, want %q", errs[1], want)
	}
}

// Tapes are reused across steps: the second step makes none, and two
// steps accumulate the gradients of two one-process steps.
func TestExecutorReusesTapes(t *testing.T) {
	cfg := Config{PP: 2, VPP: 2, Microbatches: 4}
	tm := newToy(4, 4)
	ref := tm.weights()
	tm.reference(ref)
	tm.reference(ref)
	ws := tm.weights()
	errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, _ := rankStages(tm, cfg, pg.Rank(), ws)
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages})
		if err != nil {
			return err
		}
		if _, err := e.Step(ctx); err != nil {
			return err
		}
		made := e.Stats().Tapes
		if _, err := e.Step(ctx); err != nil {
			return err
		}
		if got := e.Stats().Tapes; got != made {
			return fmt.Errorf("second step made %d more tapes", got-made)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	sameGrads(t, "two steps", ws, ref)
}

func TestNewExecutorRefuses(t *testing.T) {
	tm := newToy(2, 2)
	stages, _ := rankStages(tm, Config{Microbatches: 2}, 0, tm.weights())
	for _, c := range []struct {
		cfg  ExecConfig
		want string
	}{
		{ExecConfig{Schedule: Config{PP: 2, Microbatches: 2}, Stages: stages}, "needs a pipeline group"},
		{ExecConfig{Schedule: Config{Microbatches: 2}, Stages: append(stages, stages...)}, "2 stages for 1 model chunks"},
		{ExecConfig{Schedule: Config{Microbatches: 0}, Stages: stages}, "--num-microbatches 0"},
		{ExecConfig{Schedule: Config{Microbatches: 2}, Stages: stages, Actions: []Action{{Op: Forward, Microbatch: 5}}}, "outside 1 chunks and 2 micro-batches"},
	} {
		if _, err := NewExecutor(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg.Schedule, err, c.want)
		}
	}
}

// The same step over loopback TCP (goroutine ranks, each with its own
// Join), interleaved so that both ring directions are used.
func TestExecutorOverTCP(t *testing.T) {
	cfg := Config{PP: 2, VPP: 2, Microbatches: 4}
	tm := newToy(4, 4)
	ref := tm.weights()
	want := tm.reference(ref)
	ws := tm.weights()
	port := freeTCPPort(t)
	var loss float64
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				ctx := t.Context()
				g, err := tcp.Join(ctx, tcp.Config{Rank: r, WorldSize: 2, MasterPort: port, Timeout: 20 * time.Second})
				if err != nil {
					return err
				}
				defer g.Close()
				stages, _ := rankStages(tm, cfg, r, ws)
				e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: g, Stages: stages})
				if err != nil {
					return err
				}
				l, err := e.Step(ctx)
				if e.HasLoss() {
					loss = l
				}
				return err
			}()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if loss != want {
		t.Errorf("loss %v, one process %v", loss, want)
	}
	sameGrads(t, "tcp", ws, ref)
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestP2PTimerName: an exchange is named as Megatron's p2p_communication
// times the call that does it.
func TestP2PTimerName(t *testing.T) {
	for _, c := range []struct {
		ops  []Op
		want string
	}{
		{[]Op{RecvActivation}, "forward-recv"},
		{[]Op{SendActivation}, "forward-send"},
		{[]Op{RecvGrad}, "backward-recv"},
		{[]Op{SendGrad}, "backward-send"},
		{[]Op{SendActivation, RecvGrad}, "forward-send-backward-recv"},
		{[]Op{RecvActivation, SendGrad}, "backward-send-forward-recv"},
		{[]Op{SendActivation, RecvActivation}, "forward-send-forward-recv"},
		{[]Op{SendGrad, RecvGrad}, "backward-send-backward-recv"},
		{[]Op{RecvGrad, SendGrad, RecvActivation, SendActivation}, "forward-backward-send-forward-backward-recv"},
		{[]Op{SendActivation, SendGrad}, "forward-backward-send"},
	} {
		var run []Action
		for _, op := range c.ops {
			run = append(run, Action{Op: op})
		}
		if got := P2PTimerName(run); got != c.want {
			t.Errorf("%v: %q, want %q", c.ops, got, c.want)
		}
	}
}

// With ExecConfig.LossWeight (Megatron's --calculate-per-token-loss: each
// micro-batch weighs its token count, not 1/M) every schedule seeds each
// micro-batch's backward with its weight and returns Σ w·loss: the
// gradients equal one process's Σ_mb w_mb·∇loss_mb, bit for bit, and
// MicrobatchLosses holds each micro-batch's loss on the last rank.
func TestExecutorLossWeight(t *testing.T) {
	weight := func(mb int) float32 { return float32(3 + 2*mb) }
	for _, cfg := range []Config{{PP: 2, Microbatches: 4}, {PP: 2, VPP: 2, Microbatches: 4}, {PP: 4, Microbatches: 5}} {
		c := cfg.withDefaults()
		tm := newToy(c.PP*c.VPP, c.Microbatches)
		ref := tm.weights()
		tp := tensor.NewTape()
		var want float64
		wantLosses := make([]float64, c.Microbatches)
		for mb := range c.Microbatches {
			var x *tensor.Tensor
			for s, w := range ref {
				x = tm.stage(tp, s, w, x, mb)
			}
			wantLosses[mb] = float64(x.Float32s()[0])
			want += float64(weight(mb)) * wantLosses[mb]
			if err := tp.Backward(tp.Scale(x, weight(mb))); err != nil {
				t.Fatal(err)
			}
			tp.Reset()
		}
		ws := tm.weights()
		var loss float64
		var losses []float64
		errs := runRanks(t, c.PP, func(ctx context.Context, pg comm.ProcessGroup) error {
			stages, _ := rankStages(tm, cfg, pg.Rank(), ws)
			e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: pg, Stages: stages, LossWeight: weight})
			if err != nil {
				return err
			}
			l, err := e.Step(ctx)
			if err != nil {
				return err
			}
			if e.HasLoss() {
				loss, losses = l, slices.Clone(e.MicrobatchLosses())
			} else if e.MicrobatchLosses() != nil {
				return fmt.Errorf("rank %d holds no loss but returns micro-batch losses", pg.Rank())
			}
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		if loss != want || !slices.Equal(losses, wantLosses) {
			t.Errorf("%+v: objective %v and losses %v, one process %v and %v", cfg, loss, losses, want, wantLosses)
		}
		sameGrads(t, fmt.Sprintf("%+v weighted", cfg), ws, ref)
	}
}
