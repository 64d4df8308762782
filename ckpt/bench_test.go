package ckpt

import (
	"context"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// benchCheckpoint is 64 MiB of F32 in 16 tensors.
func benchCheckpoint() (*Checkpoint, int64) {
	g := map[string]safetensors.Tensor{}
	for i := range 16 {
		g[string(rune('a'+i))] = safetensors.Tensor{DType: safetensors.F32, Shape: []int{1 << 20}, Data: make([]byte, 4<<20)}
	}
	return &Checkpoint{Groups: map[string]map[string]safetensors.Tensor{GroupModel: g}}, 64 << 20
}

// BenchmarkSave measures a full crash-safe save (write, fsyncs, renames).
func BenchmarkSave(b *testing.B) {
	c, n := benchCheckpoint()
	dir := b.TempDir()
	b.SetBytes(n)
	it := 0
	for b.Loop() {
		it++
		if err := Save(context.Background(), dir, it, c); err != nil {
			b.Fatal(err)
		}
		if err := Prune(dir, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad measures Load (mmap, header validation, CRC-32C of every
// byte) from the page cache.
func BenchmarkLoad(b *testing.B) {
	c, n := benchCheckpoint()
	dir := b.TempDir()
	if err := Save(context.Background(), dir, 1, c); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n)
	for b.Loop() {
		got, err := Load(dir, 1)
		if err != nil {
			b.Fatal(err)
		}
		got.Close()
	}
}
