package gpt

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultSplit is Megatron's legacy --split used when --data-path is given
// without one.
const DefaultSplit = "969, 30, 1"

// DefaultSurplus is mid_level_dataset_surplus: each weighted blend member is
// built 0.5% larger than its share.
const DefaultSurplus = 0.005

// Blend is a list of dataset path prefixes with optional weights, the value
// of --data-path (or --train-data-path etc.).
type Blend struct {
	// Prefixes are the .bin/.idx path prefixes.
	Prefixes []string
	// Weights, when non-nil, has one positive weight per prefix; nil means
	// unweighted (members contribute in proportion to their sizes).
	Weights []float64
}

// Empty reports whether the blend names no dataset.
func (b Blend) Empty() bool { return len(b.Prefixes) == 0 }

// ParseBlend parses a --data-path style list like Megatron's
// get_blend_from_list: "30 a 70 b" gives prefixes [a b] and weights
// [30 70]; an odd-length list, or one whose even positions are not all
// numbers, is a list of unweighted prefixes. flag names the flag in errors.
func ParseBlend(flag string, args []string) (Blend, error) {
	var b Blend
	var fields []string
	for _, a := range args {
		fields = append(fields, strings.Fields(a)...)
	}
	if len(fields) == 0 {
		return b, nil
	}
	if len(fields)%2 == 0 {
		weights := make([]float64, 0, len(fields)/2)
		for i := 0; i < len(fields); i += 2 {
			w, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				weights = nil
				break
			}
			weights = append(weights, w)
		}
		if weights != nil {
			for i := 1; i < len(fields); i += 2 {
				b.Prefixes = append(b.Prefixes, fields[i])
			}
			b.Weights = weights
			return b, b.validate(flag)
		}
	}
	b.Prefixes = fields
	return b, b.validate(flag)
}

func (b Blend) validate(flag string) error {
	if b.Weights != nil && len(b.Weights) != len(b.Prefixes) {
		return fmt.Errorf("gpt: %s: %d weights for %d prefixes", flag, len(b.Weights), len(b.Prefixes))
	}
	for i, w := range b.Weights {
		if !(w > 0) || math.IsInf(w, 0) {
			return fmt.Errorf("gpt: %s: weight %v of %s must be positive", flag, w, b.Prefixes[i])
		}
	}
	if len(b.Prefixes) > MaxDatasets {
		return fmt.Errorf("gpt: %s: %d datasets; at most %d", flag, len(b.Prefixes), MaxDatasets)
	}
	return nil
}

// Config configures the train/valid/test datasets, with Megatron's flag
// names in the field comments. Fill it, call Validate (Build does), then
// Build.
type Config struct {
	// SeqLength is --seq-length, tokens per sample (> 1). Required.
	SeqLength int
	// Seed is --seed (0 ≤ Seed < 2³²). 0 is a valid seed; the CLI default
	// is Megatron's 1234.
	Seed int64
	// Split is --split, e.g. "969,30,1". Empty means DefaultSplit when Blend
	// is set; it must be empty with per-split blends.
	Split string
	// Blend is --data-path.
	Blend Blend
	// SplitBlends are --train-data-path, --valid-data-path and
	// --test-data-path; they exclude Blend. A split without one is not built.
	SplitBlends [3]Blend
	// NumSamples are the requested train/valid/test sample counts
	// (get_train_valid_test_num_samples); AllSamples means Megatron's None
	// (one epoch; an exhaustive unweighted blend).
	NumSamples [3]int64
	// CachePath is --data-cache-path. Empty means Megatron's default,
	// <prefix>/cache/GPTDataset_indices for GPT indices and no cache for
	// blend indices.
	CachePath string
	// NoCache builds indices in memory only (no Megatron equivalent).
	NoCache bool
	// Masks are --reset-position-ids, --reset-attention-mask, --eod-mask-loss.
	Masks MaskOptions
	// NoExtraToken turns off add_extra_token_to_sequence (samples then hold
	// exactly SeqLength tokens and the last label is padding).
	NoExtraToken bool
	// KeepLastPartialValidation keeps the last, padded validation sample
	// (drop_last_partial_validation_sequence=False).
	KeepLastPartialValidation bool
	// Surplus is mid_level_dataset_surplus; 0 means DefaultSurplus.
	Surplus float64
	// EOD is the tokenizer's end-of-document id.
	EOD int32
	// TokenizerIdentifiers is the "tokenizer" entry of the cache
	// description (Megatron: the tokenizer's unique_identifiers). Caches are
	// shared with runs whose identifiers match exactly.
	TokenizerIdentifiers []Field
	// VocabSize is the tokenizer's vocabulary size: a sample holding a token
	// id outside [0, VocabSize) is an error naming the data file, the
	// sequence and the position (such an id would train an embedding row
	// of the padded vocabulary that no text produces, and serve refuses it).
	// 0 means unchecked.
	VocabSize int
	// FIM, when set, makes every dataset Megatron's GPTFIMDataset
	// (--fim-data): fill-in-the-middle samples drawn from one random stream
	// per dataset, seeded with Seed, in the order samples are read.
	FIM *FIMConfig
}

func (c *Config) extraToken() int {
	if c.NoExtraToken {
		return 0
	}
	return 1
}

func (c *Config) surplus() float64 {
	if c.Surplus == 0 {
		return DefaultSurplus
	}
	return c.Surplus
}

// perSplit reports whether per-split blends are in use.
func (c *Config) perSplit() bool {
	return !c.SplitBlends[0].Empty() || !c.SplitBlends[1].Empty() || !c.SplitBlends[2].Empty()
}

// Validate checks the configuration; errors name the offending flag.
func (c *Config) Validate() error {
	if c.SeqLength < 2 {
		return fmt.Errorf("gpt: --seq-length must be > 1, got %d", c.SeqLength)
	}
	if c.Seed < 0 || c.Seed > math.MaxUint32 {
		return fmt.Errorf("gpt: --seed must be in [0, 2^32), got %d", c.Seed)
	}
	if c.VocabSize < 0 || c.VocabSize > math.MaxInt32 {
		return fmt.Errorf("gpt: vocabulary size %d: want 0 (unchecked) to 2^31-1 (token ids are int32)", c.VocabSize)
	}
	if c.Surplus < 0 || math.IsNaN(c.Surplus) {
		return fmt.Errorf("gpt: mid-level dataset surplus must be ≥ 0, got %v", c.Surplus)
	}
	for i, n := range c.NumSamples {
		if n < AllSamples {
			return fmt.Errorf("gpt: requested %d %s samples", n, Split(i))
		}
	}
	flags := [3]string{"--train-data-path", "--valid-data-path", "--test-data-path"}
	switch {
	case c.perSplit() && !c.Blend.Empty():
		return fmt.Errorf("gpt: --data-path and --train/valid/test-data-path are mutually exclusive")
	case c.perSplit() && c.Split != "":
		return fmt.Errorf("gpt: --split %q cannot be used with --train/valid/test-data-path", c.Split)
	case c.perSplit():
		for i, b := range c.SplitBlends {
			if err := b.validate(flags[i]); err != nil {
				return err
			}
		}
	case c.Blend.Empty():
		return fmt.Errorf("gpt: no data: set --data-path or --train-data-path/--valid-data-path/--test-data-path")
	default:
		if err := c.Blend.validate("--data-path"); err != nil {
			return err
		}
		if _, err := ParseSplit(c.split()); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) split() string {
	if c.Split == "" {
		return DefaultSplit
	}
	return c.Split
}
