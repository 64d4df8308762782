package ckpt

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cut returns the pieces of a [rows, cols] tensor (values = whole) that
// rank of size holds when split along dim (0: row blocks, 1: column
// blocks), further cut into nflat flat ranges (a distributed optimizer's).
func cut(name string, whole []float32, rows, cols, dim, rank, size, nflat int) []Piece {
	b := Block{Offset: []int{0, 0}, Shape: []int{rows, cols}}
	if dim == 0 {
		b.Offset[0], b.Shape[0] = rank*rows/size, rows/size
	} else {
		b.Offset[1], b.Shape[1] = rank*cols/size, cols/size
	}
	n := b.Shape[0] * b.Shape[1]
	local := make([]float32, 0, n)
	for r := range b.Shape[0] {
		row := (b.Offset[0] + r) * cols
		local = append(local, whole[row+b.Offset[1]:row+b.Offset[1]+b.Shape[1]]...)
	}
	var out []Piece
	for i := range nflat {
		lo, hi := i*n/nflat, (i+1)*n/nflat
		p := Piece{Group: "model", Name: name, GlobalShape: []int{rows, cols}, Block: b, Data: local[lo:hi]}
		p.Lo, p.Hi = lo, hi
		out = append(out, p)
	}
	return out
}

func saveSharded(t *testing.T, dir string, it int, ranks [][]Piece) {
	t.Helper()
	if err := BeginSharded(dir, it); err != nil {
		t.Fatal(err)
	}
	for r, ps := range ranks {
		if err := WriteShards(context.Background(), dir, it, r, ps); err != nil {
			t.Fatal(err)
		}
	}
	if err := FinishSharded(dir, it, Meta{ConsumedTrainSamples: 7}, Layout{WorldSize: len(ranks)}); err != nil {
		t.Fatal(err)
	}
}

// TestShardedRoundTrip saves a tensor cut by one layout and reads every
// block another layout wants.
func TestShardedRoundTrip(t *testing.T) {
	const rows, cols = 12, 10
	whole := make([]float32, rows*cols)
	for i := range whole {
		whole[i] = float32(i)
	}
	rng := rand.New(rand.NewSource(1))
	for _, save := range []struct{ dim, size, nflat int }{{0, 1, 1}, {0, 2, 1}, {1, 2, 3}, {0, 4, 2}, {1, 5, 7}} {
		dir := t.TempDir()
		var ranks [][]Piece
		for r := range save.size {
			ranks = append(ranks, cut("w", whole, rows, cols, save.dim, r, save.size, save.nflat))
		}
		saveSharded(t, dir, 3, ranks)
		rd, err := Open(dir, -1)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Meta.ConsumedTrainSamples != 7 || rd.Meta.Iteration != 3 || rd.Version != 2 {
			t.Fatalf("meta %+v version %d", rd.Meta, rd.Version)
		}
		for range 50 {
			r0, c0 := rng.Intn(rows), rng.Intn(cols)
			b := Block{Offset: []int{r0, c0}, Shape: []int{1 + rng.Intn(rows-r0), 1 + rng.Intn(cols-c0)}}
			n := b.Shape[0] * b.Shape[1]
			b.Lo = rng.Intn(n)
			b.Hi = b.Lo + 1 + rng.Intn(n-b.Lo)
			got := make([]float32, b.Len())
			if err := rd.Read("model", "w", []int{rows, cols}, b, got); err != nil {
				t.Fatal(err)
			}
			for k := range got {
				e := b.Lo + k
				want := whole[(r0+e/b.Shape[1])*cols+c0+e%b.Shape[1]]
				if got[k] != want {
					t.Fatalf("saved %+v, block %+v: element %d = %v, want %v", save, b, k, got[k], want)
				}
			}
		}
		rd.Close()
		c, err := Load(dir, 3) // whole, as generate and convert read
		if err != nil {
			t.Fatal(err)
		}
		v, _ := c.Groups["model"]["w"].Float32View()
		for i := range whole {
			if v[i] != whole[i] {
				t.Fatalf("Load: element %d = %v", i, v[i])
			}
		}
		c.Close()
	}
}

// TestShardedIncompleteNotCommitted: a save whose ranks did not all report,
// or whose shards miss or duplicate elements, is refused and leaves the
// previous checkpoint the latest.
func TestShardedIncompleteNotCommitted(t *testing.T) {
	whole := make([]float32, 16)
	dir := t.TempDir()
	saveSharded(t, dir, 1, [][]Piece{cut("w", whole, 4, 4, 0, 0, 1, 1)})

	if err := BeginSharded(dir, 2); err != nil {
		t.Fatal(err)
	}
	if err := WriteShards(context.Background(), dir, 2, 0, cut("w", whole, 4, 4, 0, 0, 2, 1)); err != nil {
		t.Fatal(err)
	}
	err := FinishSharded(dir, 2, Meta{}, Layout{WorldSize: 2})
	if err == nil || !strings.Contains(err.Error(), "rank 1 wrote no rank_00001.json") {
		t.Fatalf("missing rank: %v", err)
	}
	// Both report, but rank 1 holds rank 0's rows again: a duplicate and a
	// hole.
	if err := WriteShards(context.Background(), dir, 2, 1, cut("w", whole, 4, 4, 0, 0, 2, 1)); err != nil {
		t.Fatal(err)
	}
	err = FinishSharded(dir, 2, Meta{}, Layout{WorldSize: 2})
	if err == nil || !strings.Contains(err.Error(), "store the same elements") {
		t.Fatalf("a duplicate and a hole: %v", err)
	}

	if err := BeginSharded(dir, 3); err != nil {
		t.Fatal(err)
	}
	if err := WriteShards(context.Background(), dir, 3, 0, cut("w", whole, 4, 4, 1, 0, 2, 1)); err != nil {
		t.Fatal(err)
	}
	if err := WriteShards(context.Background(), dir, 3, 1, nil); err != nil {
		t.Fatal(err)
	}
	err = FinishSharded(dir, 3, Meta{}, Layout{WorldSize: 2})
	if err == nil || !strings.Contains(err.Error(), "its shards store 8") {
		t.Fatalf("half a tensor: %v", err)
	}
	if it, _ := Latest(dir); it != 1 {
		t.Fatalf("latest %d, want 1", it)
	}
	for _, it := range []int{2, 3} {
		if _, err := os.Stat(filepath.Join(dir, IterDirName(it))); err == nil {
			t.Fatalf("the incomplete save of iteration %d got its final name", it)
		}
	}
	if err := BeginSharded(dir, 3); err != nil { // leftovers are cleaned
		t.Fatal(err)
	}
}

// TestShardedCorruption: truncated and corrupted shard files, a missing
// metadata file, an unknown file name: errors name the file or tensor.
func TestShardedCorruption(t *testing.T) {
	whole := make([]float32, 64)
	for i := range whole {
		whole[i] = float32(i)
	}
	mk := func() (string, string) {
		dir := t.TempDir()
		saveSharded(t, dir, 4, [][]Piece{cut("w", whole, 8, 8, 0, 0, 2, 1), cut("w", whole, 8, 8, 0, 1, 2, 1)})
		return dir, filepath.Join(dir, IterDirName(4))
	}
	dir, it := mk()
	f := filepath.Join(it, "rank_00001.safetensors")
	b, _ := os.ReadFile(f)
	os.WriteFile(f, b[:len(b)-4], 0o644)
	if _, err := Open(dir, -1); err == nil || !strings.Contains(err.Error(), "rank_00001.safetensors") || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated: %v", err)
	}

	dir, it = mk()
	f = filepath.Join(it, "rank_00000.safetensors")
	b, _ = os.ReadFile(f)
	b[len(b)-1] ^= 0x40
	os.WriteFile(f, b, 0o644)
	rd, err := Open(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 32)
	// Rank 1's rows are intact and read; rank 0's are refused.
	if err := rd.Read("model", "w", []int{8, 8}, Block{Offset: []int{4, 0}, Shape: []int{4, 8}, Hi: 32}, got); err != nil {
		t.Fatal(err)
	}
	if err := rd.Read("model", "w", []int{8, 8}, Block{Offset: []int{0, 0}, Shape: []int{4, 8}, Hi: 32}, got); err == nil ||
		!strings.Contains(err.Error(), "model/w") || !strings.Contains(err.Error(), "CRC-32C") {
		t.Fatalf("corrupted: %v", err)
	}
	rd.Close()

	dir, it = mk()
	os.Remove(filepath.Join(it, MetaFile))
	if _, err := Open(dir, -1); err == nil || !strings.Contains(err.Error(), "no checkpoint.json") {
		t.Fatalf("no metadata: %v", err)
	}

	dir, it = mk()
	raw, _ := os.ReadFile(filepath.Join(it, MetaFile))
	var m map[string]any
	json.Unmarshal(raw, &m)
	m["files"].(map[string]any)["../x"] = map[string]any{"bytes": 1, "crc32c": "00000000"}
	raw, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(it, MetaFile), raw, 0o644)
	if _, err := Open(dir, -1); err == nil || !strings.Contains(err.Error(), `invalid file name "../x"`) {
		t.Fatalf("bad file name: %v", err)
	}
}

// TestReadAsShape: a format-1 tensor stored whole may be read under another
// shape of the same size (its optimizer buffers are flat).
func TestReadAsShape(t *testing.T) {
	dir := t.TempDir()
	c := sample(2, 64)
	if err := Save(context.Background(), dir, 2, c); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Version != 1 {
		t.Fatalf("version %d", rd.Version)
	}
	for g, ts := range c.Groups {
		for n, x := range ts {
			if x.DType.String() != "F32" || x.NumElements() < 2 || x.NumElements()%2 != 0 {
				continue
			}
			want := make([]float32, x.NumElements())
			x.DecodeFloat32(want)
			shape := []int{2, x.NumElements() / 2}
			got := make([]float32, len(want)/2)
			if err := rd.Read(g, n, shape, Block{Offset: []int{1, 0}, Shape: []int{1, shape[1]}, Hi: shape[1]}, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[shape[1]+i]) {
					t.Fatalf("%s/%s[%d] = %v, want %v", g, n, i, got[i], want[shape[1]+i])
				}
			}
			return
		}
	}
	t.Fatal("sample has no even-sized F32 tensor")
}

// TestWriteShardsInBackgroundPaced: a paced background write of 3 MB at
// 10 MB/s does not finish before the third megabyte is due (0.2 s), and
// writes the same checkpoint as an unpaced one.
func TestWriteShardsInBackgroundPaced(t *testing.T) {
	whole := make([]float32, 3<<18) // 3 MB
	for i := range whole {
		whole[i] = float32(i)
	}
	dir := t.TempDir()
	if err := BeginSharded(dir, 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := WriteShardsInBackground(context.Background(), dir, 1, 0, cut("w", whole, 768, 1024, 0, 0, 1, 1), 10e6); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("3 MB paced at 10 MB/s written in %v", took)
	}
	if err := FinishSharded(dir, 1, Meta{}, Layout{WorldSize: 1}); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	got, _, err := rd.ReadWhole("model", "w")
	if err != nil {
		t.Fatal(err)
	}
	for i := range whole {
		if got[i] != whole[i] {
			t.Fatalf("element %d = %v", i, got[i])
		}
	}
}

// TestWriteShardsDirect: a background writer writes pieces laid back to
// back in an AlignedFloat32s buffer (as --async-save's snapshot) with
// O_DIRECT, copying only the small piece and the blocks where pieces meet;
// pieces not aligned like their place in the file all through its aligned
// buffer; a synchronous save through the page cache. Every file has its
// data at a 4 KiB boundary (an unaligned tail at the end) and reads back
// exactly, checksums included.
func TestWriteShardsDirect(t *testing.T) {
	const rows, cols = 301, 517 // 622468 bytes: not a multiple of 4 KiB
	whole := make([]float32, rows*cols)
	for i := range whole {
		whole[i] = float32(i) * 0.5
	}
	loose := append(cut("w", whole, rows, cols, 0, 0, 1, 3), cut("v", whole[:cols*7], 7, cols, 1, 0, 1, 1)...)
	n := 0
	for _, p := range loose {
		n += len(p.Data)
	}
	place := func(buf []float32) []Piece {
		ps := slices.Clone(loose)
		for i := range ps {
			k := copy(buf, ps[i].Data)
			ps[i].Data, buf = buf[:k:k], buf[k:]
		}
		return ps
	}
	packed := place(AlignedFloat32s(n))
	shifted := place(AlignedFloat32s(n + 1)[1:]) // every piece 4 bytes off
	small := 4 * 7 * cols
	for _, c := range []struct {
		name      string
		pieces    []Piece
		yield     bool
		direct    bool
		maxCopied int
	}{
		{"packed, background", packed, true, true, small + 4*4096},
		{"shifted, background", shifted, true, true, 4 * n},
		{"packed, synchronous", packed, false, false, 0},
	} {
		dir := t.TempDir()
		if err := BeginSharded(dir, 2); err != nil {
			t.Fatal(err)
		}
		st, err := writeShards(context.Background(), dir, 2, 0, c.pieces, c.yield, 0)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case st.direct != c.direct && c.direct && !directSupported(t, dir):
			t.Logf("%s: %s refuses O_DIRECT: written through the page cache", c.name, dir)
		case st.direct != c.direct:
			t.Errorf("%s: written with O_DIRECT: %v, want %v", c.name, st.direct, c.direct)
		case st.direct && (st.copied > int64(c.maxCopied) || st.copied < int64(small)):
			t.Errorf("%s: %d bytes copied through the aligned buffer, want %d to %d", c.name, st.copied, small, c.maxCopied)
		}
		if err := FinishSharded(dir, 2, Meta{}, Layout{WorldSize: 1}); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, "iter_0000002", "rank_00000.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		hdr := int(binary.LittleEndian.Uint64(raw))
		if (8+hdr)%4096 != 0 || len(raw) != 8+hdr+4*n {
			t.Errorf("%s: header of %d bytes, file of %d: want the data (%d bytes) at a 4 KiB boundary, up to the end", c.name, hdr, len(raw), 4*n)
		}
		rd, err := Open(dir, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			want []float32
		}{{"w", whole}, {"v", whole[:cols*7]}} {
			got, _, err := rd.ReadWhole("model", tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s: tensor %s read back differs", c.name, tc.name)
			}
		}
		rd.Close()
	}
}

// directSupported reports whether files in dir accept O_DIRECT.
func directSupported(t *testing.T, dir string) bool {
	f, err := os.CreateTemp(dir, "probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	return setDirect(f, true) == nil
}

// TestShardedAliasedKeyRefused: a checkpoint.json whose record for tensor b
// names tensor a's stored bytes (file and key) must not load, whether the
// record keeps b's own CRC-32C or copies a's. The Reader used to remember
// checked bytes by file and key alone, so once a was read, b's record
// (with b's CRC) was never compared and b silently got a's values.
func TestShardedAliasedKeyRefused(t *testing.T) {
	for _, copyCRC := range []bool{false, true} {
		dir := t.TempDir()
		a := Piece{Group: "model", Name: "a", GlobalShape: []int{2, 3}, Block: Whole([]int{2, 3}), Data: []float32{1, 2, 3, 4, 5, 6}}
		b := Piece{Group: "model", Name: "b", GlobalShape: []int{2, 3}, Block: Whole([]int{2, 3}), Data: []float32{-1, -2, -3, -4, -5, -6}}
		saveSharded(t, dir, 5, [][]Piece{{a, b}})
		path := filepath.Join(dir, IterDirName(5), MetaFile)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m shardedMeta
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		rb := m.Tensors["model"]["b"]
		rb.Shards[0].Key = m.Tensors["model"]["a"].Shards[0].Key
		if copyCRC {
			rb.Shards[0].CRC32C = m.Tensors["model"]["a"].Shards[0].CRC32C
		}
		m.Tensors["model"]["b"] = rb
		raw, _ = json.Marshal(m)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Open(dir, -1)
		if err == nil {
			// Every load path reads a, then b, through one Reader.
			_, _, err = r.ReadWhole("model", "a")
			if err == nil {
				var got []float32
				got, _, err = r.ReadWhole("model", "b")
				if err == nil {
					t.Fatalf("copyCRC=%v: b loaded as %v (a's bytes)", copyCRC, got)
				}
			}
			r.Close()
		}
		if !strings.Contains(err.Error(), "model/a#0") {
			t.Errorf("copyCRC=%v: error %q does not name the shard", copyCRC, err)
		}
		if _, err := Load(dir, -1); err == nil {
			t.Errorf("copyCRC=%v: Load accepted the aliased shard", copyCRC)
		}
	}
}

// TestShardDataChecksEachRecord: two records naming the same stored bytes
// are each compared with their own CRC-32C (the Reader's cache is by
// record, not by file and key), even where Open's duplicate check is not
// in the way (a Reader built by hand).
func TestShardDataChecksEachRecord(t *testing.T) {
	dir := t.TempDir()
	a := Piece{Group: "model", Name: "a", GlobalShape: []int{4}, Block: Whole([]int{4}), Data: []float32{1, 2, 3, 4}}
	saveSharded(t, dir, 1, [][]Piece{{a}})
	r, err := Open(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := r.tensors["model"]["a"].Shards[0]
	if _, err := r.shardData(s); err != nil {
		t.Fatal(err)
	}
	s.CRC32C = "00000000"
	if _, err := r.shardData(s); err == nil || !strings.Contains(err.Error(), "CRC-32C") {
		t.Fatalf("second record with another CRC: %v", err)
	}
}
