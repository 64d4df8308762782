package gpt

import (
	"fmt"
	"math"
	"path/filepath"

	"github.com/gotron/gotron/data/indexed"
)

// Dataset is Megatron's GPTDataset over one split of one .bin/.idx dataset.
// It is safe for concurrent Sample calls.
type Dataset struct {
	// Path is the dataset's path prefix and Split the split it serves.
	Path  string
	Split Split
	// Indices are the document, sample and shuffle indices.
	Indices *Indices
	// Description is the JSON whose MD5 (Hash) names the cache files.
	Description, Hash string

	src         *indexed.Dataset
	identifiers []Field
	seqLength   int
	extra       int
	eod         int32
	masks       MaskOptions
	vocab       int32 // ids must be below it; 0: unchecked
	fim         *fimStream
}

// Len returns the number of samples S.
func (d *Dataset) Len() int { return d.Indices.NumSamples() }

// Sample returns sample i (__getitem__): the shuffled sample's L+x tokens,
// padded with PadID if it is the last partial validation sample, split into
// tokens and labels, with masks and position ids.
//
// With Config.FIM the tokens are first transformed by the dataset's one
// random stream, so a sample depends on the samples read before it (as in
// Megatron's GPTFIMDataset); concurrent calls are safe but their order then
// decides the samples.
func (d *Dataset) Sample(i int) (Sample, error) { return d.SampleForWorker(i, 0) }

// SampleForWorker is Sample as read by Megatron's data-loader worker
// process worker (0 ≤ worker < MaxWorkers), which holds its own copy of the
// dataset: with FIM, its own copy of the random stream. Without FIM the
// worker does not matter.
func (d *Dataset) SampleForWorker(i, worker int) (Sample, error) {
	if worker < 0 || worker >= MaxWorkers {
		return Sample{}, fmt.Errorf("gpt: data-loader worker %d out of range [0, %d)", worker, MaxWorkers)
	}
	if i < 0 || i >= d.Len() {
		return Sample{}, fmt.Errorf("gpt: %s %s sample %d out of range [0, %d)", d.Path, d.Split, i, d.Len())
	}
	x := d.Indices
	j := x.ShuffleIndex[i]
	d0, o0 := x.SampleIndex[2*j], int(x.SampleIndex[2*j+1])
	d1, o1 := x.SampleIndex[2*j+2], int(x.SampleIndex[2*j+3])
	want := d.seqLength + d.extra
	text := make([]int32, 0, want)
	if d0 == d1 {
		seq := int(x.DocumentIndex[d0])
		text = d.src.AppendTokens(text, seq, o0, o1-o0+d.extra)
		if err := d.checkIDs(text, seq, o0); err != nil {
			return Sample{}, err
		}
	} else {
		for k := d0; k <= d1; k++ {
			seq := int(x.DocumentIndex[k])
			off, n := 0, 0
			switch {
			case k == d0:
				off, n = o0, int(d.src.SequenceLength(seq))-o0
			case k < d1:
				n = int(d.src.SequenceLength(seq))
			default:
				n = o1 + d.extra
			}
			before := len(text)
			text = d.src.AppendTokens(text, seq, off, n)
			if err := d.checkIDs(text[before:], seq, off); err != nil {
				return Sample{}, err
			}
		}
	}
	if len(text) > want {
		return Sample{}, fmt.Errorf("gpt: %s %s sample %d has %d tokens, want %d (corrupt index cache?)", d.Path, d.Split, i, len(text), want)
	}
	if d.fim != nil {
		text = d.fim.apply(text, worker)
	}
	for len(text) < want {
		text = append(text, PadID)
	}
	return makeSample(text, d.seqLength, d.extra, d.eod, d.masks), nil
}

// checkIDs checks the token ids read from sequence seq from position off
// against the tokenizer's vocabulary.
func (d *Dataset) checkIDs(ids []int32, seq, off int) error {
	if d.vocab <= 0 {
		return nil
	}
	for i, id := range ids {
		if id < 0 || id >= d.vocab {
			return fmt.Errorf("gpt: %s.bin: sequence %d, token %d: id %d is outside the tokenizer's vocabulary of %d (0 to %d): was the data preprocessed with another tokenizer?",
				d.Path, seq, off+i, id, d.vocab, d.vocab-1)
		}
	}
	return nil
}

// datasetParams are the inputs of newDataset shared by every split.
type datasetParams struct {
	cfg         *Config
	splitString any // the --split string, or nil with per-split paths
	splitMatrix *[3]*Bookend
	fim         *fimParams // nil without --fim-data
}

// newDataset builds one mid-level GPTDataset (sizes are src's sequence
// lengths), loading its indices from the
// cache when a matching, consistent cache exists and saving them otherwise.
func newDataset(src *indexed.Dataset, sizes []int32, split Split, indices []int32, numSamples int64, p datasetParams) (*Dataset, error) {
	c := p.cfg
	d := &Dataset{Path: src.Prefix, Split: split, src: src, seqLength: c.SeqLength, extra: c.extraToken(), eod: c.EOD, masks: c.Masks, vocab: int32(c.VocabSize)}
	var ns any
	if numSamples != AllSamples {
		ns = numSamples
	}
	tok := c.TokenizerIdentifiers
	if tok == nil {
		tok = []Field{}
	}
	class := "GPTDataset"
	if p.fim != nil {
		class = "GPTFIMDataset" // type(self).__name__
		d.fim = newFIMStream(p.fim, uint32(c.Seed))
	}
	d.identifiers = []Field{
		{"class", class}, {"dataset_path", src.Prefix}, {"num_samples", ns},
		{"index_split", split.String()}, {"random_seed", int64(c.Seed)}, {"sequence_length", c.SeqLength},
		{"split", p.splitString}, {"split_matrix", splitMatrixJSON(p.splitMatrix)}, {"tokenizer", tok},
	}
	d.Description = pyJSON(d.identifiers)
	d.Hash = md5Hex(d.Description)
	dir := c.CachePath
	if dir == "" {
		dir = filepath.Join(src.Prefix, "cache", "GPTDataset_indices")
	}
	if c.NoCache {
		dir = ""
	}
	files := cacheFiles(dir, d.Hash, "GPTDataset", split, "document_index", "sample_index", "shuffle_index")
	params := IndexParams{NumSamples: numSamples, SeqLength: c.SeqLength, ExtraToken: d.extra, Seed: uint32(c.Seed),
		DropLast: split != Valid || !c.KeepLastPartialValidation}
	if arrs, ok := loadCache(files, d.Description); ok {
		if x, ok := adoptIndices(arrs, sizes, indices, params); ok {
			d.Indices = x
			return d, nil
		}
	}
	x, err := BuildIndices(sizes, indices, params)
	if err != nil {
		return nil, fmt.Errorf("%w (dataset %s, %s split)", err, src.Prefix, split)
	}
	d.Indices = x
	if files != nil {
		if err := saveCache(files, d.Description, indexArrays(x)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// indexArrays are the three .npy arrays with Megatron's dtypes.
func indexArrays(x *Indices) []npyArray {
	doc := make([]int64, len(x.DocumentIndex))
	for i, v := range x.DocumentIndex {
		doc[i] = int64(v)
	}
	// int32 unless max(len(document_index), max(sizes)) exceeds it; sizes
	// are int32 already.
	sampleType := "<i4"
	if len(x.DocumentIndex) > math.MaxInt32 {
		sampleType = "<i8"
	}
	shuffleType := "<u4"
	if int64(x.NumSamples()) >= math.MaxUint32-1 {
		shuffleType = "<i8"
	}
	return []npyArray{
		{descr: "<i4", shape: []int{len(doc)}, data: doc},
		{descr: sampleType, shape: []int{x.NumSamples() + 1, 2}, data: x.SampleIndex},
		{descr: shuffleType, shape: []int{len(x.ShuffleIndex)}, data: x.ShuffleIndex},
	}
}

// adoptIndices accepts cached arrays only if they describe the indices
// BuildIndices would produce in shape and range: the right number of epochs'
// worth of documents, S+1 sample rows, a shuffle of length S, every value in
// bounds. This guards against a dataset rewritten in place under an old cache.
func adoptIndices(arrs []*npyArray, sizes, indices []int32, p IndexParams) (*Indices, bool) {
	doc, smp, shf := arrs[0], arrs[1], arrs[2]
	var tpe int64
	for _, i := range indices {
		if int(i) >= len(sizes) {
			return nil, false
		}
		tpe += int64(sizes[i])
	}
	e, separate, _, err := epochPlan(tpe, p)
	if err != nil || len(doc.data) != e*len(indices) || len(smp.shape) != 2 || smp.shape[1] != 2 {
		return nil, false
	}
	s := smp.shape[0] - 1
	if len(shf.data) != s {
		return nil, false
	}
	x := &Indices{DocumentIndex: make([]int32, len(doc.data)), SampleIndex: smp.data, ShuffleIndex: shf.data, Epochs: e, SeparateFinalEpoch: separate}
	for i, v := range doc.data {
		if v < 0 || int(v) >= len(sizes) {
			return nil, false
		}
		x.DocumentIndex[i] = int32(v)
	}
	// Rows walk forward through the token stream, and every row after the
	// first points at the last token a sample uses, so Sample never reads
	// outside a sequence.
	var pd, po int64
	for j := 0; j <= s; j++ {
		di, off := smp.data[2*j], smp.data[2*j+1]
		if di < 0 || int(di) >= len(doc.data) || off < 0 || off > int64(sizes[doc.data[di]]) {
			return nil, false
		}
		if j > 0 && (di < pd || di == pd && off < po || off+int64(p.ExtraToken) > int64(sizes[doc.data[di]])) {
			return nil, false
		}
		pd, po = di, off
	}
	for _, v := range shf.data {
		if v < 0 || int(v) >= s {
			return nil, false
		}
	}
	return x, true
}
