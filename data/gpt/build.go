package gpt

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gotron/gotron/data/indexed"
)

// Source is a dataset the training loop reads: a GPT Dataset or a Blended
// one. Implementations are safe for concurrent Sample calls.
type Source interface {
	// Len returns the number of samples.
	Len() int
	// Sample returns sample i, 0 ≤ i < Len().
	Sample(i int) (Sample, error)
}

// WorkerSource is a Source whose samples may depend on the data-loader
// worker process that reads them in Megatron (FIM data: each worker draws
// from its own copy of the random stream).
type WorkerSource interface {
	Source
	// SampleForWorker is Sample(i) as worker worker, 0 ≤ worker < MaxWorkers, reads it.
	SampleForWorker(i, worker int) (Sample, error)
}

// MaxWorkers bounds the data-loader workers (--num-workers) a sample may be
// read by.
const MaxWorkers = 1024

var (
	_ WorkerSource = (*Dataset)(nil)
	_ WorkerSource = (*Blended)(nil)
)

// Datasets are the built splits; a split Megatron would not build (an empty
// --split entry, a missing per-split path) is nil. Close releases the
// memory-mapped files.
type Datasets struct {
	Train, Valid, Test Source

	files []*indexed.Dataset
}

// Split returns the dataset of split s.
func (d *Datasets) Split(s Split) Source {
	return [3]Source{d.Train, d.Valid, d.Test}[s]
}

// Close unmaps every opened .bin/.idx pair.
func (d *Datasets) Close() error {
	var errs []error
	for _, f := range d.files {
		errs = append(errs, f.Close())
	}
	d.files = nil
	return errors.Join(errs...)
}

// builder holds what Build shares between splits: opened files by prefix.
type builder struct {
	cfg   *Config
	out   *Datasets
	files map[string]*indexed.Dataset
	sizes map[string][]int32 // sequence lengths by prefix, read once
}

// Build builds the train, valid and test datasets as Megatron's
// BlendedMegatronDatasetBuilder does
// (megatron/core/datasets/blended_megatron_dataset_builder.py), loading
// indices from
// the cache when possible. ctx is checked between datasets.
func Build(ctx context.Context, cfg Config) (*Datasets, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var fim *fimParams
	if cfg.FIM != nil {
		var err error
		if fim, err = cfg.FIM.resolve(); err != nil {
			return nil, err
		}
	}
	b := &builder{cfg: &cfg, out: &Datasets{}, files: map[string]*indexed.Dataset{}, sizes: map[string][]int32{}}
	var srcs [3]Source
	var err error
	if cfg.perSplit() {
		for i, bl := range cfg.SplitBlends {
			if bl.Empty() {
				continue
			}
			var matrix [3]*Bookend
			matrix[i] = &Bookend{0, 1}
			var sizes [3]int64
			sizes[i] = cfg.NumSamples[i]
			var got [3]Source
			got, err = b.blend(ctx, bl, matrix, sizes, datasetParams{cfg: &cfg, fim: fim}, Split(i))
			if err != nil {
				break
			}
			srcs[i] = got[i]
		}
	} else {
		v, _ := ParseSplit(cfg.split())
		m := SplitMatrix(v)
		srcs, err = b.blend(ctx, cfg.Blend, m, cfg.NumSamples, datasetParams{cfg: &cfg, splitString: cfg.split(), splitMatrix: &m, fim: fim}, -1)
	}
	if err != nil {
		b.out.Close()
		return nil, err
	}
	b.out.Train, b.out.Valid, b.out.Test = srcs[0], srcs[1], srcs[2]
	return b.out, nil
}

// open maps a prefix once per Build.
func (b *builder) open(prefix string) (*indexed.Dataset, error) {
	if ds, ok := b.files[prefix]; ok {
		return ds, nil
	}
	ds, err := indexed.Open(prefix)
	if err != nil {
		return nil, fmt.Errorf("gpt: %w", err)
	}
	b.files[prefix] = ds
	b.sizes[prefix] = ds.SequenceLengths()
	b.out.files = append(b.out.files, ds)
	return ds, nil
}

// midLevel builds one prefix's GPTDatasets for every non-nil split.
func (b *builder) midLevel(ctx context.Context, prefix string, m [3]*Bookend, sizes [3]int64, p datasetParams) ([3]*Dataset, error) {
	var out [3]*Dataset
	src, err := b.open(prefix)
	if err != nil {
		return out, err
	}
	n := src.NumSequences()
	for i, be := range m {
		if be == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		beg, end := SplitRange(*be, n)
		if end <= beg {
			return out, fmt.Errorf("gpt: %s: the %s split is empty (%d sequences, --split %v)", prefix, Split(i), n, p.splitString)
		}
		indices := make([]int32, 0, end-beg)
		for s := beg; s < end; s++ {
			indices = append(indices, int32(s))
		}
		if out[i], err = newDataset(src, b.sizes[prefix], Split(i), indices, sizes[i], p); err != nil {
			return out, err
		}
	}
	return out, nil
}

// blend is _build_blended_dataset_splits for one blend: one prefix without
// weights gives plain GPTDatasets; otherwise each split is a BlendedDataset.
// only is the split the per-split path builds (−1: the --data-path path);
// there a lone prefix is used directly even with a weight.
func (b *builder) blend(ctx context.Context, bl Blend, m [3]*Bookend, sizes [3]int64, p datasetParams, only Split) ([3]Source, error) {
	var out [3]Source
	weights := normalize(bl.Weights)
	if len(bl.Prefixes) == 1 && (weights == nil || only >= 0) {
		ds, err := b.midLevel(ctx, bl.Prefixes[0], m, sizes, p)
		for i, d := range ds {
			if d != nil {
				out[i] = d
			}
		}
		return out, err
	}
	// Per dataset and split: the target share and the surplus-padded
	// mid-level request, ceil(ceil(N·w)·(1+surplus)).
	var targets, buffers [][3]int64
	for _, w := range weights {
		var t, buf [3]int64
		for i, n := range sizes {
			if m[i] == nil {
				continue
			}
			if n == AllSamples {
				return out, fmt.Errorf("gpt: a weighted blend needs a sample count for the %s split", Split(i))
			}
			share := math.Ceil(float64(n) * w)
			t[i], buf[i] = int64(share), int64(math.Ceil(share*(1+b.cfg.surplus())))
		}
		targets, buffers = append(targets, t), append(buffers, buf)
	}
	members := make([][3]*Dataset, len(bl.Prefixes))
	for j, prefix := range bl.Prefixes {
		req := [3]int64{AllSamples, AllSamples, AllSamples}
		if weights != nil {
			req = buffers[j]
		}
		var err error
		if members[j], err = b.midLevel(ctx, prefix, m, req, p); err != nil {
			return out, err
		}
	}
	for i := range m {
		if m[i] == nil {
			continue
		}
		ds := make([]*Dataset, len(members))
		for j := range members {
			ds[j] = members[j][i]
		}
		var w blendWeights
		size := int64(AllSamples)
		if weights != nil {
			w.floats = weights
			size = 0
			for j := range targets {
				size += targets[j][i]
			}
		} else {
			lengths := make([]float64, len(ds))
			var total int64
			for j, d := range ds {
				lengths[j] = float64(d.Len())
				total += int64(d.Len())
			}
			if sizes[i] == AllSamples {
				for _, d := range ds {
					w.ints = append(w.ints, int64(d.Len()))
				}
			} else {
				w.floats = normalize(lengths)
				size = min(sizes[i], total)
			}
		}
		cache := b.cfg.CachePath
		if b.cfg.NoCache {
			cache = ""
		}
		bd, err := newBlended(ds, w, size, Split(i), cache)
		if err != nil {
			return out, err
		}
		out[i] = bd
	}
	return out, nil
}

// normalize divides by the sum like Megatron's normalize (numpy.sum, then
// an elementwise division).
func normalize(w []float64) []float64 {
	if w == nil {
		return nil
	}
	sum := pairwiseSum(w)
	out := make([]float64, len(w))
	for i, v := range w {
		out[i] = v / sum
	}
	return out
}

// pairwiseSum is numpy's pairwise_sum for float64: a plain loop below 8
// items, 8 interleaved accumulators up to 128, halves (rounded to a
// multiple of 8) above.
func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		s := 0.0
		for _, v := range a {
			s += v
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for k := range r {
				r[k] += a[i+k]
			}
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += a[i]
		}
		return s
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(a[:n2]) + pairwiseSum(a[n2:])
	}
}
