package train

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
)

// TestShardedCheckpointReshards: a Llama-style model trained 10 iterations
// at (TP2, PP2, DP1) and at (TP1, PP1, DP4, distributed optimizer), saved at
// 5 (every rank writing its own shards), resumes from 5 at (TP1, PP1, DP1),
// (TP2, PP1, DP2), (TP1, PP2 V2, DP1), (TP4, PP1, DP1) and (TP1, PP1, DP2,
// distributed optimizer) with the uninterrupted run's losses within 1e-5,
// and at its own layout bit-identically.
func TestShardedCheckpointReshards(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	m.NumLayers, m.NumAttentionHeads, m.NumQueryGroups = 4, 8, 4 // TP=4 needs 4 query groups
	cfg := dpConfig(m)
	cfg.MicroBatchSize = 2
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	distOpt := ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 500}
	saves := []ppLayout{
		{tp: 2, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2}},
		{tp: 1, pp: 1, dp: 4, dc: distOpt},
	}
	resumes := []ppLayout{
		{tp: 1, pp: 1, dp: 1},
		{tp: 2, pp: 1, dp: 2},
		{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2, VPP: 2}},
		{tp: 4, pp: 1, dp: 1},
		{tp: 1, pp: 1, dp: 2, dc: distOpt},
	}
	for _, s := range saves {
		straight := runPP(t, cfg, s, train, valid)[0]
		checkLosses(t, s.String()+" straight", straight.res.Losses, ref.res.Losses, 1e-5)
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 5
		a := runPP(t, first, s, train, valid)[0]
		checkShardFiles(t, dir, 5, s.tp*s.pp*s.dp)
		for _, l := range append(resumes, s) {
			if testing.Short() && l.tp*l.pp*l.dp > 2 && l.String() != s.String() {
				continue
			}
			second := cfg
			second.Load = dir
			b := runPP(t, second, l, train, valid)[0]
			got := append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
			name := "saved at " + s.String() + ", resumed at " + l.String()
			if l.String() == s.String() {
				for i := range got {
					if got[i] != straight.res.Losses[i] {
						t.Fatalf("%s: iteration %d loss %v, straight %v (must be bit-identical)", name, i+1, got[i], straight.res.Losses[i])
					}
				}
				continue
			}
			checkLosses(t, name, got, ref.res.Losses, 1e-5)
		}
	}
}

func checkLosses(t *testing.T, name string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d iterations, want %d", name, len(got), len(want))
	}
	for i := range want {
		if !relClose(got[i], want[i], tol) {
			t.Fatalf("%s: iteration %d loss %.9g, single process %.9g", name, i+1, got[i], want[i])
		}
	}
}

// checkShardFiles: a save by n ranks is n shard files beside the metadata
// (each rank wrote its own), and every tensor's elements are stored once.
func checkShardFiles(t *testing.T, dir string, it, n int) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, ckpt.IterDirName(it)))
	if err != nil {
		t.Fatal(err)
	}
	shard := regexp.MustCompile(`^rank_[0-9]{5}\.safetensors$`)
	files := 0
	for _, e := range entries {
		switch {
		case shard.MatchString(e.Name()):
			files++
		case e.Name() != ckpt.MetaFile:
			t.Errorf("unexpected file %s in the checkpoint", e.Name())
		}
	}
	if files != n {
		t.Errorf("%d shard files for %d ranks", files, n)
	}
	r, err := ckpt.Open(dir, it)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Layout.WorldSize != n {
		t.Errorf("layout %+v, want %d ranks", r.Layout, n)
	}
	for _, g := range r.Groups() {
		for name, tr := range r.Tensors(g) {
			stored := 0
			for _, s := range tr.Shards {
				stored += s.Len()
			}
			if stored != numel(tr.Shape) {
				t.Errorf("%s/%s: %d of %d elements stored", g, name, stored, numel(tr.Shape))
			}
		}
	}
}

// TestAsyncSaveMatchesSync: with --async-save the saving iteration copies
// its shards and training goes on while they are written, finalised at a
// later iteration: every checkpoint holds the same bytes as a synchronous
// save's of the same iteration (the snapshot is not disturbed by the
// steps that follow it), and the losses are the same.
func TestAsyncSaveMatchesSync(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	m.NumLayers = 4
	cfg := dpConfig(m)
	cfg.MicroBatchSize, cfg.SaveInterval = 2, 2
	for _, l := range []ppLayout{
		{tp: 1, pp: 1, dp: 2, dc: ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 500}},
		{tp: 2, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2}},
	} {
		syncCfg, asyncCfg := cfg, cfg
		syncCfg.Save, asyncCfg.Save, asyncCfg.AsyncSave = t.TempDir(), t.TempDir(), true
		a := runPP(t, syncCfg, l, train, valid)[0]
		b := runPP(t, asyncCfg, l, train, valid)[0]
		for i := range a.res.Losses {
			if a.res.Losses[i] != b.res.Losses[i] {
				t.Fatalf("%v: iteration %d loss %v with --async-save, %v without", l, i+1, b.res.Losses[i], a.res.Losses[i])
			}
		}
		for it := 2; it <= 10; it += 2 {
			ca, err := ckpt.Load(syncCfg.Save, it)
			if err != nil {
				t.Fatal(err)
			}
			cb, err := ckpt.Load(asyncCfg.Save, it)
			if err != nil {
				t.Fatalf("%v: the asynchronous save of iteration %d: %v", l, it, err)
			}
			if cb.Meta.ConsumedTrainSamples != ca.Meta.ConsumedTrainSamples || string(cb.Meta.Scheduler) != string(ca.Meta.Scheduler) {
				t.Errorf("%v iteration %d: metadata %+v, synchronous %+v", l, it, cb.Meta, ca.Meta)
			}
			for g, ts := range ca.Groups {
				for n, x := range ts {
					y, ok := cb.Groups[g][n]
					if !ok || string(x.Data) != string(y.Data) {
						t.Fatalf("%v iteration %d: %s/%s differs from the synchronous save", l, it, g, n)
					}
				}
			}
			ca.Close()
			cb.Close()
		}
		if it, _ := ckpt.Latest(asyncCfg.Save); it != 10 {
			t.Errorf("%v: latest %d, want 10", l, it)
		}
	}
}

// TestReshardOffline: Reshard rewrites a (TP2, PP2) checkpoint as (TP1,
// DP2, distributed optimizer) and (TP4) save it, one shard file per new
// rank, and resuming from the rewritten checkpoint gives bit-identically the
// losses of resuming from the original at that layout.
func TestReshardOffline(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	m.NumLayers, m.NumAttentionHeads, m.NumQueryGroups = 4, 8, 4
	cfg := dpConfig(m)
	cfg.MicroBatchSize = 2
	src := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = src, 5
	runPP(t, first, ppLayout{tp: 2, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2}}, train, valid)
	distOpt := ddp.Config{DistributedOptimizer: true}
	for _, l := range []ppLayout{{tp: 1, pp: 1, dp: 2, dc: distOpt}, {tp: 4, pp: 1, dp: 1}} {
		dst := filepath.Join(t.TempDir(), "resharded")
		it, err := Reshard(context.Background(), src, dst, ReshardLayout{TP: l.tp, PP: l.pp, DP: l.dp, DistributedOptimizer: l.dc.DistributedOptimizer})
		if err != nil {
			t.Fatal(err)
		}
		if it != 5 {
			t.Fatalf("resharded iteration %d, want 5", it)
		}
		checkShardFiles(t, dst, 5, l.tp*l.pp*l.dp)
		direct, resharded := cfg, cfg
		direct.Load, resharded.Load = src, dst
		a := runPP(t, direct, l, train, valid)[0]
		b := runPP(t, resharded, l, train, valid)[0]
		for i := range a.res.Losses {
			if a.res.Losses[i] != b.res.Losses[i] {
				t.Fatalf("%v: iteration %d after the resharded checkpoint: loss %v, from the original %v", l, i+6, b.res.Losses[i], a.res.Losses[i])
			}
		}
		if len(a.res.Losses) != 5 {
			t.Fatalf("%v: %d iterations after resuming, want 5", l, len(a.res.Losses))
		}
	}
	if _, err := Reshard(context.Background(), src, src, ReshardLayout{}); err == nil {
		t.Fatal("resharding into the input directory was accepted")
	}
}

// TestShardedLoadBadInput: a corrupted or truncated shard, a missing
// metadata file and a checkpoint of another model are refused at --load
// with errors naming the file or tensor, before any training.
func TestShardedLoadBadInput(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	cfg := dpConfig(m)
	save := func() string {
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 2
		runPP(t, first, ppLayout{tp: 2, pp: 1, dp: 1}, train, valid)
		return dir
	}
	load := func(dir string, c Config) error {
		c.Load = dir
		_, err := New(c, train, valid)
		return err
	}
	shard := func(dir string) string { return filepath.Join(dir, ckpt.IterDirName(2), "rank_00001.safetensors") }

	dir := save()
	b, _ := os.ReadFile(shard(dir))
	b[len(b)-3] ^= 0x10
	os.WriteFile(shard(dir), b, 0o644)
	if err := load(dir, cfg); err == nil || !regexp.MustCompile(`iter_0000002: tensor \S+/\S+: rank_00001.safetensors: \S+#0: CRC-32C [0-9a-f]{8}, checkpoint.json records [0-9a-f]{8} \(corrupted\)`).MatchString(err.Error()) {
		t.Errorf("corrupted shard: %v", err)
	}

	dir = save()
	b, _ = os.ReadFile(shard(dir))
	os.WriteFile(shard(dir), b[:len(b)/2], 0o644)
	if err := load(dir, cfg); err == nil || !strings.Contains(err.Error(), "iter_0000002/rank_00001.safetensors") || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated shard: %v", err)
	}

	dir = save()
	os.Remove(filepath.Join(dir, ckpt.IterDirName(2), ckpt.MetaFile))
	if err := load(dir, cfg); err == nil || !strings.Contains(err.Error(), "iter_0000002: no checkpoint.json") {
		t.Errorf("no metadata: %v", err)
	}

	dir = save()
	other := cfg
	other.Model.FFNHiddenSize = 96
	if err := load(dir, other); err == nil || !strings.Contains(err.Error(), "ffn") {
		t.Errorf("another model: %v", err)
	}
}

// TestResumeSGDWithoutMomentum: an optimizer that keeps no buffers (SGD,
// momentum 0) saves no optimizer tensors, and its checkpoint resumes.
func TestResumeSGDWithoutMomentum(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.Optimizer, cfg.SGDMomentum = SGD, 0
	straight := runPP(t, cfg, ppLayout{tp: 1, pp: 1, dp: 2}, train, valid)[0]
	first := cfg
	first.Save, first.ExitInterval = t.TempDir(), 5
	a := runPP(t, first, ppLayout{tp: 1, pp: 1, dp: 2}, train, valid)[0]
	second := cfg
	second.Load = first.Save
	b := runPP(t, second, ppLayout{tp: 1, pp: 1, dp: 2}, train, valid)[0]
	got := append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
	for i := range straight.res.Losses {
		if got[i] != straight.res.Losses[i] {
			t.Fatalf("iteration %d: loss %v after resume, %v straight", i+1, got[i], straight.res.Losses[i])
		}
	}
}
