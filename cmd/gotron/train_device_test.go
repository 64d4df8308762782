package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestTrainDeviceSim: gotron train --device sim prints the CPU's losses,
// ends with the line counting its host copies, and writes a checkpoint that
// generate loads; a bad --device value is refused naming the flag.
func TestTrainDeviceSim(t *testing.T) {
	lossRE := regexp.MustCompile(`lm loss: ([0-9.E+-]+)`)
	run := func(dev string) (string, []string) {
		dir := t.TempDir()
		out, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "3", "--device", dev, "--save", filepath.Join(dir, "ck"))...)
		if code != 0 {
			t.Fatalf("--device %s: exit %d: %s", dev, code, errs)
		}
		var losses []string
		for _, m := range lossRE.FindAllStringSubmatch(out, -1) {
			losses = append(losses, m[1])
		}
		if len(losses) < 3 {
			t.Fatalf("--device %s: %d losses in:\n%s", dev, len(losses), out)
		}
		_, errs, code = runCLI(t, "generate", "--load", filepath.Join(dir, "ck"), "--prompt", "1 2 3",
			"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--max-new-tokens", "3", "--top-k", "1")
		if code != 0 {
			t.Fatalf("generate from the --device %s checkpoint: exit %d: %s", dev, code, errs)
		}
		return out, losses
	}
	cpuOut, cpu := run("cpu")
	simOut, sim := run("sim")
	if !slices.Equal(sim, cpu) {
		t.Errorf("losses on sim %v, on the CPU %v", sim, cpu)
	}
	if !strings.Contains(simOut, "sim device: ") || strings.Contains(cpuOut, "sim device: ") {
		t.Errorf("the transfer line should end the sim run only:\n%s", simOut)
	}
	if _, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", "--device", "gpu")...); code == 0 || !strings.Contains(errs, `--device: tensor: device "gpu"`) {
		t.Errorf("--device gpu: exit %d, stderr %q", code, errs)
	}
}

// TestLaunchInprocTrainDeviceSim: gotron launch --inproc trains TP=2 × DP=2
// (sequence parallel, distributed optimizer) and PP=2 × DP=2 on --device sim
// and logs the losses the same layout logs on the CPU, exactly.
func TestLaunchInprocTrainDeviceSim(t *testing.T) {
	dir := t.TempDir()
	for i, layout := range [][]string{
		{"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"},
		{"--pipeline-model-parallel-size", "2", "--overlap-grad-reduce"},
	} {
		var losses [2][]float64
		for j, dev := range []string{"cpu", "sim"} {
			m := filepath.Join(dir, fmt.Sprintf("%d-%s.jsonl", i, dev))
			args := append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
				with(dpTrain, append(layout, "--train-iters", "3", "--device", dev, "--metrics-file", m)...)...)
			out, errs, code := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("%v --device %s: exit %d: %s", layout, dev, code, errs)
			}
			if strings.Contains(out, "sim device: ") != (dev == "sim") {
				t.Errorf("%v --device %s: transfer line present: %v:\n%s", layout, dev, dev != "sim", out)
			}
			losses[j], _ = metricsLosses(t, m)
		}
		if len(losses[0]) != 3 || !slices.Equal(losses[1], losses[0]) {
			t.Errorf("%v: losses on sim %v, on the CPU %v (must be identical)", layout, losses[1], losses[0])
		}
	}
}
