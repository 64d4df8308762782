package ckpt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/gotron/gotron/ckpt/safetensors"
)

// A rank's shard file is written in the order of its pieces, with the
// safetensors header padded with spaces (which the format allows after the
// JSON) so that the data start at a multiple of directAlign. The background
// writer (WriteShardsInBackground, --async-save) writes it with O_DIRECT:
// the device reads the pieces by DMA and the CPU does no page-cache copy
// and no writeback, work that, on a machine whose cores all run training
// kernels, would preempt them. Pieces laid back to back from the start of
// a buffer from AlignedFloat32s (the --async-save snapshot) are aligned
// like their place in the file and are written straight from that memory;
// only the blocks where one piece ends and the next begins, and small
// pieces, are copied through an aligned buffer. Where the filesystem or the
// OS refuses O_DIRECT, and for a synchronous save (WriteShards), the same
// bytes are written through the page cache.

// directAlign is the alignment of O_DIRECT writes (memory address, file
// offset and length): 4 KiB, the largest logical block size of common
// devices.
const directAlign = 4096

// AlignedFloat32s returns a zeroed slice of n float32s whose first element
// is aligned to 4 KiB: pieces laid back to back from its start are written
// by WriteShardsInBackground straight from their memory with O_DIRECT.
func AlignedFloat32s(n int) []float32 {
	const k = directAlign / 4
	buf := make([]float32, n+k)
	off := 0
	if r := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) % directAlign; r != 0 {
		off = int(directAlign-r) / 4
	}
	return buf[off : off+n : off+n]
}

// alignedBytes returns n zeroed bytes starting at a directAlign-aligned
// address.
func alignedBytes(n int) []byte {
	buf := make([]byte, n+directAlign)
	off := 0
	if r := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) % directAlign; r != 0 {
		off = int(directAlign - r)
	}
	return buf[off : off+n : off+n]
}

// shardEntry is one tensor of a shard file: its key, dtype, stored shape
// and bytes.
type shardEntry struct {
	key   string
	dtype safetensors.DType
	shape []int
	data  []byte
}

// shardHeader returns the file's first bytes: the 8-byte header length and
// the JSON header listing entries in order, padded with spaces so that its
// length is a multiple of directAlign.
func shardHeader(entries []shardEntry) ([]byte, error) {
	names, tensors := make([]string, len(entries)), make([]safetensors.Tensor, len(entries))
	for i, e := range entries {
		names[i], tensors[i] = e.key, safetensors.Tensor{DType: e.dtype, Shape: e.shape, Data: e.data}
	}
	js, err := safetensors.HeaderJSON(names, tensors)
	if err != nil {
		return nil, err
	}
	n := (8 + len(js) + directAlign - 1) / directAlign * directAlign
	if n-8 > safetensors.MaxHeaderBytes {
		return nil, fmt.Errorf("safetensors header of %d bytes exceeds the limit of %d", n-8, safetensors.MaxHeaderBytes)
	}
	head := alignedBytes(n)
	putUint64LE(head, uint64(n-8))
	copy(head[8:], js)
	for i := 8 + len(js); i < n; i++ {
		head[i] = ' '
	}
	return head, nil
}

func putUint64LE(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// directMin is the smallest piece written straight from its memory;
// smaller ones, and pieces not aligned like their place in the file, go
// through an aligned buffer of directBuffer bytes.
const (
	directMin    = 64 << 10
	directBuffer = 1 << 20
)

// writeStats tells how a shard file was written.
type writeStats struct {
	direct bool  // with O_DIRECT (to the end, but the last partial block)
	copied int64 // bytes that went through the aligned buffer
}

// writeShardFile writes entries as a safetensors file at path (created; it
// must not exist) and fsyncs it; rel names it in errors. With direct it
// writes with O_DIRECT where the filesystem allows it: the data of an entry
// whose address is congruent with its file offset modulo directAlign (as
// in a buffer from AlignedFloat32s, entries back to back from its start)
// straight from its memory, the rest (small entries, the blocks where one
// entry ends and the next begins) through an aligned buffer, and the last
// partial block through the page cache. It returns the file's size.
func (s saver) writeShardFile(ctx context.Context, path, rel string, entries []shardEntry, direct bool) (fileRecord, writeStats, error) {
	var st writeStats
	head, err := shardHeader(entries)
	if err != nil {
		return fileRecord{}, st, fmt.Errorf("ckpt: write %s: %w", rel, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fileRecord{}, st, fmt.Errorf("ckpt: %w", err)
	}
	defer f.Close()
	cw := &chunkWriter{ctx: ctx, w: f, s: s, rel: rel, chunk: s.chunkBytes}
	if cw.chunk <= 0 {
		cw.chunk = writeChunkBytes
	}
	st.direct = direct && cw.chunk%directAlign == 0 && setDirect(f, true) == nil
	if st.direct {
		err = writeDirect(f, cw, head, entries, &st)
	} else {
		bw := bufio.NewWriterSize(cw, 1<<20)
		_, err = bw.Write(head)
		for _, e := range entries {
			if err != nil {
				break
			}
			_, err = bw.Write(e.data)
		}
		if err == nil {
			err = bw.Flush()
		}
	}
	if err != nil {
		return fileRecord{}, st, fmt.Errorf("ckpt: write %s: %w", rel, err)
	}
	s.at("fsync %s", rel)
	if err := f.Sync(); err != nil {
		return fileRecord{}, st, fmt.Errorf("ckpt: fsync %s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fileRecord{}, st, fmt.Errorf("ckpt: close %s: %w", rel, err)
	}
	return fileRecord{Bytes: cw.n}, st, nil
}

// writeDirect writes the file through cw, whose file has O_DIRECT set:
// head (a multiple of directAlign long, aligned), then the entries' data.
// Every write but the last starts at a multiple of directAlign in the file,
// from an aligned address, and is a multiple of directAlign long; the last
// partial block is written with O_DIRECT turned off. If the filesystem
// refuses a write (EINVAL), the rest goes through the page cache.
func writeDirect(f *os.File, cw *chunkWriter, head []byte, entries []shardEntry, st *writeStats) error {
	write := func(p []byte) error {
		if st.direct {
			n, err := cw.Write(p)
			if err == nil || !errors.Is(err, syscall.EINVAL) {
				return err
			}
			st.direct = false
			if err := setDirect(f, false); err != nil {
				return err
			}
			p = p[n:]
		}
		_, err := cw.Write(p)
		return err
	}
	if err := write(head); err != nil {
		return err
	}
	buf := alignedBytes(directBuffer)
	fill := 0 // bytes in buf; the file offset is a multiple of directAlign
	off := 0  // file offset of the entry's data, from the data section
	for _, e := range entries {
		d := e.data
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(d)))
		if len(d) >= directMin && int(addr%directAlign) == off%directAlign {
			// Complete the buffer's last block from d; d's rest then
			// starts at a block boundary of the file and of memory.
			k := copy(buf[fill:(fill+directAlign-1)/directAlign*directAlign], d)
			fill, d = fill+k, d[k:]
			st.copied += int64(k)
			if err := write(buf[:fill]); err != nil {
				return err
			}
			fill = 0
			a := len(d) / directAlign * directAlign
			if err := write(d[:a]); err != nil {
				return err
			}
			d = d[a:]
		}
		off += len(e.data)
		st.copied += int64(len(d))
		for len(d) > 0 {
			k := copy(buf[fill:], d)
			fill, d = fill+k, d[k:]
			if fill == len(buf) {
				if err := write(buf); err != nil {
					return err
				}
				fill = 0
			}
		}
	}
	a := fill / directAlign * directAlign
	if err := write(buf[:a]); err != nil {
		return err
	}
	if a < fill {
		if st.direct {
			if err := setDirect(f, false); err != nil {
				return err
			}
		}
		if _, err := cw.Write(buf[a:fill]); err != nil {
			return err
		}
	}
	return nil
}
