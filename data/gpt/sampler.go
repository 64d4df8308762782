package gpt

import (
	"context"
	"fmt"
	"io"
)

// SamplerConfig configures Megatron's 'single' MegatronPretrainingSampler
// (--dataloader-type single; megatron/training/datasets/data_samplers.py).
type SamplerConfig struct {
	// ConsumedSamples is where to resume: the checkpoint's
	// consumed_train_samples (0 for a fresh run).
	ConsumedSamples int64
	// MicroBatchSize is --micro-batch-size (> 0).
	MicroBatchSize int
	// DataParallelRank and DataParallelSize place this rank; a zero size
	// means 1.
	DataParallelRank, DataParallelSize int
	// KeepLast yields the final incomplete chunk (drop_last=False); Megatron
	// drops it.
	KeepLast bool
}

// Sampler walks global sample ids from ConsumedSamples to the dataset
// length; each chunk of MicroBatchSize·DataParallelSize consecutive ids is
// one micro-step, of which this rank takes ids [rank·mbs, (rank+1)·mbs). It
// is a pure function of its config and not safe for concurrent use.
type Sampler struct {
	cfg   SamplerConfig
	total int64
	next  int64
}

// NewSampler returns a sampler over total samples.
func NewSampler(total int, cfg SamplerConfig) (*Sampler, error) {
	if cfg.DataParallelSize == 0 {
		cfg.DataParallelSize = 1
	}
	switch {
	case total <= 0:
		return nil, fmt.Errorf("gpt: sampler: no samples to consume (dataset length %d)", total)
	case cfg.ConsumedSamples < 0 || cfg.ConsumedSamples >= int64(total):
		return nil, fmt.Errorf("gpt: sampler: consumed samples %d outside [0, %d): no samples left to consume", cfg.ConsumedSamples, total)
	case cfg.MicroBatchSize <= 0:
		return nil, fmt.Errorf("gpt: sampler: --micro-batch-size must be > 0, got %d", cfg.MicroBatchSize)
	case cfg.DataParallelSize < 0 || cfg.DataParallelRank < 0 || cfg.DataParallelRank >= cfg.DataParallelSize:
		return nil, fmt.Errorf("gpt: sampler: data-parallel rank %d outside [0, %d)", cfg.DataParallelRank, cfg.DataParallelSize)
	}
	return &Sampler{cfg: cfg, total: int64(total), next: cfg.ConsumedSamples}, nil
}

// Next returns this rank's sample ids for the next micro-step, or false when
// the dataset is exhausted.
func (s *Sampler) Next() ([]int64, bool) {
	mbs, dp := int64(s.cfg.MicroBatchSize), int64(s.cfg.DataParallelSize)
	chunk := mbs * dp
	n := min(chunk, s.total-s.next)
	if n <= 0 || (n < chunk && !s.cfg.KeepLast) {
		return nil, false
	}
	lo, hi := int64(s.cfg.DataParallelRank)*mbs, int64(s.cfg.DataParallelRank+1)*mbs
	if n < chunk { // Megatron slices the partial chunk the same way
		lo, hi = min(lo, n), min(hi, n)
	}
	ids := make([]int64, 0, hi-lo)
	for i := lo; i < hi; i++ {
		ids = append(ids, s.next+i)
	}
	s.next += n
	return ids, true
}

// Consumed returns the global number of samples consumed so far (what a
// checkpoint stores as consumed_train_samples).
func (s *Sampler) Consumed() int64 { return s.next }

// Batch is one micro-batch, stacked row-major: B rows of SeqLength.
type Batch struct {
	// Indices are the global sample ids, one per row.
	Indices []int64
	// B is the number of rows and SeqLength the columns.
	B, SeqLength int
	// Tokens, Labels, PositionIDs: (B, SeqLength).
	Tokens, Labels, PositionIDs []int32
	// LossMask: (B, SeqLength).
	LossMask []float32
	// DocIDs: (B, SeqLength), nil unless --reset-attention-mask.
	DocIDs []int32
}

// Batches yields the micro-batches of one data-parallel rank.
type Batches struct {
	src     Source
	sampler *Sampler
}

// NewBatches iterates src for the rank described by cfg.
func NewBatches(src Source, cfg SamplerConfig) (*Batches, error) {
	s, err := NewSampler(src.Len(), cfg)
	if err != nil {
		return nil, err
	}
	return &Batches{src: src, sampler: s}, nil
}

// Consumed returns the global samples consumed so far.
func (b *Batches) Consumed() int64 { return b.sampler.Consumed() }

// Next returns the next micro-batch, or io.EOF when the dataset is done.
func (b *Batches) Next(ctx context.Context) (Batch, error) {
	if err := ctx.Err(); err != nil {
		return Batch{}, err
	}
	ids, ok := b.sampler.Next()
	if !ok {
		return Batch{}, io.EOF
	}
	out := Batch{Indices: ids, B: len(ids)}
	for _, id := range ids {
		s, err := b.src.Sample(int(id))
		if err != nil {
			return Batch{}, err
		}
		out.SeqLength = len(s.Tokens)
		out.Tokens = append(out.Tokens, s.Tokens...)
		out.Labels = append(out.Labels, s.Labels...)
		out.LossMask = append(out.LossMask, s.LossMask...)
		out.PositionIDs = append(out.PositionIDs, s.PositionIDs...)
		if s.DocIDs != nil {
			out.DocIDs = append(out.DocIDs, s.DocIDs...)
		}
	}
	return out, nil
}
