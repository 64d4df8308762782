package main

import (
	"bytes"
	"context"
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
// and logs the losses the same layout logs on the CPU, exactly: with the
// ranks' device collectives (comm.SimDevice, the default: no collective is
// staged through host copies) and without (GOTRON_SIM_DEVICE_COLLECTIVES=0:
// staged, and the copies say so by site).
func TestLaunchInprocTrainDeviceSim(t *testing.T) {
	dir := t.TempDir()
	for i, l := range []struct {
		flags   []string
		staging string // the copy site of this layout's staged collectives
	}{
		{[]string{"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}, "tp.stageIn"},
		{[]string{"--pipeline-model-parallel-size", "2", "--overlap-grad-reduce"}, "pp.hostValues"},
	} {
		var losses [3][]float64
		for j, dev := range []string{"cpu", "sim", "sim-staged"} {
			m := filepath.Join(dir, fmt.Sprintf("%d-%s.jsonl", i, dev))
			args := append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
				with(dpTrain, append(l.flags, "--train-iters", "3", "--device", strings.TrimSuffix(dev, "-staged"), "--metrics-file", m)...)...)
			var out, errb bytes.Buffer
			env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(k string) string {
				if k == "GOTRON_SIM_DEVICE_COLLECTIVES" && dev == "sim-staged" {
					return "0"
				}
				return ""
			}}
			if code := run(context.Background(), env, args); code != 0 {
				t.Fatalf("%v --device %s: exit %d: %s", l.flags, dev, code, errb.String())
			}
			if strings.Contains(out.String(), "sim device: ") != (dev != "cpu") {
				t.Errorf("%v --device %s: transfer line present: %v:\n%s", l.flags, dev, dev == "cpu", out.String())
			}
			if staged := strings.Contains(out.String(), l.staging+" "); dev != "cpu" && staged != (dev == "sim-staged") {
				t.Errorf("%v %s: copies at %s: %v:\n%s", l.flags, dev, l.staging, staged, out.String())
			}
			losses[j], _ = metricsLosses(t, m)
		}
		if len(losses[0]) != 3 || !slices.Equal(losses[1], losses[0]) || !slices.Equal(losses[2], losses[0]) {
			t.Errorf("%v: losses on sim %v, staged %v, on the CPU %v (must be identical)", l.flags, losses[1], losses[2], losses[0])
		}
	}
}
