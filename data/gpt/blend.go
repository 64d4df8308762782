package gpt

import (
	"fmt"
	"math"
)

// MaxDatasets is the most datasets a blend may hold (int16 dataset ids).
const MaxDatasets = 32766

// BuildBlendingIndices is helpers.cpp build_blending_indices: for each of
// size samples, pick the dataset whose share lags its weight the most
// (argmax of w_j·max(s,1) − c_j, ties to the lowest j) and take its next
// sample. weights should be normalized.
func BuildBlendingIndices(weights []float64, size int) (datasetIndex []int16, datasetSampleIndex []int64) {
	counts := make([]int64, len(weights))
	datasetIndex = make([]int16, size)
	datasetSampleIndex = make([]int64, size)
	for s := range size {
		x := math.Max(float64(s), 1)
		best, bestErr := 0, math.Inf(-1)
		for j, w := range weights {
			// The conversion forbids fusing into an FMA, which would
			// change ties relative to the C++ reference.
			e := float64(w*x) - float64(counts[j])
			if e > bestErr {
				best, bestErr = j, e
			}
		}
		datasetIndex[s] = int16(best)
		datasetSampleIndex[s] = counts[best]
		counts[best]++
	}
	return datasetIndex, datasetSampleIndex
}

// BuildExhaustiveBlendingIndices is helpers.cpp
// build_exhaustive_blending_indices: the same greedy choice with weights
// sizes/Σsizes, among datasets not yet exhausted, until every dataset j has
// given exactly sizes[j] samples. Every size must be positive.
func BuildExhaustiveBlendingIndices(sizes []int64) (datasetIndex []int16, datasetSampleIndex []int64, err error) {
	var total int64
	for j, s := range sizes {
		if s <= 0 {
			return nil, nil, fmt.Errorf("gpt: blend: dataset %d has %d samples; every blended dataset needs at least one", j, s)
		}
		total += s
	}
	weights := make([]float64, len(sizes))
	for j, s := range sizes {
		weights[j] = float64(s) / float64(total)
	}
	counts := make([]int64, len(sizes))
	datasetIndex = make([]int16, total)
	datasetSampleIndex = make([]int64, total)
	for s := range total {
		x := math.Max(float64(s), 1)
		best, bestErr := -1, -math.MaxFloat64
		for j, w := range weights {
			if counts[j] == sizes[j] {
				continue
			}
			if e := float64(w*x) - float64(counts[j]); e > bestErr {
				best, bestErr = j, e
			}
		}
		datasetIndex[s] = int16(best)
		datasetSampleIndex[s] = counts[best]
		counts[best]++
	}
	return datasetIndex, datasetSampleIndex, nil
}

// Blended is Megatron's BlendedDataset: sample i is sample
// DatasetSampleIndex[i] of dataset DatasetIndex[i].
type Blended struct {
	// Datasets are the mid-level datasets, in blend order.
	Datasets []*Dataset
	// DatasetIndex and DatasetSampleIndex are the blending indices.
	DatasetIndex       []int16
	DatasetSampleIndex []int64
	// Description is the JSON whose MD5 (Hash) names the cache files.
	Description, Hash string
}

// Len returns the number of samples.
func (b *Blended) Len() int { return len(b.DatasetIndex) }

// Sample returns sample i with its DatasetID set.
func (b *Blended) Sample(i int) (Sample, error) { return b.SampleForWorker(i, 0) }

// SampleForWorker is Sample as read by data-loader worker worker (see
// Dataset.SampleForWorker).
func (b *Blended) SampleForWorker(i, worker int) (Sample, error) {
	if i < 0 || i >= len(b.DatasetIndex) {
		return Sample{}, fmt.Errorf("gpt: blended sample %d out of range [0, %d)", i, len(b.DatasetIndex))
	}
	j := int(b.DatasetIndex[i])
	s, err := b.Datasets[j].SampleForWorker(int(b.DatasetSampleIndex[i]), worker)
	s.DatasetID = j
	return s, err
}

// blendWeights are either normalized floats (a sized blend) or the dataset
// lengths as ints (an exhaustive blend); both feed the description.
type blendWeights struct {
	floats []float64
	ints   []int64
}

func (w blendWeights) json() any {
	out := []any{}
	for _, f := range w.floats {
		out = append(out, f)
	}
	for _, n := range w.ints {
		out = append(out, n)
	}
	return out
}

// newBlended builds (or loads from cacheDir, when not "") a BlendedDataset.
// size < 0 means exhaustive over the datasets' lengths.
func newBlended(datasets []*Dataset, w blendWeights, size int64, split Split, cacheDir string) (*Blended, error) {
	if len(datasets) > MaxDatasets {
		return nil, fmt.Errorf("gpt: blend of %d datasets; at most %d", len(datasets), MaxDatasets)
	}
	ids := make([]any, len(datasets))
	for i, d := range datasets {
		ids[i] = d.identifiers
	}
	var sz any
	if size >= 0 {
		sz = size
	}
	b := &Blended{Datasets: datasets}
	b.Description = pyJSON([]Field{{"class", "BlendedDataset"}, {"datasets", ids}, {"split", split.String()}, {"weights", w.json()}, {"size", sz}})
	b.Hash = md5Hex(b.Description)
	files := cacheFiles(cacheDir, b.Hash, "BlendedDataset", split, "dataset_index", "dataset_sample_index")
	if arrs, ok := loadCache(files, b.Description); ok && b.adopt(arrs, size) {
		return b, nil
	}
	if size >= 0 {
		b.DatasetIndex, b.DatasetSampleIndex = BuildBlendingIndices(w.floats, int(size))
	} else {
		var err error
		if b.DatasetIndex, b.DatasetSampleIndex, err = BuildExhaustiveBlendingIndices(w.ints); err != nil {
			return nil, err
		}
	}
	counts := make([]int64, len(datasets))
	for _, j := range b.DatasetIndex {
		counts[j]++
	}
	for j, c := range counts {
		if c > int64(datasets[j].Len()) {
			return nil, fmt.Errorf("gpt: the %s blend requests %d samples from dataset %d (%s) in excess of its size %d; "+
				"increase the mid-level dataset surplus", split, c, j, datasets[j].Path, datasets[j].Len())
		}
	}
	if files != nil {
		n := len(b.DatasetIndex)
		di := make([]int64, n)
		for i, v := range b.DatasetIndex {
			di[i] = int64(v)
		}
		err := saveCache(files, b.Description, []npyArray{
			{descr: "<i2", shape: []int{n}, data: di},
			{descr: "<i8", shape: []int{n}, data: b.DatasetSampleIndex},
		})
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// adopt takes cached blending indices if they are consistent with the
// datasets; otherwise the caller rebuilds them.
func (b *Blended) adopt(arrs []*npyArray, size int64) bool {
	di, dsi := arrs[0], arrs[1]
	if len(di.data) != len(dsi.data) || (size >= 0 && int64(len(di.data)) != size) {
		return false
	}
	b.DatasetIndex = make([]int16, len(di.data))
	for i, v := range di.data {
		if v < 0 || int(v) >= len(b.Datasets) || dsi.data[i] < 0 || dsi.data[i] >= int64(b.Datasets[v].Len()) {
			return false
		}
		b.DatasetIndex[i] = int16(v)
	}
	b.DatasetSampleIndex = dsi.data
	return true
}
