package ckpt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
)

var update = flag.Bool("update", false, "rewrite testdata goldens")

// sample builds a deterministic checkpoint for iteration it: every dtype
// class in the model group, Adam-like state in the optimizer group.
// modelBytes sizes the largest tensor.
func sample(it, modelBytes int) *Checkpoint {
	r := rand.New(rand.NewPCG(uint64(it), 7))
	fill := func(dt safetensors.DType, shape ...int) safetensors.Tensor {
		n, _ := safetensors.ByteSize(dt, shape)
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		return safetensors.Tensor{DType: dt, Shape: shape, Data: data}
	}
	big := max(1, modelBytes/4/64)
	return &Checkpoint{
		Meta: Meta{
			ConsumedTrainSamples: int64(it) * 32,
			ConsumedValidSamples: int64(it),
			Args:                 json.RawMessage(`{"hidden_size":64,"num_layers":2,"seed":1234}`),
			RNGState:             json.RawMessage(fmt.Sprintf(`{"seed":1234,"offset":%d}`, it)),
			Scheduler:            json.RawMessage(`{"max_lr":0.0003,"num_steps":` + fmt.Sprint(it) + `}`),
		},
		Groups: map[string]map[string]safetensors.Tensor{
			GroupModel: {
				"embedding.word_embeddings.weight":  fill(safetensors.F32, big, 64),
				"decoder.layers.0.mlp.fc1.weight":   fill(safetensors.BF16, 16, 8),
				"decoder.layers.0.self_attention.q": fill(safetensors.F16, 3, 5),
				"decoder.final_layernorm.weight":    fill(safetensors.F64, 8),
				"mask":                              fill(safetensors.BOOL, 7),
				"fp8":                               fill(safetensors.F8_E4M3, 2, 2),
			},
			GroupOptimizer: {
				"exp_avg.embedding": fill(safetensors.F32, big, 64),
				"step":              fill(safetensors.I64),
				"counts":            fill(safetensors.I32, 3),
				"small":             fill(safetensors.I8, 3),
				"u8":                fill(safetensors.U8, 2),
				"i16":               fill(safetensors.I16, 2),
			},
		},
	}
}

// sameCheckpoint reports the first difference between two checkpoints.
func sameCheckpoint(got, want *Checkpoint) error {
	g, w := got.Meta, want.Meta
	if g.Iteration != w.Iteration || g.ConsumedTrainSamples != w.ConsumedTrainSamples ||
		g.ConsumedValidSamples != w.ConsumedValidSamples || g.SkippedTrainSamples != w.SkippedTrainSamples ||
		!jsonEqual(g.Args, w.Args) || !jsonEqual(g.RNGState, w.RNGState) || !jsonEqual(g.Scheduler, w.Scheduler) {
		return fmt.Errorf("meta %+v, want %+v", g, w)
	}
	if len(got.Groups) != len(want.Groups) {
		return fmt.Errorf("%d groups, want %d", len(got.Groups), len(want.Groups))
	}
	for group, wt := range want.Groups {
		gt := got.Groups[group]
		if len(gt) != len(wt) {
			return fmt.Errorf("group %s: %d tensors, want %d", group, len(gt), len(wt))
		}
		for name, x := range wt {
			y, ok := gt[name]
			if !ok || y.DType != x.DType || !slices.Equal(y.Shape, x.Shape) || !bytes.Equal(y.Data, x.Data) {
				return fmt.Errorf("group %s: tensor %s differs", group, name)
			}
		}
	}
	return nil
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return len(a) == 0 && len(b) == 0
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "save")
	ctx := context.Background()
	for _, it := range []int{100, 200} {
		if err := Save(ctx, dir, it, sample(it, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	if it, err := Latest(dir); err != nil || it != 200 {
		t.Fatalf("Latest = %d, %v", it, err)
	}
	if its, err := List(dir); err != nil || !slices.Equal(its, []int{100, 200}) {
		t.Fatalf("List = %v, %v", its, err)
	}
	for _, c := range []struct{ ask, want int }{{-1, 200}, {100, 100}, {200, 200}} {
		got, err := Load(dir, c.ask)
		if err != nil {
			t.Fatal(err)
		}
		want := sample(c.want, 4096)
		want.Meta.Iteration = c.want
		if err := sameCheckpoint(got, want); err != nil {
			t.Errorf("Load(%d): %v", c.ask, err)
		}
		if err := got.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLayout pins the directory layout, the tracker's bytes, that each
// group file is a plain safetensors file, and checkpoint.json (golden).
func TestLayout(t *testing.T) {
	dir := t.TempDir()
	c := sample(100, 256)
	if err := Save(context.Background(), dir, 100, c); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"iter_0000100", TrackerFile}) {
		t.Fatalf("save dir = %v", got)
	}
	if got := names(t, filepath.Join(dir, "iter_0000100")); !slices.Equal(got, []string{MetaFile, "model.safetensors", "optimizer.safetensors"}) {
		t.Fatalf("iter dir = %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, TrackerFile)); string(b) != "100" {
		t.Errorf("tracker = %q, want %q (Megatron writes the bare number)", b, "100")
	}
	for group, tensors := range c.Groups {
		var want bytes.Buffer
		if _, err := safetensors.Encode(&want, tensors, nil); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "iter_0000100", group+".safetensors"))
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s.safetensors is not the plain safetensors encoding", group)
		}
	}
	got, _ := os.ReadFile(filepath.Join(dir, "iter_0000100", MetaFile))
	golden := "testdata/checkpoint.json"
	if *update {
		os.WriteFile(golden, got, 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant (go test -update to accept)\n%s", MetaFile, got, want)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestLoadErrors damages a saved checkpoint in each way and checks the
// exact error.
func TestLoadErrors(t *testing.T) {
	const it = 100
	cases := []struct {
		name   string
		damage func(iterDir string)
		want   string
	}{
		{"missing file", func(d string) { os.Remove(filepath.Join(d, "optimizer.safetensors")) },
			"ckpt: iter_0000100/optimizer.safetensors: missing (listed in checkpoint.json)"},
		{"truncated", func(d string) { os.Truncate(filepath.Join(d, "model.safetensors"), 100) },
			"ckpt: iter_0000100/model.safetensors: 100 bytes, checkpoint.json records 1889 (truncated or overwritten)"},
		{"bit flip", func(d string) {
			p := filepath.Join(d, "model.safetensors")
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1
			os.WriteFile(p, b, 0o644)
		}, "ckpt: iter_0000100/model.safetensors: CRC-32C ebdac920, checkpoint.json records 19b14a23 (corrupted)"},
		{"newer version", func(d string) { editMeta(d, `"format_version": 1`, `"format_version": 3`) },
			"ckpt: iter_0000100/checkpoint.json: format version 3 is newer than this gotron reads (2): upgrade gotron"},
		{"version 2 without shards", func(d string) { editMeta(d, `"format_version": 1`, `"format_version": 2`) },
			"ckpt: iter_0000100/checkpoint.json: format version 2 lists no tensors"},
		{"wrong magic", func(d string) { editMeta(d, `"gotron-checkpoint"`, `"other"`) },
			`ckpt: iter_0000100/checkpoint.json: format "other", want "gotron-checkpoint"`},
		{"wrong iteration", func(d string) { editMeta(d, `"iteration": 100`, `"iteration": 99`) },
			"ckpt: iter_0000100/checkpoint.json: records iteration 99"},
		{"bad json", func(d string) { os.WriteFile(filepath.Join(d, MetaFile), []byte("{"), 0o644) },
			"ckpt: iter_0000100/checkpoint.json: unexpected end of JSON input"},
		{"bad group file name", func(d string) { editMeta(d, `"model.safetensors"`, `"../model.safetensors"`) },
			`ckpt: iter_0000100/checkpoint.json: "../model.safetensors" is not a tensor group file`},
		{"missing meta", func(d string) { os.Remove(filepath.Join(d, MetaFile)) },
			"ckpt: iter_0000100: no checkpoint.json (not a checkpoint directory, or missing): open "},
		{"corrupt header", func(d string) {
			p := filepath.Join(d, "model.safetensors")
			b, _ := os.ReadFile(p)
			copy(b[8:], `[`)
			os.WriteFile(p, b, 0o644)
			editCRC(d, "model.safetensors", b)
		}, `ckpt: iter_0000100/model.safetensors: safetensors: ` + "DIR" + `/iter_0000100/model.safetensors: header: want a JSON object, found "["`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Save(context.Background(), dir, it, sample(it, 1024)); err != nil {
				t.Fatal(err)
			}
			c.damage(filepath.Join(dir, IterDirName(it)))
			_, err := Load(dir, -1)
			want := strings.ReplaceAll(c.want, "DIR", dir)
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Load error:\n got %v\nwant %s", err, want)
			}
		})
	}
}

func editMeta(iterDir, old, repl string) {
	p := filepath.Join(iterDir, MetaFile)
	b, _ := os.ReadFile(p)
	os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(repl), 1), 0o644)
}

// editCRC records the checksum of new contents, to get past the CRC check.
func editCRC(iterDir, file string, contents []byte) {
	p := filepath.Join(iterDir, MetaFile)
	var mf metaFile
	b, _ := os.ReadFile(p)
	json.Unmarshal(b, &mf)
	rec := mf.Files[file]
	h := castagnoliSum(contents)
	b = bytes.Replace(b, []byte(rec.CRC32C), []byte(h), 1)
	os.WriteFile(p, b, 0o644)
}

func castagnoliSum(b []byte) string {
	return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli))
}

func TestTrackerErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Latest(dir); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("Latest(empty) = %v, want ErrNoCheckpoint", err)
	}
	if _, err := Load(dir, -1); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("Load(empty) = %v, want ErrNoCheckpoint", err)
	}
	tracker := filepath.Join(dir, TrackerFile)
	for body, want := range map[string]string{
		"release": "ckpt: " + tracker + ": release checkpoints are not supported, want an iteration number",
		"12x":     "ckpt: " + tracker + `: "12x" is not an iteration number`,
		"-5":      "ckpt: " + tracker + `: "-5" is not an iteration number`,
	} {
		os.WriteFile(tracker, []byte(body), 0o644)
		if _, err := Latest(dir); err == nil || err.Error() != want {
			t.Errorf("Latest(%q) = %v\nwant %s", body, err, want)
		}
	}
	os.WriteFile(tracker, []byte("42\n"), 0o644) // Megatron tolerates a newline too
	if it, err := Latest(dir); err != nil || it != 42 {
		t.Errorf("Latest(42\\n) = %d, %v", it, err)
	}
	if _, err := Load(dir, -1); err == nil || !strings.HasPrefix(err.Error(), "ckpt: iter_0000042: no checkpoint.json") {
		t.Errorf("Load(tracker to missing dir) = %v", err)
	}
}

func TestExpect(t *testing.T) {
	dir := t.TempDir()
	c := &Checkpoint{Groups: map[string]map[string]safetensors.Tensor{GroupModel: {
		"decoder.layers.0.mlp.fc1.weight": {DType: safetensors.F32, Shape: []int{1536, 384}, Data: make([]byte, 1536*384*4)},
		"decoder.final_layernorm.weight":  {DType: safetensors.BF16, Shape: []int{384}, Data: make([]byte, 384*2)},
		"output_layer.weight":             {DType: safetensors.F16, Shape: []int{2, 2}, Data: make([]byte, 8)},
		"extra":                           {DType: safetensors.U8, Shape: []int{1}, Data: []byte{1}},
	}}}
	if err := Save(context.Background(), dir, 100, c); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want := map[string]Spec{
		"decoder.layers.0.mlp.fc1.weight": {safetensors.F32, []int{2048, 384}},
		"decoder.final_layernorm.weight":  {safetensors.F32, []int{384}},
		"output_layer.weight":             {safetensors.F32, []int{4}},
		"embedding.word_embeddings":       {safetensors.F32, []int{10, 384}},
	}
	err = got.Expect(GroupModel, want)
	wantMsg := strings.Join([]string{
		"ckpt: iter_0000100/model.safetensors: tensor decoder.final_layernorm.weight has dtype BF16, model expects F32",
		"ckpt: iter_0000100/model.safetensors: tensor decoder.layers.0.mlp.fc1.weight has shape [1536 384], model expects [2048 384]",
		"ckpt: iter_0000100/model.safetensors: tensor embedding.word_embeddings missing, model expects F32[10 384]",
		"ckpt: iter_0000100/model.safetensors: tensor output_layer.weight is F16[2 2], model expects F32[4]",
		"ckpt: iter_0000100/model.safetensors: tensor extra (U8[1]) is not expected by model",
	}, "\n")
	if err == nil || err.Error() != wantMsg {
		t.Errorf("Expect:\n%v\nwant\n%s", err, wantMsg)
	}
	if err := got.Expect(GroupOptimizer, nil); err == nil || err.Error() != `ckpt: iter_0000100: no tensor group "optimizer" (have [model])` {
		t.Errorf("Expect(optimizer) = %v", err)
	}
	exact := map[string]Spec{}
	for name, tn := range got.Groups[GroupModel] {
		exact[name] = Spec{tn.DType, tn.Shape}
	}
	if err := got.Expect(GroupModel, exact); err != nil {
		t.Errorf("Expect(exact) = %v", err)
	}
}

func TestSaveRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	cases := []struct {
		it   int
		c    *Checkpoint
		want string
	}{
		{1, nil, "ckpt: Save: nil Checkpoint"},
		{-1, &Checkpoint{}, "ckpt: Save: iteration -1, want >= 0"},
		{1, &Checkpoint{Groups: map[string]map[string]safetensors.Tensor{"Model": {}}}, `ckpt: Save: group name "Model": want lower-case letters, digits and '_', starting with a letter`},
		{1, &Checkpoint{Groups: map[string]map[string]safetensors.Tensor{"model": {"w": {DType: safetensors.F32, Shape: []int{2}, Data: []byte{1}}}}},
			"ckpt: Save: group model: tensor w: F32[2] needs 8 bytes, Data has 1"},
		{1, &Checkpoint{Meta: Meta{Args: json.RawMessage(`{"a":`)}}, `ckpt: Save: Meta holds invalid JSON "{\"a\":"`},
	}
	for _, c := range cases {
		if err := Save(ctx, dir, c.it, c.c); err == nil || err.Error() != c.want {
			t.Errorf("Save error = %v\nwant %s", err, c.want)
		}
	}
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("rejected saves left %v", got)
	}
}

func TestStaleTempDirsIgnoredAndCleaned(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if err := Save(ctx, dir, 1, sample(1, 256)); err != nil {
		t.Fatal(err)
	}
	// What a crash mid-save, mid-prune and mid-tracker-write leaves.
	stale := []string{".tmp-iter_0000002-123", ".del-iter_0000000-prune", ".tmp-" + TrackerFile + "-9"}
	os.MkdirAll(filepath.Join(dir, stale[0]), 0o755)
	os.WriteFile(filepath.Join(dir, stale[0], "model.safetensors"), []byte("half"), 0o644)
	os.MkdirAll(filepath.Join(dir, stale[1]), 0o755)
	os.WriteFile(filepath.Join(dir, stale[2]), []byte("2"), 0o644)
	os.MkdirAll(filepath.Join(dir, "unrelated"), 0o755)
	if its, _ := List(dir); !slices.Equal(its, []int{1}) {
		t.Errorf("List = %v", its)
	}
	c, err := Load(dir, -1)
	if err != nil || c.Meta.Iteration != 1 {
		t.Fatalf("Load with stale temp dirs: %v", err)
	}
	c.Close()
	if err := Save(ctx, dir, 2, sample(2, 256)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"iter_0000001", "iter_0000002", TrackerFile, "unrelated"}) {
		t.Errorf("after save: %v", got)
	}
}

func TestResaveSameIterationReplaces(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if err := Save(ctx, dir, 5, sample(5, 512)); err != nil {
		t.Fatal(err)
	}
	old, err := Load(dir, 5) // keep the old mapping open across the replacement
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := Save(ctx, dir, 5, sample(6, 512)); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want := sample(6, 512)
	want.Meta.Iteration = 5
	if err := sameCheckpoint(got, want); err != nil {
		t.Error(err)
	}
	wantOld := sample(5, 512)
	wantOld.Meta.Iteration = 5
	if err := sameCheckpoint(old, wantOld); err != nil {
		t.Errorf("old mapping changed: %v", err)
	}
	if n := names(t, dir); !slices.Equal(n, []string{"iter_0000005", TrackerFile}) {
		t.Errorf("leftovers: %v", n)
	}
}

func TestSaveCancelled(t *testing.T) {
	dir := t.TempDir()
	if err := Save(context.Background(), dir, 1, sample(1, 256)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := saver{chunkBytes: 1024, event: func(ev string) {
		if strings.HasPrefix(ev, "write iter_0000002/optimizer") {
			cancel()
		}
	}}
	err := s.save(ctx, dir, 2, sample(2, 64<<10))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("save = %v, want context.Canceled", err)
	}
	if n := names(t, dir); !slices.Equal(n, []string{"iter_0000001", TrackerFile}) {
		t.Errorf("after cancel: %v", n)
	}
	if it, _ := Latest(dir); it != 1 {
		t.Errorf("Latest = %d", it)
	}
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for it := 1; it <= 5; it++ {
		if err := Save(ctx, dir, it, sample(it, 64)); err != nil {
			t.Fatal(err)
		}
	}
	if err := Prune(dir, 2); err != nil {
		t.Fatal(err)
	}
	if its, _ := List(dir); !slices.Equal(its, []int{4, 5}) {
		t.Errorf("after Prune(2): %v", its)
	}
	// Rewind: the tracker names 2, which Prune must keep.
	if err := Save(ctx, dir, 2, sample(2, 64)); err != nil {
		t.Fatal(err)
	}
	if err := Prune(dir, 2); err != nil {
		t.Fatal(err)
	}
	if its, _ := List(dir); !slices.Equal(its, []int{2, 5}) {
		t.Errorf("after rewind and Prune(2): %v", its)
	}
	if err := Prune(dir, 0); err == nil || err.Error() != "ckpt: Prune: keep = 0, want >= 1" {
		t.Errorf("Prune(0) = %v", err)
	}
	if n := names(t, dir); !slices.Equal(n, []string{"iter_0000002", "iter_0000005", TrackerFile}) {
		t.Errorf("leftovers: %v", n)
	}
}
