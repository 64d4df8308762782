package ckpt

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenMetadata feeds arbitrary checkpoint.json contents, beside a real
// shard file, to Open and reads every tensor it lists: a bad file must be
// refused with an error, never a panic, a hang or a huge allocation. The
// seed corpus (a valid checkpoint.json and edits of it) runs in the
// default go test; fuzz longer with
//
//	go test ./ckpt -run '^$' -fuzz FuzzOpenMetadata -fuzztime 5m
func FuzzOpenMetadata(f *testing.F) {
	src := f.TempDir()
	a := Piece{Group: "model", Name: "a", GlobalShape: []int{2, 3}, Block: Whole([]int{2, 3}), Data: []float32{1, 2, 3, 4, 5, 6}}
	b := Piece{Group: "model", Name: "b", GlobalShape: []int{4}, Block: Whole([]int{4}), Data: []float32{7, 8, 9, 10}}
	if err := BeginSharded(src, 1); err != nil {
		f.Fatal(err)
	}
	if err := WriteShards(f.Context(), src, 1, 0, []Piece{a, b}); err != nil {
		f.Fatal(err)
	}
	if err := FinishSharded(src, 1, Meta{ConsumedTrainSamples: 4}, Layout{WorldSize: 1}); err != nil {
		f.Fatal(err)
	}
	iter := filepath.Join(src, IterDirName(1))
	meta, err := os.ReadFile(filepath.Join(iter, MetaFile))
	if err != nil {
		f.Fatal(err)
	}
	shard, err := os.ReadFile(filepath.Join(iter, rankFile(0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(meta)
	for _, edit := range [][2]string{
		{`"model/b#0"`, `"model/a#0"`},                       // b aliases a's bytes
		{`"shape": [`, `"shape": [-3, `},                     // negative dimension
		{`"shape": [`, `"shape": [4611686018427387904, 4, `}, // element count overflows
		{`"hi": 6`, `"hi": 9223372036854775807`},             // element range far past the block
		{`"lo": 0`, `"lo": -1`},                              // negative element range
		{`"offset": [`, `"offset": [9223372036854775807, `},
		{`"format_version": 2`, `"format_version": 3`},
		{`"F32"`, `"BF16"`},
		{`"rank_00000.safetensors"`, `"../rank_00000.safetensors"`},
		{`"iteration": 1`, `"iteration": 2`},
	} {
		f.Add(bytes.Replace(meta, []byte(edit[0]), []byte(edit[1]), 1))
	}
	// Structural edits: shapes and blocks whose arithmetic would wrap or
	// whose allocation would be huge.
	var sm shardedMeta
	if err := json.Unmarshal(meta, &sm); err != nil {
		f.Fatal(err)
	}
	for _, edit := range []func(tr *TensorRecord){
		func(tr *TensorRecord) { tr.Shape = []int{1 << 62, 4}; tr.Shards[0].Block = Whole(tr.Shape) }, // numel wraps to 0
		func(tr *TensorRecord) { tr.Shape = []int{1 << 40, 1}; tr.Shards[0].Block = Whole(tr.Shape) }, // 4 TB, no such bytes
		func(tr *TensorRecord) { tr.Shards[0].Offset[0] = math.MaxInt },                               // offset+shape wraps
		func(tr *TensorRecord) { tr.Shards = append(tr.Shards, tr.Shards[0]) },                        // stored twice
		func(tr *TensorRecord) { tr.Shards = nil },
	} {
		var c shardedMeta
		json.Unmarshal(meta, &c)
		tr := c.Tensors["model"]["a"]
		edit(&tr)
		c.Tensors["model"]["a"] = tr
		raw, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":"gotron-checkpoint","format_version":2,"iteration":1,"tensors":{"model":{"x":{"dtype":"F32","shape":[],"shards":[]}}}}`))
	f.Fuzz(func(t *testing.T, meta []byte) {
		dir := t.TempDir()
		iter := filepath.Join(dir, IterDirName(1))
		if err := os.Mkdir(iter, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{filepath.Join(dir, TrackerFile): []byte("1"),
			filepath.Join(iter, MetaFile): meta, filepath.Join(iter, rankFile(0)): shard} {
			if err := os.WriteFile(name, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r, err := Open(dir, -1)
		if err != nil {
			return
		}
		defer r.Close()
		for _, g := range r.Groups() {
			for n := range r.Tensors(g) {
				r.ReadWhole(g, n)
			}
		}
	})
}
