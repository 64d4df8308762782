package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
)

func runBenchGemm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &cli{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	err := cmdBench(context.Background(), env, append([]string{"gemm"}, args...))
	return out.String(), err
}

// benchGemmRow matches a table row: ops, M, K, N, median, max, peak,
// %peak median, %peak max, GFLOP/cpu-s per thread, %peak cpu.
var benchGemmRow = regexp.MustCompile(`(?m)^(NN|NT|TN|TT)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)%$`)

// TestBenchGemmTable runs two small shapes per ISA and checks that each
// prints one row with positive rates and a %peak consistent with
// --peak-gflops.
func TestBenchGemmTable(t *testing.T) {
	for _, isa := range []string{"generic", "auto"} {
		out, err := runBenchGemm(t, "--reps", "3", "--threads", "2", "--isa", isa, "--peak-gflops", "100",
			"--shapes", "NN:33x20x17,TN:64x64x64", "--min-rep-seconds", "0.001")
		if err != nil {
			t.Fatalf("--isa %s: %v\n%s", isa, err, out)
		}
		if !strings.Contains(out, "threads 2, peak 100 GFLOP/s, 3 reps") {
			t.Errorf("--isa %s: header missing:\n%s", isa, out)
		}
		rows := benchGemmRow.FindAllStringSubmatch(out, -1)
		if len(rows) != 2 {
			t.Fatalf("--isa %s: want 2 table rows, got %d:\n%s", isa, len(rows), out)
		}
		for _, r := range rows {
			med, _ := strconv.ParseFloat(r[5], 64)
			mx, _ := strconv.ParseFloat(r[6], 64)
			peak, _ := strconv.ParseFloat(r[7], 64)
			pct, _ := strconv.ParseFloat(r[8], 64)
			pctMax, _ := strconv.ParseFloat(r[9], 64)
			if !(med > 0 && mx >= med) {
				t.Errorf("--isa %s: row %q: want 0 < median ≤ max", isa, r[0])
			}
			if peak != 100 {
				t.Errorf("--isa %s: row %q: peak %v, want --peak-gflops 100", isa, r[0], peak)
			}
			// %peak of the median and max against 100 GFLOP/s (printed to 0.1).
			if d := pct - med; d > 0.06 || d < -0.06 {
				t.Errorf("--isa %s: row %q: %%peak %v, want median/100 GFLOP/s = %v%%", isa, r[0], pct, med)
			}
			if d := pctMax - mx; d > 0.06 || d < -0.06 {
				t.Errorf("--isa %s: row %q: %%peak max %v, want max/100 GFLOP/s = %v%%", isa, r[0], pctMax, mx)
			}
		}
	}
}

// TestBenchGemmMeasuredPeak checks that without --peak-gflops the peak is
// measured: the header says so, and the row's peak is a positive rate that
// its %peak is computed against (one rep: %peak = rate / that rep's peak).
func TestBenchGemmMeasuredPeak(t *testing.T) {
	for _, isa := range []string{"generic", "auto"} {
		out, err := runBenchGemm(t, "--reps", "1", "--threads", "2", "--isa", isa, "--shapes", "NN:48x40x64", "--min-rep-seconds", "0")
		if err != nil {
			t.Fatalf("--isa %s: %v\n%s", isa, err, out)
		}
		if !strings.Contains(out, "threads 2, peak measured before each rep (10ms of FMAs on 2 threads)") {
			t.Errorf("--isa %s: want a measured-peak header:\n%s", isa, out)
		}
		rows := benchGemmRow.FindAllStringSubmatch(out, -1)
		if len(rows) != 1 {
			t.Fatalf("--isa %s: want 1 row:\n%s", isa, out)
		}
		med, _ := strconv.ParseFloat(rows[0][5], 64)
		peak, _ := strconv.ParseFloat(rows[0][7], 64)
		pct, _ := strconv.ParseFloat(rows[0][8], 64)
		if !(peak > 0) {
			t.Fatalf("--isa %s: measured peak %v, want > 0:\n%s", isa, peak, out)
		}
		// Each number is printed to 0.1: the true median and peak lie within
		// ±0.05 of what is printed (at 2.6 GFLOP/s that alone is ±2%), and
		// %peak within ±0.05 of its own.
		lo, hi := 100*(med-0.05)/(peak+0.05)-0.05, 100*(med+0.05)/max(peak-0.05, 1e-9)+0.05
		if pct < lo || pct > hi {
			t.Errorf("--isa %s: %%peak %v, want median/peak in [%.2f, %.2f]%%:\n%s", isa, pct, lo, hi, out)
		}
	}
}

// TestBenchGemmBadFlags checks that bad input is an error naming the flag.
func TestBenchGemmBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reps", "0"}, "--reps"},
		{[]string{"--threads", "-1"}, "--threads"},
		{[]string{"--peak-gflops", "-1"}, "--peak-gflops"},
		{[]string{"--isa", "sse"}, "--isa"},
		{[]string{"--precision", "fp16"}, "--precision"},
		{[]string{"--shapes", "NN:1x2"}, "--shapes"},
		{[]string{"--shapes", "NX:1x2x3"}, "--shapes"},
		{[]string{"--shapes", "NN:1x0x3"}, "--shapes"},
		{[]string{"--rep", "3"}, "did you mean --reps"},
		{[]string{"--library", "cublaslt"}, "--library cublaslt: only with --device cuda"},
		{[]string{"--library", "mkl"}, `--library "mkl": want cublas or cublaslt`},
	} {
		_, err := runBenchGemm(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestBenchGemmBF16 checks --precision bf16 on every path: the header names
// the path that runs (the VDPBF16PS kernels only where the CPU has them and
// the ISA is avx512), the measured peak doubles with those kernels, and
// each shape prints a row.
func TestBenchGemmBF16(t *testing.T) {
	for _, isa := range []string{"generic", "auto"} {
		out, err := runBenchGemm(t, "--reps", "1", "--threads", "1", "--isa", isa, "--precision", "bf16",
			"--shapes", "NN:33x20x17,NT:40x64x31", "--min-rep-seconds", "0")
		if err != nil {
			t.Fatalf("--isa %s: %v\n%s", isa, err, out)
		}
		parsed, _ := cpu.ParseISA(isa)
		prev := cpu.SetISA(parsed)
		fast := cpu.HasBF16GEMM()
		cpu.SetISA(prev)
		want := "sgemm bf16 (fp32 kernels on rounded inputs): isa " + parsed.String() + ", threads 1, peak measured before each rep (10ms of FMAs on 1 threads)"
		if fast {
			want = "sgemm bf16 (VDPBF16PS kernels): isa avx512, threads 1, peak measured before each rep (10ms of FMAs on 1 threads, ×2)"
		}
		if !strings.Contains(out, want) {
			t.Errorf("--isa %s: want header %q:\n%s", isa, want, out)
		}
		if rows := benchGemmRow.FindAllString(out, -1); len(rows) != 2 {
			t.Errorf("--isa %s: want 2 rows:\n%s", isa, out)
		}
	}
}
