package main

import (
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
