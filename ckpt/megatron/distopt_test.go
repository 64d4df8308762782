package megatron

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/torchpt"
)

const distFixture = "gpt_tp2_pp2_distopt"

// distRank is the fixture's rank directory (tp, pp).
func distRank(dir string, tp, pp int) string {
	return filepath.Join(dir, "iter_0000500", "mp_rank_0"+string(rune('0'+tp))+"_00"+string(rune('0'+pp)))
}

// TestImportDistOptimizerSource: the fixture's state comes from its
// distrib_optim.pt files (TestImportOptimizerMatchesPyTorch checks every
// tensor against the script's), and every rank's file is closed when the
// import ends.
func TestImportDistOptimizerSource(t *testing.T) {
	c, err := Open(filepath.Join("testdata", distFixture))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, st, info, err := c.Import(Options{})
	if err != nil || st == nil {
		t.Fatalf("err %v, state %v, warnings %q", err, st != nil, info.Warnings)
	}
	if !strings.Contains(st.Source, "Adam state of the distributed optimizer (distrib_optim.pt files, bf16), step 497") || !st.MainParams || len(m.Params()) == 0 {
		t.Errorf("source %q, main params %v", st.Source, st.MainParams)
	}
	for _, w := range info.Warnings {
		if strings.Contains(w, "optimizer") || strings.Contains(w, "tied") {
			t.Errorf("warning %q", w)
		}
	}
}

// TestImportDistOptimBadInput: a distrib_optim.pt in another layout, or a
// model and args whose buffer layout does not give the file's, import the
// weights alone with a warning naming the file; a malformed one is an
// *OptimizerError naming it; nothing panics.
func TestImportDistOptimBadInput(t *testing.T) {
	const (
		warning = iota + 1 // weights only, a warning
		failure            // an *OptimizerError
	)
	malformed := func(name string) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			b, err := os.ReadFile(filepath.Join("testdata", "distrib_optim_malformed", name))
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(distRank(dir, 1, 1), DistOptimFile)
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return dst
		}
	}
	cases := []struct {
		name    string
		files   func(t *testing.T, dir string) string // edits the copy; returns the file to name
		args    func(c *Checkpoint)
		outcome int
		wants   []string // substrings; {file} is what files returned
	}{
		{"another sharding type", malformed("sharding_type.pt"), nil, warning,
			[]string{"{file}: param_state_sharding_type fully_reshardable: gotron reads the dp_zero_gather_scatter layout"}},
		{"the per-bucket layout before buckets_coalesced", malformed("legacy.pt"), nil, warning,
			[]string{"{file}: per-bucket tensors without buckets_coalesced, the layout of Megatron before April 2024"}},
		{"several chained optimizers", malformed("chained.pt"), nil, warning,
			[]string{"{file} is a list of 2 parameter states (Megatron's ChainedOptimizer"}},
		{"exp_avg_sq missing", malformed("no_exp_avg_sq.pt"), nil, failure,
			[]string{"{file}: gradient buffer 0 (bfloat16, float32) has no exp_avg_sq (keys param, exp_avg, numel_unpadded)"}},
		{"a tensor of the wrong size", malformed("wrong_size.pt"), nil, failure,
			[]string{"{file}: gradient buffer 0 (bfloat16, float32): param has shape [7], want [8] (numel_unpadded)"}},
		{"numel_unpadded missing", malformed("no_numel_unpadded.pt"), nil, failure,
			[]string{"{file}: gradient buffer 0 (bfloat16, float32): numel_unpadded is <nil>, want a positive element count"}},
		{"buckets_coalesced missing", malformed("no_buckets_coalesced.pt"), nil, failure,
			[]string{"{file} has no buckets_coalesced entry (keys 0)"}},
		{"a dtype key that is not (param_dtype, grad_dtype)", malformed("dtype_key.pt"), nil, failure,
			[]string{"{file}: gradient buffer 0: dtype key torch.bfloat16: want (param_dtype, grad_dtype)"}},
		{"not a dict", malformed("not_a_dict.pt"), nil, failure,
			[]string{"{file} holds a *torchpt.Tensor, not the distributed optimizer's parameter state"}},
		{"an empty file", func(t *testing.T, dir string) string {
			p := filepath.Join(distRank(dir, 0, 1), DistOptimFile)
			os.WriteFile(p, nil, 0o644)
			return p
		}, nil, failure, []string{"{file}: empty file"}},
		{"no distrib_optim.pt", func(t *testing.T, dir string) string {
			p := filepath.Join(distRank(dir, 1, 0), DistOptimFile)
			os.Remove(p)
			return p
		}, nil, warning, []string{"args.use_distributed_optimizer=True, but there is no {file}"}},
		{"a record cut short", func(t *testing.T, dir string) string {
			p := filepath.Join(distRank(dir, 0, 0), DistOptimFile)
			key := "data/" + distTensor(t, p, "exp_avg_sq").Storage.Key
			rewriteZip(t, p, func(name string, b []byte) []byte {
				if strings.HasSuffix(name, "/"+key) {
					return b[:len(b)/3]
				}
				return b
			})
			return p
		}, nil, failure, []string{"{file}", "truncated"}},
		{"a main param that is not its weight's", func(t *testing.T, dir string) string {
			// The position embeddings start at 1488 in the coalesced buffer
			// (the first bucket ends unaligned, the shared embedding closes
			// the second): change their first fp32 main param.
			p := filepath.Join(distRank(dir, 1, 0), DistOptimFile)
			key := "data/" + distTensor(t, p, "param").Storage.Key
			rewriteZip(t, p, func(name string, b []byte) []byte {
				if strings.HasSuffix(name, "/"+key) {
					binary.LittleEndian.PutUint32(b[4*1488:], math.Float32bits(7))
				}
				return b
			})
			return p
		}, nil, failure, []string{"{file}: gradient buffer 0 (bfloat16, float32), elements [1488, 2000) (model.embedding.position_embeddings.weight): param: element 0 is 7",
			"the buffer layout does not place the parameters where this distrib_optim.pt has them"}},
		{"another bucket size", nil, func(c *Checkpoint) { c.args.d.Set("ddp_bucket_size", int64(1500)) }, warning,
			[]string{"{dist00}: gradient buffer 0 (bfloat16, float32) holds 3024 elements (numel_unpadded), but Megatron's layout of the chunk's 14 parameters gives 3072 (parameters 64-aligned, buckets of 1500 elements)"}},
		{"no --overlap-grad-reduce", nil, func(c *Checkpoint) { c.args.d.Set("overlap_grad_reduce", false) }, warning,
			[]string{"holds 3024 elements (numel_unpadded), but Megatron's layout of the chunk's 14 parameters gives 3072 (parameters 64-aligned, one bucket)"}},
		{"--ddp-num-buckets", nil, func(c *Checkpoint) { c.args.d.Set("ddp_num_buckets", int64(4)) }, warning,
			[]string{"args.ddp_num_buckets=4: the bucket layout it gives is not derived"}},
		{"SGD", nil, func(c *Checkpoint) { c.args.d.Set("optimizer", "sgd") }, warning,
			[]string{"args.optimizer=sgd with the distributed optimizer: gotron reads the distributed optimizer's Adam state only"}},
		{"args without the distributed optimizer", nil, func(c *Checkpoint) { c.args.d.Set("use_distributed_optimizer", false) }, warning,
			[]string{"{rank00}: the optimizer section holds no per-parameter state and no fp32 main params (the distributed optimizer's"}},
		{"a section with per-parameter state", nil, func(c *Checkpoint) {
			_, inner := optSection(t, c, 1, 1)
			st := torchpt.NewDict()
			st.Set(int64(0), torchpt.NewDict())
			inner.Set("state", st)
		}, warning, []string{"{rank11}: args.use_distributed_optimizer=True, but the optimizer section holds per-parameter state"}},
		{"step counts differ", nil, func(c *Checkpoint) {
			_, inner := optSection(t, c, 0, 1)
			items(get(inner, "param_groups"))[1].(*torchpt.Dict).Set("step", int64(3))
		}, warning, []string{"the step counts differ: 3 ({rank01} param_groups[1]), 497 ("}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, distFixture)
			var file string
			if c.files != nil {
				file = c.files(t, dir)
			}
			ck, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if c.args != nil {
				c.args(ck)
			}
			m, st, info, err := ck.Import(Options{})
			var msg string
			switch c.outcome {
			case warning, failure:
				msg = notImportedMessage(t, c.outcome == warning, m, st, info, err)
			}
			for _, w := range c.wants {
				w = strings.ReplaceAll(w, "{file}", file)
				for _, r := range [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}} {
					rc := string(rune('0'+r[0])) + string(rune('0'+r[1]))
					w = strings.ReplaceAll(w, "{rank"+rc+"}", filepath.Join(distRank(dir, r[0], r[1]), FileName))
					w = strings.ReplaceAll(w, "{dist"+rc+"}", filepath.Join(distRank(dir, r[0], r[1]), DistOptimFile))
				}
				if !strings.Contains(msg, w) {
					t.Errorf("%s\nwant it to mention %q", msg, w)
				}
			}
			t.Logf("%s", msg)
		})
	}
}

// distTensor is kind's world tensor of gradient buffer 0 of the
// distrib_optim.pt at path.
func distTensor(t *testing.T, path, kind string) *torchpt.Tensor {
	t.Helper()
	f, err := torchpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bufs, why, err := parseDistOptim(f, []string{"exp_avg", "exp_avg_sq"})
	if err != nil || why != "" {
		t.Fatalf("%s: %v %s", path, err, why)
	}
	return bufs[0].tensors[kind]
}
