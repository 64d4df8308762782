package optim

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
)

// near reports whether got is within rel relative (or 1e-300 absolute) of want.
func near(got, want, rel float64) bool {
	if got == want {
		return true
	}
	return math.Abs(got-want) <= rel*math.Max(math.Abs(want), 1e-300)
}

// ulps is the distance between two float64s in units in the last place.
func ulps(a, b float64) uint64 {
	ia, ib := int64(math.Float64bits(a)), int64(math.Float64bits(b))
	if ia < 0 {
		ia = math.MinInt64 - ia
	}
	if ib < 0 {
		ib = math.MinInt64 - ib
	}
	if ia > ib {
		return uint64(ia - ib)
	}
	return uint64(ib - ia)
}

// lrAt builds a scheduler from cfg, steps it to n samples and returns (lr, wd).
func lrAt(t *testing.T, cfg SchedulerConfig, n int64) (float64, float64) {
	t.Helper()
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatalf("NewScheduler(%+v): %v", cfg, err)
	}
	s.Step(n)
	return s.LR(), s.WD()
}

// specBase is the setting of Megatron's reference values: lr0=0, lrM=3e-4,
// lrm=3e-5, W=100, D=1000.
func specBase(style DecayStyle) SchedulerConfig {
	return SchedulerConfig{MaxLR: 3e-4, MinLR: 3e-5, WarmupSteps: 100, DecaySteps: 1000,
		DecayStyle: style, StartWD: 0.01, EndWD: 0.01, WDIncrSteps: 1000}
}

// TestSchedulerSpecReferenceValues checks Megatron's reference values
// (computed by its OptimizerParamScheduler,
// megatron/core/optimizer_param_scheduler.py) to their printed precision.
func TestSchedulerSpecReferenceValues(t *testing.T) {
	wsd := func(s WSDDecayStyle) SchedulerConfig {
		c := specBase(DecayWSD)
		c.WSDDecaySteps, c.WSDDecayStyle = 200, s
		return c
	}
	type pt struct {
		n  int64
		lr float64
	}
	cases := []struct {
		name string
		cfg  SchedulerConfig
		pts  []pt
	}{
		{"linear", specBase(DecayLinear), []pt{{0, 0}, {1, 3e-06}, {50, 1.5e-04}, {100, 3e-04}, {101, 2.997e-04}, {550, 1.65e-04}, {999, 3.03e-05}, {1000, 3e-05}, {1001, 3e-05}}},
		{"cosine", specBase(DecayCosine), []pt{{0, 0}, {1, 3e-06}, {50, 1.5e-04}, {100, 3e-04}, {101, 2.999991775e-04}, {550, 1.65e-04}, {999, 3.000082247e-05}, {1000, 3e-05}, {1001, 3e-05}}},
		{"inverse-square-root", specBase(DecayInverseSquareRoot), []pt{{100, 3e-04}, {101, 2.985111571e-04}, {550, 1.279204298e-04}, {999, 9.491579958e-05}, {1000, 9.486832981e-05}, {1001, 3e-05}}},
		{"constant", specBase(DecayConstant), []pt{{50, 1.5e-04}, {100, 3e-04}, {101, 3e-04}, {1000, 3e-04}, {5000, 3e-04}}},
		{"WSD exponential", wsd(WSDExponential), []pt{{100, 3e-04}, {800, 3e-04}, {801, 2.981317419e-04}, {900, 1.418376618e-04}, {1000, 3e-05}, {1001, 3e-05}}},
		{"WSD minus_sqrt", wsd(WSDMinusSqrt), []pt{{801, 2.809081169e-04}, {900, 1.090811691e-04}}},
	}
	for _, c := range cases {
		for _, p := range c.pts {
			got, _ := lrAt(t, c.cfg, p.n)
			// The reference values have 10 significant digits.
			if !near(got, p.lr, 5e-10) && math.Abs(got-p.lr) > 1e-20 {
				t.Errorf("%s: lr(%d) = %.12g, spec says %.10g", c.name, p.n, got, p.lr)
			}
		}
	}
	wdCfg := specBase(DecayLinear)
	wdCfg.StartWD, wdCfg.EndWD, wdCfg.WDIncrStyle = 0, 0.1, WDCosine
	for _, p := range []pt{{0, 0}, {250, 0.01464466094}, {500, 0.05}, {1000, 0.1}, {1001, 0.1}} {
		_, got := lrAt(t, wdCfg, p.n)
		if !near(got, p.lr, 5e-10) && math.Abs(got-p.lr) > 1e-20 {
			t.Errorf("WD cosine 0→0.1: wd(%d) = %.12g, spec says %.10g", p.n, got, p.lr)
		}
	}
}

// megatronGolden is optim/testdata/megatron_scheduler.json, written by
// tools/golden/optim_sched.py from Megatron's own class.
type megatronGolden struct {
	Decoupled struct {
		MaxLR float64 `json:"max_lr"`
		MinLR float64 `json:"min_lr"`
	} `json:"decoupled_group"`
	Cases []struct {
		Name string `json:"name"`
		Args struct {
			InitLR        float64 `json:"init_lr"`
			MaxLR         float64 `json:"max_lr"`
			MinLR         float64 `json:"min_lr"`
			WarmupSteps   float64 `json:"lr_warmup_steps"`
			DecaySteps    int64   `json:"lr_decay_steps"`
			DecayStyle    string  `json:"lr_decay_style"`
			StartWD       float64 `json:"start_wd"`
			EndWD         float64 `json:"end_wd"`
			WDIncrSteps   int64   `json:"wd_incr_steps"`
			WDIncrStyle   string  `json:"wd_incr_style"`
			WSDDecaySteps *int64  `json:"wsd_decay_steps"`
			WSDStyle      *string `json:"lr_wsd_decay_style"`
		} `json:"args"`
		Points [][4]float64 `json:"points"`
	} `json:"cases"`
}

// TestSchedulerMatchesMegatronClass replays every case Megatron's
// OptimizerParamScheduler produced (all decay styles with integer, zero and
// fractional warmup; each WSD style; each WD style; a decoupled-LR group)
// and requires bit-identical float64 results (cos and pow are evaluated
// correctly rounded, as glibc's are; see ddmath.go).
func TestSchedulerMatchesMegatronClass(t *testing.T) {
	raw, err := os.ReadFile("testdata/megatron_scheduler.json")
	if err != nil {
		t.Fatal(err)
	}
	var g megatronGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 20 {
		t.Fatalf("golden has %d cases, want >= 20", len(g.Cases))
	}
	inexact := 0
	total := 0
	for _, c := range g.Cases {
		a := c.Args
		cfg := SchedulerConfig{InitLR: a.InitLR, MaxLR: a.MaxLR, MinLR: a.MinLR, WarmupSteps: a.WarmupSteps,
			DecaySteps: a.DecaySteps, DecayStyle: DecayStyle(a.DecayStyle), StartWD: a.StartWD, EndWD: a.EndWD,
			WDIncrSteps: a.WDIncrSteps, WDIncrStyle: WDIncrStyle(a.WDIncrStyle)}
		if a.WSDDecaySteps != nil {
			cfg.WSDDecaySteps = *a.WSDDecaySteps
		}
		if a.WSDStyle != nil {
			cfg.WSDDecayStyle = WSDDecayStyle(*a.WSDStyle)
		}
		s, err := NewScheduler(cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		groups := []Group{{Name: "default", WDMult: 1},
			{Name: "decoupled", OverrideLR: true, MaxLR: g.Decoupled.MaxLR, MinLR: g.Decoupled.MinLR}}
		var cur int64
		for _, p := range c.Points {
			n := int64(p[0])
			s.Step(n - cur)
			cur = n
			s.Apply(groups)
			for k, got := range []float64{groups[0].LR, groups[1].LR, groups[0].WD} {
				want := p[k+1]
				total++
				if got != want {
					inexact++
					t.Errorf("%s: n=%d: value %d = %.17g, Megatron %.17g (%d ulps)", c.Name, n, k, got, want, ulps(got, want))
				}
			}
			if groups[1].WD != 0 {
				t.Errorf("%s: n=%d: WDMult 0 group has WD %v", c.Name, n, groups[1].WD)
			}
		}
	}
	t.Logf("%d of %d values bit-identical to Megatron", total-inexact, total)
}

// TestSchedulerFormulas checks each LR and WD rule of Megatron's
// OptimizerParamScheduler at the boundaries, against values derived by hand
// from the formulas.
func TestSchedulerFormulas(t *testing.T) {
	cos := func(r float64) float64 { return 0.5 * (math.Cos(math.Pi*r) + 1) }
	cfg := func(style DecayStyle, mod func(*SchedulerConfig)) SchedulerConfig {
		c := SchedulerConfig{InitLR: 1e-5, MaxLR: 1e-3, MinLR: 1e-4, WarmupSteps: 10, DecaySteps: 110,
			DecayStyle: style, WSDDecaySteps: 40, StartWD: 0.05, EndWD: 0.05, WDIncrSteps: 100}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	wsd := func(s WSDDecayStyle) func(*SchedulerConfig) {
		return func(c *SchedulerConfig) { c.WSDDecayStyle = s }
	}
	cases := []struct {
		rule string
		cfg  SchedulerConfig
		n    int64
		want float64
	}{
		{"warmup starts at lr_warmup_init", cfg(DecayLinear, nil), 0, 1e-5},
		{"warmup is linear from init to max", cfg(DecayLinear, nil), 4, 1e-5 + (1e-3-1e-5)*4/10},
		{"warmup ends at max_lr (n == W)", cfg(DecayCosine, nil), 10, 1e-3},
		{"warmup applies to constant style", cfg(DecayConstant, nil), 5, 1e-5 + (1e-3-1e-5)*5/10},
		{"constant after warmup, even past decay", cfg(DecayConstant, nil), 1000, 1e-3},
		{"linear mid decay", cfg(DecayLinear, nil), 60, 1e-4 + 0.5*(1e-3-1e-4)},
		{"linear at decay end is min_lr", cfg(DecayLinear, nil), 110, 1e-4},
		{"past decay end is min_lr", cfg(DecayLinear, nil), 111, 1e-4},
		{"cosine quarter", cfg(DecayCosine, nil), 35, 1e-4 + cos(0.25)*(1e-3-1e-4)},
		{"cosine mid decay is the midpoint", cfg(DecayCosine, nil), 60, 1e-4 + 0.5*(1e-3-1e-4)},
		{"cosine at decay end", cfg(DecayCosine, nil), 110, 1e-4},
		{"inverse-square-root after warmup", cfg(DecayInverseSquareRoot, nil), 40, 1e-3 * math.Sqrt(10) / math.Sqrt(40)},
		{"inverse-square-root floors at min_lr", cfg(DecayInverseSquareRoot, func(c *SchedulerConfig) { c.MinLR = 5e-4 }), 100, 5e-4},
		{"inverse-square-root jumps to min_lr past decay", cfg(DecayInverseSquareRoot, nil), 111, 1e-4},
		{"inverse-square-root without warmup uses max(W,1)", cfg(DecayInverseSquareRoot, func(c *SchedulerConfig) { c.WarmupSteps = 0 }), 0, 1e-3},
		{"inverse-square-root without warmup at n=4", cfg(DecayInverseSquareRoot, func(c *SchedulerConfig) { c.WarmupSteps = 0 }), 4, 1e-3 / 2},
		{"no warmup: n=0 is max_lr", cfg(DecayLinear, func(c *SchedulerConfig) { c.WarmupSteps = 0 }), 0, 1e-3},
		{"WSD stable phase is max_lr", cfg(DecayWSD, nil), 70, 1e-3},
		{"WSD anneal start (n == D - Dwsd)", cfg(DecayWSD, nil), 70, 1e-3},
		{"WSD exponential mid anneal", cfg(DecayWSD, wsd(WSDExponential)), 90, 1e-4 + (2*math.Pow(0.5, 0.5)-1)*(1e-3-1e-4)},
		{"WSD linear mid anneal", cfg(DecayWSD, wsd(WSDLinear)), 90, 1e-4 + 0.5*(1e-3-1e-4)},
		{"WSD cosine mid anneal", cfg(DecayWSD, wsd(WSDCosine)), 90, 1e-4 + 0.5*(1e-3-1e-4)},
		{"WSD minus_sqrt quarter anneal", cfg(DecayWSD, wsd(WSDMinusSqrt)), 80, 1e-4 + 0.5*(1e-3-1e-4)},
		{"WSD exponential at decay end", cfg(DecayWSD, wsd(WSDExponential)), 110, 1e-4},
		{"WSD linear at decay end", cfg(DecayWSD, wsd(WSDLinear)), 110, 1e-4},
		{"WSD cosine at decay end", cfg(DecayWSD, wsd(WSDCosine)), 110, 1e-4},
		{"WSD minus_sqrt at decay end", cfg(DecayWSD, wsd(WSDMinusSqrt)), 110, 1e-4},
		{"WSD past end is min_lr", cfg(DecayWSD, wsd(WSDMinusSqrt)), 500, 1e-4},
		{"default style is linear", cfg("", nil), 60, 1e-4 + 0.5*(1e-3-1e-4)},
	}
	for _, c := range cases {
		got, _ := lrAt(t, c.cfg, c.n)
		if !near(got, c.want, 1e-14) {
			t.Errorf("%s: lr(%d) = %.17g, want %.17g", c.rule, c.n, got, c.want)
		}
	}

	wdCases := []struct {
		rule       string
		style      WDIncrStyle
		start, end float64
		n          int64
		want       float64
	}{
		{"constant weight decay", WDConstant, 0.1, 0.1, 50, 0.1},
		{"linear weight decay start", WDLinear, 0.0, 0.1, 0, 0},
		{"linear weight decay mid", WDLinear, 0.02, 0.1, 50, 0.06},
		{"linear weight decay end", WDLinear, 0.02, 0.1, 100, 0.1},
		{"weight decay past incr steps is end_wd", WDLinear, 0.02, 0.1, 101, 0.1},
		{"cosine weight decay start", WDCosine, 0.02, 0.1, 0, 0.02},
		{"cosine weight decay mid", WDCosine, 0.02, 0.1, 50, 0.06},
		{"cosine weight decay end", WDCosine, 0.02, 0.1, 100, 0.1},
	}
	for _, c := range wdCases {
		cf := cfg(DecayLinear, nil)
		cf.WDIncrStyle, cf.StartWD, cf.EndWD = c.style, c.start, c.end
		_, got := lrAt(t, cf, c.n)
		if !near(got, c.want, 1e-14) && math.Abs(got-c.want) > 1e-17 {
			t.Errorf("%s: wd(%d) = %.17g, want %.17g", c.rule, c.n, got, c.want)
		}
	}
}

// TestSchedulerApplyGroups checks that Apply multiplies WD by WDMult and
// uses a group's own max/min LR when OverrideLR is set.
func TestSchedulerApplyGroups(t *testing.T) {
	s, err := NewScheduler(SchedulerConfig{MaxLR: 1e-3, MinLR: 0, DecaySteps: 100, StartWD: 0.1, EndWD: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	s.Step(50)
	groups := []Group{{WDMult: 1}, {WDMult: 0}, {WDMult: 0.5, OverrideLR: true, MaxLR: 2e-3, MinLR: 2e-4}}
	s.Apply(groups)
	want := []struct{ lr, wd float64 }{{5e-4, 0.1}, {5e-4, 0}, {2e-4 + 0.5*(2e-3-2e-4), 0.05}}
	for i, w := range want {
		if !near(groups[i].LR, w.lr, 1e-15) || !near(groups[i].WD, w.wd, 1e-15) {
			t.Errorf("group %d: lr %v wd %v, want %v %v", i, groups[i].LR, groups[i].WD, w.lr, w.wd)
		}
	}
}

// TestSchedulerValidate checks Megatron's constructor assertions, each
// error naming the flag.
func TestSchedulerValidate(t *testing.T) {
	ok := SchedulerConfig{MaxLR: 1e-3, MinLR: 1e-4, WarmupSteps: 10, DecaySteps: 100, StartWD: 0.1, EndWD: 0.1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	cases := []struct {
		mod  func(*SchedulerConfig)
		want string
	}{
		{func(c *SchedulerConfig) { c.MinLR = -1 }, "--min-lr"},
		{func(c *SchedulerConfig) { c.MaxLR = 1e-5 }, "--lr 1e-05 is below --min-lr"},
		{func(c *SchedulerConfig) { c.InitLR = 1 }, "--lr-warmup-init"},
		{func(c *SchedulerConfig) { c.DecaySteps = 0 }, "--lr-decay-iters"},
		{func(c *SchedulerConfig) { c.WarmupSteps = 100 }, "must be below lr decay steps"},
		{func(c *SchedulerConfig) { c.StartWD = -0.1 }, "--start-weight-decay"},
		{func(c *SchedulerConfig) { c.StartWD = 0.2 }, "--end-weight-decay 0.1 is below"},
		{func(c *SchedulerConfig) { c.Override, c.UseCheckpoint = true, true }, "both --override-opt_param-scheduler"},
		{func(c *SchedulerConfig) { c.DecayStyle = "WSD" }, "--lr-wsd-decay-iters"},
		{func(c *SchedulerConfig) { c.DecayStyle = "WSD"; c.WSDDecaySteps = 5; c.WSDDecayStyle = "sqrt" }, "--lr-wsd-decay-style"},
		{func(c *SchedulerConfig) { c.DecayStyle = "cosin" }, "--lr-decay-style \"cosin\""},
		{func(c *SchedulerConfig) { c.StartWD = 0 }, "--weight-decay-incr-style constant needs"},
		{func(c *SchedulerConfig) { c.StartWD = 0; c.WDIncrStyle = WDLinear }, "weight decay increment steps"},
		{func(c *SchedulerConfig) { c.WDIncrStyle = "step" }, "--weight-decay-incr-style \"step\""},
		{func(c *SchedulerConfig) { c.MaxLR = math.NaN() }, "--lr NaN"},
	}
	for _, c := range cases {
		cfg := ok
		c.mod(&cfg)
		_, err := NewScheduler(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %+v: error %v, want one containing %q", cfg, err, c.want)
		}
	}
}

// TestSchedulerLoadState checks load_state_dict's three modes: values must
// match by default, --use-checkpoint-opt_param-scheduler takes the
// checkpoint's, --override-opt_param-scheduler keeps the flags'; num_steps is
// always restored.
func TestSchedulerLoadState(t *testing.T) {
	flags := SchedulerConfig{MaxLR: 3e-4, MinLR: 3e-5, WarmupSteps: 100, DecaySteps: 1000, DecayStyle: DecayCosine,
		StartWD: 0.01, EndWD: 0.01, WDIncrSteps: 1000}
	saved, _ := NewScheduler(flags)
	saved.Step(550)
	st := saved.State()
	if st.NumSteps != 550 || st.MaxLR != 3e-4 || st.LRDecayStyle != DecayCosine || st.WDIncrStyle != WDConstant {
		t.Fatalf("State() = %+v", st)
	}

	// Same flags: loads, and continues exactly where it stopped.
	s, _ := NewScheduler(flags)
	if err := s.LoadState(st); err != nil {
		t.Fatalf("matching load: %v", err)
	}
	if s.NumSteps() != 550 || s.LR() != saved.LR() {
		t.Errorf("after load: n=%d lr=%v, want 550 %v", s.NumSteps(), s.LR(), saved.LR())
	}
	// The state round-trips through JSON with Megatron's key names.
	js, _ := json.Marshal(st)
	for _, key := range []string{`"max_lr"`, `"lr_warmup_steps"`, `"num_steps":550`, `"lr_decay_style":"cosine"`, `"wd_incr_steps"`} {
		if !strings.Contains(string(js), key) {
			t.Errorf("state JSON %s lacks %s", js, key)
		}
	}

	changed := flags
	changed.MaxLR, changed.DecaySteps = 6e-4, 2000

	// Default: mismatch is an error naming the field; the scheduler is unchanged.
	s, _ = NewScheduler(changed)
	err := s.LoadState(st)
	if err == nil || !strings.Contains(err.Error(), "max_lr") || !strings.Contains(err.Error(), "--lr") {
		t.Fatalf("mismatched load: err %v, want one naming max_lr and --lr", err)
	}
	if s.NumSteps() != 0 || s.Config().MaxLR != 6e-4 {
		t.Errorf("failed load changed the scheduler: n=%d max=%v", s.NumSteps(), s.Config().MaxLR)
	}

	// --use-checkpoint-opt_param-scheduler: checkpoint values win.
	uc := changed
	uc.UseCheckpoint = true
	s, _ = NewScheduler(uc)
	if err := s.LoadState(st); err != nil {
		t.Fatal(err)
	}
	if s.Config().MaxLR != 3e-4 || s.Config().DecaySteps != 1000 || s.LR() != saved.LR() {
		t.Errorf("use-checkpoint: config %+v lr %v, want checkpoint values and lr %v", s.Config(), s.LR(), saved.LR())
	}

	// --override-opt_param-scheduler: flag values win, num_steps still restored.
	ov := changed
	ov.Override = true
	s, _ = NewScheduler(ov)
	if err := s.LoadState(st); err != nil {
		t.Fatal(err)
	}
	want, _ := lrAt(t, ov, 550)
	if s.Config().MaxLR != 6e-4 || s.NumSteps() != 550 || s.LR() != want {
		t.Errorf("override: max %v n %d lr %v, want 6e-4 550 %v", s.Config().MaxLR, s.NumSteps(), s.LR(), want)
	}

	// Checkpoint values that make an invalid schedule are rejected.
	badSt := st
	badSt.LRWarmupSteps = 5000
	s, _ = NewScheduler(uc)
	if err := s.LoadState(badSt); err == nil {
		t.Error("load of warmup >= decay from checkpoint: no error")
	}
}

// TestSchedulerFlags checks get_optimizer_param_scheduler's conversion of
// iteration- and sample-based flags into sample counts, and arguments.py's
// consistency assertions.
func TestSchedulerFlags(t *testing.T) {
	base := DefaultSchedulerFlags()
	base.LR, base.MinLR = 3e-4, 3e-5
	iters := base
	iters.TrainIters, iters.GlobalBatchSize, iters.LRWarmupIters, iters.LRDecayIters = 500, 8, 20, 400
	samples := base
	samples.TrainSamples, samples.LRWarmupSamples, samples.LRDecaySamples = 4000, 160, 3200

	cases := []struct {
		rule  string
		flags SchedulerFlags
		mod   func(*SchedulerFlags)
		want  SchedulerConfig
	}{
		{"iterations: steps are iters × global batch", iters, nil,
			SchedulerConfig{WarmupSteps: 160, DecaySteps: 3200, WDIncrSteps: 4000}},
		{"iterations: lr-decay-iters defaults to train-iters", iters, func(f *SchedulerFlags) { f.LRDecayIters = 0 },
			SchedulerConfig{WarmupSteps: 160, DecaySteps: 4000, WDIncrSteps: 4000}},
		{"iterations: warmup fraction of decay steps", iters, func(f *SchedulerFlags) { f.LRWarmupIters = 0; f.LRWarmupFraction = 0.01 },
			SchedulerConfig{WarmupSteps: 0.01 * 3200, DecaySteps: 3200, WDIncrSteps: 4000}},
		{"iterations: WSD anneal in iters × global batch", iters, func(f *SchedulerFlags) { f.LRDecayStyle = DecayWSD; f.LRWSDDecayIters = 50 },
			SchedulerConfig{WarmupSteps: 160, DecaySteps: 3200, WDIncrSteps: 4000, WSDDecaySteps: 400}},
		{"samples: steps are samples", samples, nil,
			SchedulerConfig{WarmupSteps: 160, DecaySteps: 3200, WDIncrSteps: 4000}},
		{"samples: lr-decay-samples defaults to train-samples", samples, func(f *SchedulerFlags) { f.LRDecaySamples = 0 },
			SchedulerConfig{WarmupSteps: 160, DecaySteps: 4000, WDIncrSteps: 4000}},
		{"samples: warmup fraction", samples, func(f *SchedulerFlags) { f.LRWarmupSamples = 0; f.LRWarmupFraction = 0.0375 },
			SchedulerConfig{WarmupSteps: 0.0375 * 3200, DecaySteps: 3200, WDIncrSteps: 4000}},
	}
	for _, c := range cases {
		f := c.flags
		if c.mod != nil {
			c.mod(&f)
		}
		got, err := f.Config()
		if err != nil {
			t.Errorf("%s: %v", c.rule, err)
			continue
		}
		if got.WarmupSteps != c.want.WarmupSteps || got.DecaySteps != c.want.DecaySteps ||
			got.WDIncrSteps != c.want.WDIncrSteps || got.WSDDecaySteps != c.want.WSDDecaySteps {
			t.Errorf("%s: got warmup %v decay %d wdincr %d wsd %d, want %+v", c.rule,
				got.WarmupSteps, got.DecaySteps, got.WDIncrSteps, got.WSDDecaySteps, c.want)
		}
		if got.MaxLR != 3e-4 || got.MinLR != 3e-5 || got.StartWD != 0.01 || got.EndWD != 0.01 || (f.LRDecayStyle == DecayLinear) != (got.DecayStyle == DecayLinear) {
			t.Errorf("%s: lr/wd fields not carried: %+v", c.rule, got)
		}
	}

	errCases := []struct {
		flags SchedulerFlags
		mod   func(*SchedulerFlags)
		want  string
	}{
		{base, nil, "either --train-iters or --train-samples"},
		{iters, func(f *SchedulerFlags) { f.TrainSamples = 10 }, "both set"},
		{iters, func(f *SchedulerFlags) { f.LRDecaySamples = 10 }, "expected iteration-based learning rate decay"},
		{iters, func(f *SchedulerFlags) { f.LRWarmupSamples = 10 }, "expected iteration-based learning rate warmup"},
		{iters, func(f *SchedulerFlags) { f.LRWarmupFraction = 0.1 }, "one of --lr-warmup-fraction and --lr-warmup-iters"},
		{iters, func(f *SchedulerFlags) { f.GlobalBatchSize = 0 }, "--global-batch-size"},
		{samples, func(f *SchedulerFlags) { f.LRDecayIters = 10 }, "expected sample-based learning rate decay"},
		{samples, func(f *SchedulerFlags) { f.LRWarmupIters = 10 }, "expected sample-based learning rate warmup"},
		{samples, func(f *SchedulerFlags) { f.LRWarmupFraction = 0.1 }, "one of --lr-warmup-fraction and --lr-warmup-samples"},
		{samples, func(f *SchedulerFlags) { f.StartWeightDecay = 0.1 }, "--start-weight-decay/--end-weight-decay need"},
		{samples, func(f *SchedulerFlags) {
			f.WeightDecayIncrStyle = WDLinear
			f.StartWeightDecay = 0.2
			f.EndWeightDecay = 0.1
		}, "--end-weight-decay 0.1 is below"},
		{samples, func(f *SchedulerFlags) { f.LRWarmupSamples = 3200 }, "must be below lr decay steps"},
		{samples, func(f *SchedulerFlags) { f.LRDecayStyle = DecayWSD }, "--lr-wsd-decay-iters or --lr-wsd-decay-samples"},
	}
	for _, c := range errCases {
		f := c.flags
		if c.mod != nil {
			c.mod(&f)
		}
		_, err := f.Config()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("flags %+v: error %v, want one containing %q", f, err, c.want)
		}
	}
}

// TestCorrectlyRoundedCosPow checks the double-double cos and 0.5**r against
// math.Cos / math.Pow (which are within ~1 ulp) on a grid, and exact points.
func TestCorrectlyRoundedCosPow(t *testing.T) {
	for i := 0; i <= 4000; i++ {
		x := math.Pi * float64(i) / 4000
		if d := ulps(crCos(x), math.Cos(x)); d > 1 && math.Abs(math.Cos(x)) > 1e-3 {
			t.Errorf("crCos(%v) = %v, math.Cos %v (%d ulps)", x, crCos(x), math.Cos(x), d)
		}
		r := float64(i) / 4000
		if d := ulps(crPowHalf(r), math.Pow(0.5, r)); d > 1 {
			t.Errorf("crPowHalf(%v) = %v, math.Pow %v (%d ulps)", r, crPowHalf(r), math.Pow(0.5, r), d)
		}
	}
	for _, c := range []struct{ got, want float64 }{
		{crCos(0), 1}, {crCos(math.Pi), -1}, {crCos(-math.Pi), -1}, {crCos(1.0471975511965976), 0.5000000000000001},
		{crPowHalf(0), 1}, {crPowHalf(1), 0.5}, {crPowHalf(0.5), math.Sqrt(0.5)}, {crCos(100), math.Cos(100)},
	} {
		if c.got != c.want {
			t.Errorf("got %.17g, want %.17g", c.got, c.want)
		}
	}
}
