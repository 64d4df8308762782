package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/megatron"
	"github.com/gotron/gotron/ckpt/torchpt"
)

// importBoth imports two Megatron-layout checkpoints and requires every
// weight and optimizer buffer to be equal bit for bit.
func requireSameMegatron(t *testing.T, a, b string) {
	t.Helper()
	ma, sa, _, err := megatron.Import(a, megatron.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mb, sb, _, err := megatron.Import(b, megatron.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sa == nil || sb == nil {
		t.Fatalf("no optimizer state: %v %v", sa, sb)
	}
	for i, p := range ma.Params() {
		if !slices.Equal(p.Float32s(), mb.Params()[i].Float32s()) {
			t.Errorf("%s differs between %s and %s", p.Name, a, b)
		}
	}
	for k, v := range sa.Buffers {
		if !slices.Equal(v, sb.Buffers[k]) {
			t.Errorf("optimizer %s differs between %s and %s", k, a, b)
		}
	}
	if sa.Steps != sb.Steps || sa.Scheduler != sb.Scheduler || sa.ConsumedTrainSamples != sb.ConsumedTrainSamples {
		t.Errorf("state differs: %+v\n%+v", sa, sb)
	}
}

// TestTrainCkptFormatTorch: --ckpt-format torch saves Megatron's legacy
// layout (one file per TP/PP rank, model0/model1 with virtual stages) and
// a run resumed from it is bit for bit the run that never stopped (losses
// and the final checkpoint's weights and Adam state), in one process, at
// TP=2 × PP=2 × 2 virtual stages and with an uneven pipeline split;
// another layout is refused naming both.
func TestTrainCkptFormatTorch(t *testing.T) {
	base := []string{"train", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
		"--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--mock-data",
		"--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-iters", "0",
		"--hidden-dropout", "0.1", "--lr-decay-iters", "16", "--ckpt-format", "torch"}
	for _, c := range []struct {
		name   string
		launch []string
		par    []string
		rank   string
	}{
		{"one_process", nil, nil, "mp_rank_00"},
		{"tp2_pp2_vp2", []string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
			[]string{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}, "mp_rank_01_001"},
		{"pp2_uneven", []string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
			[]string{"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3"}, "mp_rank_00_001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			args := func(extra ...string) []string {
				a := append(append(append([]string{}, c.launch...), base...), c.par...)
				return append(a, extra...)
			}
			whole, resumed := filepath.Join(dir, "whole"), filepath.Join(dir, "resumed")
			mA, mB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
			if out, errs, code := runCLI(t, args("--train-iters", "4", "--save", whole, "--save-interval", "2", "--metrics-file", mA)...); code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errs)
			} else if !strings.Contains(out, "saving checkpoint at iteration       4 to "+whole+" in torch format") {
				t.Errorf("no save message:\n%s", out)
			}
			for _, f := range []string{"latest_checkpointed_iteration.txt", "iter_0000002/" + c.rank + "/model_optim_rng.pt", "iter_0000004/" + c.rank + "/model_optim_rng.pt"} {
				if _, err := os.Stat(filepath.Join(whole, f)); err != nil {
					t.Error(err)
				}
			}
			if c.name == "one_process" { // what Megatron's check_checkpoint_args compares
				f, err := torchpt.Open(filepath.Join(whole, "iter_0000004", "mp_rank_00", "model_optim_rng.pt"))
				if err != nil {
					t.Fatal(err)
				}
				a, _ := f.Root.(*torchpt.Dict).Get("args")
				for k, want := range map[string]any{"make_vocab_size_divisible_by": int64(64), "padded_vocab_size": int64(128), "num_layers": int64(4),
					"add_position_embedding": true, "tensor_model_parallel_size": int64(1), "consumed_train_samples": int64(16)} {
					if v, _ := a.(*torchpt.Object).Attr(k); v != want {
						t.Errorf("args.%s = %v, want %v", k, v, want)
					}
				}
				f.Close()
			}
			if c.name == "pp2_uneven" { // 3 layers on the first stage, 1 on the second
				for p, want := range []int{3, 1} {
					f, err := torchpt.Open(filepath.Join(whole, "iter_0000004", fmt.Sprintf("mp_rank_00_%03d", p), "model_optim_rng.pt"))
					if err != nil {
						t.Fatal(err)
					}
					md, _ := f.Root.(*torchpt.Dict).Get("model")
					n := 0
					for _, k := range md.(*torchpt.Dict).StringKeys() {
						if strings.HasSuffix(k, ".mlp.linear_fc2.weight") {
							n++
						}
					}
					f.Close()
					if n != want {
						t.Errorf("pipeline rank %d holds %d layers, want %d", p, n, want)
					}
				}
			}
			if _, err := os.Stat(filepath.Join(whole, ".gotron-torch-staging")); !os.IsNotExist(err) {
				t.Errorf("staging left behind: %v", err)
			}
			if _, errs, code := runCLI(t, args("--train-iters", "4", "--exit-interval", "2", "--save", resumed)...); code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			out, errs, code := runCLI(t, args("--train-iters", "4", "--load", resumed, "--save", resumed, "--metrics-file", mB)...)
			if code != 0 || !strings.Contains(out, "loading checkpoint from "+resumed+" at iteration 2") || !strings.Contains(out, "successfully loaded checkpoint from "+resumed) {
				t.Fatalf("resume: exit %d\n%s%s", code, out, errs)
			}
			la, _ := metricsLosses(t, mA)
			lb, cb := metricsLosses(t, mB)
			if len(la) != 4 || len(lb) != 2 || la[2] != lb[0] || la[3] != lb[1] || cb[0] != 12 {
				t.Errorf("losses of iterations 3, 4: uninterrupted %v, resumed %v (consumed %v)", la, lb, cb)
			}
			requireSameMegatron(t, whole, resumed)

			// Another layout: TP=2 for the one-process run, the others in
			// one process.
			a := append(append([]string{}, base...), "--train-iters", "5", "--load", whole)
			if c.launch == nil {
				a = append(append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, a...), "--tensor-model-parallel-size", "2")
			}
			_, errs, code = runCLI(t, a...)
			if code == 0 || !strings.Contains(errs, "loads only with the layout that saved it") || !strings.Contains(errs, "gotron convert --from megatron") {
				t.Errorf("another layout: exit %d: %s", code, errs)
			}
		})
	}
}

// TestTrainResumesMegatronTorchCheckpoint: a Megatron-LM checkpoint
// (ckpt/megatron's llama_tp2_pp2 fixture, saved by Megatron at TP=2 × PP=2,
// iteration 1200, with Adam) resumes with --load DIR --ckpt-format torch and trains on exactly
// as the same run resumed through 'gotron convert --from megatron'.
func TestTrainResumesMegatronTorchCheckpoint(t *testing.T) {
	fixture := megatronFixture("llama_tp2_pp2")
	dir := t.TempDir()
	common := []string{"--use-checkpoint-args", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
		"--lr", "3e-4", "--min-lr", "3e-5", "--weight-decay", "0.1", "--adam-beta2", "0.95", "--use-checkpoint-opt_param-scheduler",
		"--train-iters", "1202", "--mock-data", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-iters", "0",
		"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}
	direct, viaConvert := filepath.Join(dir, "direct.jsonl"), filepath.Join(dir, "convert.jsonl")
	out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--", "train", "--load", fixture, "--ckpt-format", "torch", "--metrics-file", direct,
		"--save", filepath.Join(dir, "saved"), "--save-interval", "1202"}, common...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("successfully loaded checkpoint from %s [ t 1/2, gtp_remat 1/1, p 1/2 ] at iteration 1200 (consumed samples 9600,", fixture)) {
		t.Fatalf("--load %s --ckpt-format torch: exit %d\n%s%s", fixture, code, out, errs)
	}
	g := filepath.Join(dir, "converted")
	mustGotron(t, "convert", "--from", "megatron", "--load", fixture, "--save", g)
	if out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--", "train", "--load", g, "--metrics-file", viaConvert}, common...)...); code != 0 {
		t.Fatalf("--load converted: exit %d\n%s%s", code, out, errs)
	}
	la, ca := metricsLosses(t, direct)
	lb, _ := metricsLosses(t, viaConvert)
	if len(la) != 2 || !slices.Equal(la, lb) || ca[0] != 9608 {
		t.Errorf("losses of iterations 1201, 1202: direct %v (consumed %v), through convert %v", la, ca, lb)
	}
	// What it saved is Megatron's layout again, at TP=2 × PP=2.
	if _, err := os.Stat(filepath.Join(dir, "saved", "iter_0001202", "mp_rank_01_001", "model_optim_rng.pt")); err != nil {
		t.Error(err)
	}
}

// TestTrainCkptFormatTorchRefusals: a gotron checkpoint under --ckpt-format
// torch, and --async-save with it, are refused saying what to use.
func TestTrainCkptFormatTorchRefusals(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	if _, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", "--save", ck)...); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "2", "--load", ck, "--ckpt-format", "torch")...)
	if code == 0 || !strings.Contains(errs, "not a Megatron legacy (torch format) checkpoint directory; a gotron checkpoint loads with --ckpt-format gotron-checkpoint") {
		t.Errorf("gotron checkpoint as torch: exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "2", "--save", ck+"2", "--async-save", "--ckpt-format", "torch")...)
	if code == 0 || !strings.Contains(errs, "--async-save with --ckpt-format torch") {
		t.Errorf("--async-save: exit %d: %s", code, errs)
	}
}

// TestTrainCkptConvertFormat: Megatron's --ckpt-convert-format and
// --ckpt-convert-save load --load, save it in the other format under
// <save>/<format> and exit; resuming from the gotron checkpoint, its
// torch conversion and that converted back gives the same losses, bit for
// bit. Without --load it is refused.
func TestTrainCkptConvertFormat(t *testing.T) {
	dir := t.TempDir()
	base := with(tinyTrain, "--num-layers", "2", "--hidden-dropout", "0.1", "--eval-iters", "0", "--train-iters", "4")
	g, conv, back := filepath.Join(dir, "g"), filepath.Join(dir, "conv"), filepath.Join(dir, "back")
	if _, errs, code := runCLI(t, with(base, "--exit-interval", "2", "--save", g)...); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	out, errs, code := runCLI(t, with(base, "--load", g, "--ckpt-convert-format", "torch", "--ckpt-convert-save", conv)...)
	if code != 0 || !strings.Contains(out, "> converted checkpoint: gotron-checkpoint -> torch.") || strings.Contains(out, "iteration        3/") {
		t.Fatalf("convert to torch: exit %d\n%s%s", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join(conv, "torch", "iter_0000002", "mp_rank_00", "model_optim_rng.pt")); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runCLI(t, with(base, "--load", filepath.Join(conv, "torch"), "--ckpt-format", "torch", "--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", back)...); code != 0 || !strings.Contains(out, "> converted checkpoint: torch -> torch_dist.") {
		t.Fatalf("convert back: exit %d\n%s%s", code, out, errs)
	}
	var losses [][]float64
	for i, load := range [][]string{{"--load", g}, {"--load", filepath.Join(conv, "torch"), "--ckpt-format", "torch"}, {"--load", filepath.Join(back, "torch_dist")}} {
		m := filepath.Join(dir, fmt.Sprintf("m%d.jsonl", i))
		if out, errs, code := runCLI(t, with(with(base, load...), "--metrics-file", m)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", load, code, out, errs)
		}
		l, _ := metricsLosses(t, m)
		losses = append(losses, l)
	}
	if len(losses[0]) != 2 || !slices.Equal(losses[0], losses[1]) || !slices.Equal(losses[0], losses[2]) {
		t.Errorf("losses of iterations 3, 4 resumed from gotron's, torch and back: %v", losses)
	}
	_, errs, code = runCLI(t, with(base, "--ckpt-convert-format", "torch", "--ckpt-convert-save", conv)...)
	if code == 0 || !strings.Contains(errs, "--ckpt-convert-format needs --ckpt-convert-save and --load") {
		t.Errorf("without --load: exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, with(base, "--load", filepath.Join(dir, "none"), "--ckpt-convert-format", "torch", "--ckpt-convert-save", conv)...)
	if code == 0 || !strings.Contains(errs, "holds no checkpoint") {
		t.Errorf("--load without a checkpoint: exit %d: %s", code, errs)
	}
}

// TestTrainCkptFormatTorchNoSaveOptim: a --no-save-optim torch checkpoint
// has no optimizer section, and --no-load-optim resumes its iteration and
// consumed samples (as Megatron's, which keeps them outside the optimizer).
func TestTrainCkptFormatTorchNoSaveOptim(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	base := with(tinyTrain, "--eval-iters", "0", "--train-iters", "4", "--lr-decay-iters", "16", "--ckpt-format", "torch")
	if _, errs, code := runCLI(t, with(base, "--exit-interval", "2", "--save", ck, "--no-save-optim")...); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	f, err := torchpt.Open(filepath.Join(ck, "iter_0000002", "mp_rank_00", "model_optim_rng.pt"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := f.Root.(*torchpt.Dict).Get("optimizer"); ok {
		t.Errorf("--no-save-optim wrote an optimizer section: %v", v)
	}
	f.Close()
	out, errs, code := runCLI(t, with(base, "--load", ck, "--no-load-optim")...)
	if code != 0 || !strings.Contains(out, "at iteration 2 (consumed samples 8,") || !strings.Contains(out, "iteration        4/       4") {
		t.Fatalf("--no-load-optim: exit %d\n%s%s", code, out, errs)
	}
}

// TestTrainMegatronTorchOptimizerNotImportable: a Megatron checkpoint whose
// optimizer state gotron cannot take (here a stray distrib_optim.pt the
// args do not explain) is refused with --ckpt-format torch, naming why
// and the flags that load its weights alone.
func TestTrainMegatronTorchOptimizerNotImportable(t *testing.T) {
	dir := copyMegatronFixture(t, "llama_tp2_pp2")
	os.WriteFile(filepath.Join(dir, "iter_0001200", "mp_rank_00_001", "distrib_optim.pt"), nil, 0o644)
	args := []string{"launch", "--inproc", "--nproc-per-node", "4", "--", "train", "--load", dir, "--ckpt-format", "torch", "--use-checkpoint-args",
		"--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "3e-4", "--train-iters", "2", "--mock-data",
		"--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--eval-iters", "0", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}
	_, errs, code := runCLI(t, args...)
	if code == 0 || !strings.Contains(errs, "the checkpoint's optimizer state cannot be imported (optimizer state not imported: ") || !strings.Contains(errs, "has a distrib_optim.pt beside it") || !strings.Contains(errs, "add --no-load-optim") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	out, errs, code := runCLI(t, append(args, "--no-load-optim")...)
	if code != 0 || !strings.Contains(out, "iteration        2/       2") {
		t.Fatalf("--no-load-optim: exit %d\n%s%s", code, out, errs)
	}
}
