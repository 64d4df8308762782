package safetensors

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestSplitShardsMatchesHuggingFace checks the split rule of
// huggingface_hub split_state_dict_into_shards_factory.
func TestSplitShardsMatchesHuggingFace(t *testing.T) {
	cases := []struct {
		name  string
		sizes []int64
		max   int64
		want  [][]int
	}{
		// The example of its docstring: [6,6,2,6,2,2] GB with a 10 GB limit
		// gives [6], [6+2], [6+2+2].
		{"docstring", []int64{6, 6, 2, 6, 2, 2}, 10, [][]int{{0}, {1, 2}, {3, 4, 5}}},
		// A tensor above the limit is appended as its own shard at once,
		// before the shard still being filled.
		{"oversized", []int64{3, 12, 4, 5}, 10, [][]int{{1}, {0, 2}, {3}}},
		{"exact fit", []int64{5, 5, 5}, 10, [][]int{{0, 1}, {2}}},
		{"all fit", []int64{1, 2, 3}, 10, [][]int{{0, 1, 2}}},
		{"zero sizes", []int64{0, 0}, 1, [][]int{{0, 1}}},
		{"empty", nil, 10, nil},
	}
	for _, c := range cases {
		if got := SplitShards(c.sizes, c.max); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: SplitShards(%v, %d) = %v, want %v", c.name, c.sizes, c.max, got, c.want)
		}
	}
}

func TestIndexMatchesTransformersBytes(t *testing.T) {
	want, err := os.ReadFile("testdata/model.safetensors.index.json")
	if err != nil {
		t.Fatal(err)
	}
	idx, err := ReadIndex("testdata/model.safetensors.index.json")
	if err != nil {
		t.Fatal(err)
	}
	if idx.TotalSize != 1234 || string(idx.Extra["total_parameters"]) != "617" || len(idx.WeightMap) != 3 ||
		idx.WeightMap["caf\u00e9 <&> \U0001F600"] != "model-00001-of-00002.safetensors" {
		t.Fatalf("ReadIndex = %+v", idx)
	}
	out := filepath.Join(t.TempDir(), IndexFile)
	if err := WriteIndex(out, idx); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, want) {
		t.Errorf("WriteIndex:\n%s\nwant\n%s", got, want)
	}
}

func TestReadIndexErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ body, want string }{
		{`{"metadata":{}}`, `missing "weight_map"`},
		{`{"weight_map":{"a":"../x.safetensors"}}`, `tensor a: weight_map file "../x.safetensors" is not a file name in the index's directory`},
		{`{"weight_map":{"a":"sub/x.safetensors"}}`, `tensor a: weight_map file "sub/x.safetensors" is not a file name in the index's directory`},
		{`{"weight_map":{"a":1}}`, `tensor a: weight_map value 1 is not a string`},
		{`{"weight_map":{"a":"x","a":"y"}}`, `weight_map: duplicate key "a"`},
		{`{"metadata":{"total_size":-1},"weight_map":{}}`, `metadata.total_size -1 is not a non-negative integer`},
		{`{"weight_map":`, `value of "weight_map": invalid JSON: unexpected end of input`},
	}
	for i, c := range cases {
		p := filepath.Join(dir, strings.Repeat("i", i+1)+".json")
		os.WriteFile(p, []byte(c.body), 0o644)
		_, err := ReadIndex(p)
		if want := "safetensors: " + p + ": " + c.want; err == nil || err.Error() != want {
			t.Errorf("ReadIndex(%s):\n got %v\nwant %s", c.body, err, want)
		}
	}
	if _, err := ReadIndex(filepath.Join(dir, "none.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing index: %v", err)
	}
}

func namedTensors(sizes ...int) []Named {
	var out []Named
	for i, n := range sizes {
		data := bytes.Repeat([]byte{byte(i + 1)}, n)
		out = append(out, Named{Name: "layer." + string(rune('a'+i)), Tensor: Tensor{U8, []int{n}, data}})
	}
	return out
}

func TestWriteShardedAndOpenDir(t *testing.T) {
	dir := t.TempDir()
	tensors := namedTensors(6, 6, 2, 6, 2, 2)
	idx, err := WriteSharded(dir, tensors, ShardOptions{MaxShardBytes: 10, Metadata: map[string]string{"format": "pt"}})
	if err != nil {
		t.Fatal(err)
	}
	if idx.TotalSize != 24 {
		t.Errorf("TotalSize = %d", idx.TotalSize)
	}
	wantFiles := []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors", IndexFile}
	if got := dirNames(t, dir); !slices.Equal(got, wantFiles) {
		t.Fatalf("files = %v, want %v", got, wantFiles)
	}
	wantMap := map[string]string{"layer.a": wantFiles[0], "layer.b": wantFiles[1], "layer.c": wantFiles[1],
		"layer.d": wantFiles[2], "layer.e": wantFiles[2], "layer.f": wantFiles[2]}
	if !reflect.DeepEqual(idx.WeightMap, wantMap) {
		t.Errorf("WeightMap = %v", idx.WeightMap)
	}
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Names()) != 6 {
		t.Errorf("Names = %v", s.Names())
	}
	for _, w := range tensors {
		g, err := s.Tensor(w.Name)
		if err != nil || !equalTensor(g, w.Tensor) {
			t.Errorf("%s: %v %v", w.Name, g, err)
		}
	}
	s.Close()

	// Saving again into one file removes the shards and the index.
	if _, err := WriteSharded(dir, tensors[:2], ShardOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, dir); !slices.Equal(got, []string{SingleFile}) {
		t.Fatalf("after unsharded save: %v", got)
	}
	s, err = OpenDir(dir)
	if err != nil || !slices.Equal(s.Names(), []string{"layer.a", "layer.b"}) {
		t.Fatalf("OpenDir single: %v %v", s, err)
	}
	s.Close()

	if _, err := WriteSharded(dir, append(tensors[:1:1], tensors[0]), ShardOptions{}); err == nil ||
		err.Error() != `safetensors: WriteSharded: duplicate tensor name "layer.a"` {
		t.Errorf("duplicate: %v", err)
	}
}

func TestOpenDirIndexNamesMissingTensor(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteSharded(dir, namedTensors(6, 6), ShardOptions{MaxShardBytes: 8}); err != nil {
		t.Fatal(err)
	}
	idx, _ := ReadIndex(filepath.Join(dir, IndexFile))
	idx.WeightMap["layer.b"] = "model-00001-of-00002.safetensors"
	if err := WriteIndex(filepath.Join(dir, IndexFile), idx); err != nil {
		t.Fatal(err)
	}
	_, err := OpenDir(dir)
	want := "safetensors: " + filepath.Join(dir, IndexFile) + ": tensor layer.b: listed in weight_map but not in model-00001-of-00002.safetensors"
	if err == nil || err.Error() != want {
		t.Errorf("OpenDir:\n got %v\nwant %s", err, want)
	}
	idx.WeightMap["layer.b"] = "model-00002-of-00002.safetensors"
	if err := WriteIndex(filepath.Join(dir, IndexFile), idx); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
	if _, err := OpenDir(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing shard: %v", err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
