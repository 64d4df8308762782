package optim

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestMicrobatchesConstant checks ConstantNumMicroBatchesCalculator:
// M = GBS/(mbs·DP), and --decrease-batch-size-if-needed rounding (the example
// of Megatron's test_num_microbatches_calculator.py: GBS 32, mbs 8, DP 3 →
// M 1, running 24).
func TestMicrobatchesConstant(t *testing.T) {
	cases := []struct {
		rule                  string
		cfg                   MicrobatchConfig
		num, current, running int
	}{
		{"M = GBS/(mbs·DP)", MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2}, 16, 128, 128},
		{"M = 1 when GBS = mbs·DP", MicrobatchConfig{GlobalBatchSize: 8, MicroBatchSize: 4, DataParallelSize: 2}, 1, 8, 8},
		{"decrease_batch_size_if_needed rounds running GBS down", MicrobatchConfig{GlobalBatchSize: 32, MicroBatchSize: 8, DataParallelSize: 3, DecreaseBatchSizeIfNeeded: true}, 1, 32, 24},
		{"decrease_batch_size_if_needed is a no-op when divisible", MicrobatchConfig{GlobalBatchSize: 48, MicroBatchSize: 8, DataParallelSize: 3, DecreaseBatchSizeIfNeeded: true}, 2, 48, 48},
	}
	for _, c := range cases {
		m, err := NewMicrobatches(c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		for _, consumed := range []int64{0, 1000, 1 << 40} {
			if err := m.UpdateChecked(consumed); err != nil {
				t.Errorf("%s: UpdateChecked(%d): %v", c.rule, consumed, err)
			}
			if m.Num() != c.num || m.CurrentGlobalBatchSize() != c.current || m.CurrentRunningGlobalBatchSize() != c.running {
				t.Errorf("%s: at %d: M=%d GBS=%d running=%d, want %d %d %d", c.rule, consumed,
					m.Num(), m.CurrentGlobalBatchSize(), m.CurrentRunningGlobalBatchSize(), c.num, c.current, c.running)
			}
		}
		if m.NumMicroBatches(5) != c.num || m.MicroBatchSize() != c.cfg.MicroBatchSize {
			t.Errorf("%s: NumMicroBatches/MicroBatchSize disagree", c.rule)
		}
	}
}

// TestMicrobatchesRampupReferenceRun replays a reference run of Megatron's
// RampupBatchsizeNumMicroBatchesCalculator (core_v0.17.0's
// megatron/core/num_microbatches_calculator.py; START 32, INCR 32, RAMP
// 1000, GBS 128, mbs 4, DP 2), stepping consumed samples by the current
// global batch as the training loop does.
func TestMicrobatchesRampupReferenceRun(t *testing.T) {
	m, err := NewMicrobatches(MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2,
		RampupBatchSize: []int{32, 32, 1000}})
	if err != nil {
		t.Fatal(err)
	}
	// iteration → (consumed, GBS, M) from Megatron's reference run.
	want := map[int][3]int{0: {0, 32, 4}, 10: {320, 32, 4}, 11: {352, 64, 8}, 15: {608, 64, 8},
		16: {672, 96, 12}, 19: {960, 96, 12}, 20: {1056, 128, 16}, 30: {2336, 128, 16}}
	var consumed int64
	for it := 0; it <= 30; it++ {
		if err := m.UpdateChecked(consumed); err != nil {
			t.Fatalf("iteration %d: %v", it, err)
		}
		if w, ok := want[it]; ok {
			if int(consumed) != w[0] || m.CurrentGlobalBatchSize() != w[1] || m.Num() != w[2] {
				t.Errorf("iteration %d: consumed %d GBS %d M %d, spec says %v", it, consumed, m.CurrentGlobalBatchSize(), m.Num(), w)
			}
		}
		consumed += int64(m.CurrentGlobalBatchSize())
	}
	// update_train_iters (core_v0.17): 20 ramp iterations reach 1056 samples,
	// then (3000-1056)//128 = 15 more.
	if got := m.TrainIters(3000); got != 35 {
		t.Errorf("TrainIters(3000) = %d, want 35", got)
	}
	if m.CurrentGlobalBatchSize() != 32 {
		t.Errorf("TrainIters did not reset the calculator to 0 samples: GBS %d", m.CurrentGlobalBatchSize())
	}
	// Ramp boundary: consumed == RAMP is still ramping (int(1000/333.3) = 3 → 128),
	// consumed > RAMP is the final size.
	m.Update(999)
	if m.CurrentGlobalBatchSize() != 96 {
		t.Errorf("at 999: GBS %d, want 96", m.CurrentGlobalBatchSize())
	}
	m.Update(1000)
	if m.CurrentGlobalBatchSize() != 128 {
		t.Errorf("at 1000: GBS %d, want 128", m.CurrentGlobalBatchSize())
	}
}

// TestMicrobatchesRampupDecrease checks that with a ramp-up the consistency
// check fails on an indivisible batch, and --decrease-batch-size-if-needed
// rounds it down instead.
func TestMicrobatchesRampupDecrease(t *testing.T) {
	cfg := MicrobatchConfig{GlobalBatchSize: 64, MicroBatchSize: 4, DataParallelSize: 4, RampupBatchSize: []int{24, 8, 500}}
	m, err := NewMicrobatches(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.UpdateChecked(0); err == nil || !strings.Contains(err.Error(), "(24) is not divisible by micro batch size (4) times data parallel size (4)") {
		t.Errorf("UpdateChecked(0) = %v, want divisibility error", err)
	}
	cfg.DecreaseBatchSizeIfNeeded = true
	m, _ = NewMicrobatches(cfg)
	if err := m.UpdateChecked(0); err != nil || m.CurrentGlobalBatchSize() != 24 || m.CurrentRunningGlobalBatchSize() != 16 || m.Num() != 1 {
		t.Errorf("decrease: err %v GBS %d running %d M %d, want 24 16 1", err, m.CurrentGlobalBatchSize(), m.CurrentRunningGlobalBatchSize(), m.Num())
	}
}

// TestMicrobatchesStepSchedule checks StepBatchsizeNumMicroBatchesCalculator:
// GBS is the last entry whose threshold <= consumed samples; token
// thresholds divide by seq_length; update_train_iters simulates to
// train_samples.
func TestMicrobatchesStepSchedule(t *testing.T) {
	m, err := NewMicrobatches(MicrobatchConfig{MicroBatchSize: 4, DataParallelSize: 8,
		StepBatchSizeSchedule: "0:768 250B:1536 500B:3072 750B:6144", SeqLength: 4096})
	if err != nil {
		t.Fatal(err)
	}
	// 250e9 tokens // 4096 = 61035156 samples.
	for _, c := range []struct {
		consumed int64
		gbs, num int
	}{{0, 768, 24}, {61035155, 768, 24}, {61035156, 1536, 48}, {122070312, 3072, 96}, {183105468, 6144, 192}, {1 << 50, 6144, 192}} {
		if err := m.UpdateChecked(c.consumed); err != nil {
			t.Fatal(err)
		}
		if m.CurrentGlobalBatchSize() != c.gbs || m.Num() != c.num {
			t.Errorf("at %d samples: GBS %d M %d, want %d %d", c.consumed, m.CurrentGlobalBatchSize(), m.Num(), c.gbs, c.num)
		}
	}

	m, err = NewMicrobatches(MicrobatchConfig{MicroBatchSize: 4, DataParallelSize: 8, StepBatchSizeSchedule: "100:64, 0:32"})
	if err != nil {
		t.Fatal(err)
	}
	// 0,32,64,96 at 32 (→128 ≥ 100), then 128,192,256 at 64 (→320 ≥ 300).
	if got := m.TrainIters(300); got != 7 {
		t.Errorf("TrainIters(300) = %d, want 7", got)
	}
	// Consistency check on a size not divisible by mbs·DP.
	m, _ = NewMicrobatches(MicrobatchConfig{MicroBatchSize: 4, DataParallelSize: 8, StepBatchSizeSchedule: "0:32 10:48"})
	if err := m.UpdateChecked(10); err == nil || !strings.Contains(err.Error(), "(48) is not divisible") {
		t.Errorf("UpdateChecked(10) = %v, want divisibility error", err)
	}
}

// TestParseBatchSchedule checks _parse_schedule / _validate_schedule.
func TestParseBatchSchedule(t *testing.T) {
	got, err := ParseBatchSchedule(" 1.5k:16,0:8  2M:32 ", 0)
	want := []BatchStep{{0, 8}, {1500, 16}, {2000000, 32}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parse = %v, %v; want %v", got, err, want)
	}
	got, err = ParseBatchSchedule("0:8 1T:16", 1000)
	if err != nil || !reflect.DeepEqual(got, []BatchStep{{0, 8}, {1_000_000_000, 16}}) {
		t.Errorf("token thresholds = %v, %v", got, err)
	}
	for _, c := range []struct{ in, want string }{
		{"", "at least one entry"},
		{"0-8", "expected format THRESHOLD:BATCH_SIZE"},
		{"10:8 20:16", "first schedule entry must have threshold 0, got 10"},
		{"0:8 0:16", "strictly increasing"},
		{"0:8 5:0", "batch size must be positive"},
		{"0:x", "batch size"},
		{"1Q:8", "threshold"},
		{"0:8 9e9T:16", "out of range"},
	} {
		_, err := ParseBatchSchedule(c.in, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--step-batch-size-schedule") {
			t.Errorf("ParseBatchSchedule(%q) error %v, want one containing %q", c.in, err, c.want)
		}
	}
	// With seq_length, two token thresholds can collapse to one sample count.
	if _, err := ParseBatchSchedule("0:8 100:16", 1000); err == nil {
		t.Error("thresholds 0 and 100 tokens at seq 1000 (both 0 samples): no error")
	}
}

// TestMicrobatchesErrors checks the constructors' assertions and messages.
func TestMicrobatchesErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  MicrobatchConfig
		want string
	}{
		{MicrobatchConfig{GlobalBatchSize: 30, MicroBatchSize: 4, DataParallelSize: 2}, "global batch size (30) is not divisible by micro batch size (4) times data parallel size (2)"},
		{MicrobatchConfig{GlobalBatchSize: 16, MicroBatchSize: 8, DataParallelSize: 3, DecreaseBatchSizeIfNeeded: true}, "number of microbatches should be at least 1"},
		{MicrobatchConfig{GlobalBatchSize: 8, MicroBatchSize: 0, DataParallelSize: 1}, "--micro-batch-size 0"},
		{MicrobatchConfig{GlobalBatchSize: 8, MicroBatchSize: 1, DataParallelSize: 0}, "data-parallel size 0"},
		{MicrobatchConfig{GlobalBatchSize: 0, MicroBatchSize: 1, DataParallelSize: 1}, "--global-batch-size 0"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{32, 32}}, "has 2 values"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{32, 40, 1000}}, "divisible by the batch size increment 40"},
		{MicrobatchConfig{GlobalBatchSize: 16, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{32, 16, 1000}}, "to be >= the ramp-up start batch size 32"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{0, 32, 1000}}, "start batch size 0"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{32, 0, 1000}}, "increment 0"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{32, 32, 0}}, "ramp-up samples 0"},
		{MicrobatchConfig{GlobalBatchSize: 128, MicroBatchSize: 4, DataParallelSize: 2, RampupBatchSize: []int{128, 32, 100}}, "nothing to ramp"},
		{MicrobatchConfig{MicroBatchSize: 4, DataParallelSize: 2, StepBatchSizeSchedule: "0:8", DecreaseBatchSizeIfNeeded: true}, "cannot specify both --step-batch-size-schedule and --decrease-batch-size-if-needed"},
		{MicrobatchConfig{MicroBatchSize: 4, DataParallelSize: 2, StepBatchSizeSchedule: "0:8", RampupBatchSize: []int{8, 8, 8}}, "both set"},
	} {
		_, err := NewMicrobatches(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewMicrobatches(%+v) error %v, want one containing %q", c.cfg, err, c.want)
		}
	}
}

// TestMicrobatchesMatchMegatronCalculators replays
// testdata/megatron_microbatches.json, written by
// tools/golden/optim_microbatch.py from Megatron's own calculators (HEAD for
// constant and step schedules, core_v0.17 for ramp-up) and update_train_iters.
func TestMicrobatchesMatchMegatronCalculators(t *testing.T) {
	raw, err := os.ReadFile("testdata/megatron_microbatches.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []struct {
			Name string `json:"name"`
			Args struct {
				GBS      int    `json:"global_batch_size"`
				MBS      int    `json:"micro_batch_size"`
				DP       int    `json:"data_parallel_size"`
				Decrease bool   `json:"decrease_batch_size_if_needed"`
				Rampup   []int  `json:"rampup_batch_size"`
				Schedule string `json:"step_batch_size_schedule"`
				Seq      int    `json:"seq_length"`
			} `json:"args"`
			Points     [][4]int64 `json:"points"`
			TrainIters [][2]int64 `json:"train_iters"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 7 {
		t.Fatalf("golden has %d cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		a := c.Args
		m, err := NewMicrobatches(MicrobatchConfig{GlobalBatchSize: a.GBS, MicroBatchSize: a.MBS, DataParallelSize: a.DP,
			DecreaseBatchSizeIfNeeded: a.Decrease, RampupBatchSize: a.Rampup, StepBatchSizeSchedule: a.Schedule, SeqLength: a.Seq})
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for _, p := range c.Points {
			m.Update(p[0])
			got := [4]int64{p[0], int64(m.CurrentGlobalBatchSize()), int64(m.CurrentRunningGlobalBatchSize()), int64(m.Num())}
			if got != p {
				t.Errorf("%s: at %d consumed: [consumed GBS running M] = %v, Megatron %v", c.Name, p[0], got, p)
			}
		}
		for _, ti := range c.TrainIters {
			if got := m.TrainIters(ti[0]); got != ti[1] {
				t.Errorf("%s: TrainIters(%d) = %d, Megatron %d", c.Name, ti[0], got, ti[1])
			}
		}
	}
}
