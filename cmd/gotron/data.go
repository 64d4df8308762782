package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/bits"

	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/tokenizer"
)

const (
	dataSynopsis        = "data samples|inspect ..."
	dataSamplesSynopsis = "data samples --data-path ... --seq-length L [--split 969,30,1 --seed 1234 --num-samples TRAIN,VALID,TEST --split-name train --first K]"
	dataInspectSynopsis = "data inspect PREFIX"
)

// cmdData dispatches 'gotron data samples' and 'gotron data inspect'.
func cmdData(ctx context.Context, env *cli, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(env.stdout, "Usage:\n  gotron %s\n  gotron %s\n", dataSamplesSynopsis, dataInspectSynopsis)
		if len(args) == 0 {
			return fmt.Errorf("missing subcommand: samples or inspect")
		}
		return errHelp
	}
	switch args[0] {
	case "samples":
		return cmdDataSamples(ctx, env, args[1:])
	case "inspect":
		return cmdDataInspect(env, args[1:])
	}
	msg := fmt.Sprintf("unknown subcommand %q: want samples or inspect", args[0])
	if s := nearest(args[0], []string{"samples", "inspect"}); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return fmt.Errorf("%s", msg)
}

// sampleJSON is one line of 'gotron data samples'.
type sampleJSON struct {
	Split       string    `json:"split"`
	Index       int       `json:"index"`
	Tokens      []int32   `json:"tokens"`
	Labels      []int32   `json:"labels"`
	LossMask    []float32 `json:"loss_mask"`
	PositionIDs []int32   `json:"position_ids"`
	DocIDs      []int32   `json:"doc_ids,omitempty"`
	DatasetID   *int      `json:"dataset_id,omitempty"`
}

func cmdDataSamples(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("data samples", dataSamplesSynopsis)
	var d dataArgs
	addDataArgs(fs, &d)
	seqLength := fs.Int("seq-length", 0, "tokens per sample")
	seed := fs.Int64("seed", 1234, "random seed of the shuffles")
	numSamples := fs.String("num-samples", "", "requested TRAIN,VALID,TEST samples (None or empty: one epoch)")
	splitName := fs.String("split-name", "train", "split to print: train, valid or test")
	first := fs.Int("first", 10, "print samples 0..K-1 (0: all)")
	eodID := fs.Int("eod-id", -1, "end-of-document id when no --tokenizer-type is given")
	hideMock := func(name string) bool { return name != "mock-data" } // shared with train, refused here
	if err := parseFlagsHelp(fs, args, env.stdout, helpText{synopsis: dataSamplesSynopsis, show: hideMock}); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if d.mock {
		return fmt.Errorf("--mock-data: data samples reads real datasets only")
	}
	if err := checkNumbers(dataSamplesNumberRules, flagText(fs)); err != nil {
		return err
	}
	split, ok := map[string]datagpt.Split{"train": datagpt.Train, "valid": datagpt.Valid, "test": datagpt.Test}[*splitName]
	if !ok {
		return fmt.Errorf("--split-name %q: want train, valid or test", *splitName)
	}
	ns, err := parseNumSamples(*numSamples)
	if err != nil {
		return err
	}
	eod := int32(*eodID)
	var tok tokenizer.Tokenizer
	if d.tok.Type != "" {
		if tok, err = tokenizer.New(d.tok); err != nil {
			return err
		}
		eod = int32(tok.EOD())
	} else if eod < 0 && (d.masks != datagpt.MaskOptions{}) {
		return fmt.Errorf("--reset-position-ids, --reset-attention-mask and --eod-mask-loss need the EOD id: give --tokenizer-type (and its files) or --eod-id")
	}
	cfg, err := d.gptConfig(*seqLength, *seed, ns, eod)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if cfg.FIM, err = d.fim.fimConfig(tok, given, false); err != nil {
		return err
	}
	if cfg.FIM != nil {
		if w := fimMissingWarning(cfg.FIM); w != "" {
			fmt.Fprintf(env.stderr, "gotron data samples: %s\n", w)
		}
	}
	ds, err := datagpt.Build(ctx, cfg)
	if err != nil {
		return err
	}
	defer ds.Close()
	src := ds.Split(split)
	if src == nil {
		return fmt.Errorf("the %s split is empty with these --split/--*-data-path flags", split)
	}
	n := src.Len()
	if n == 0 {
		return fmt.Errorf("the %s split has no samples of --seq-length %d: its documents hold fewer than the %d tokens one sample needs", split, *seqLength, *seqLength+1)
	}
	if *first > 0 {
		n = min(n, *first)
	}
	enc := json.NewEncoder(env.stdout)
	_, blended := src.(*datagpt.Blended)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, err := src.Sample(i)
		if err != nil {
			return err
		}
		line := sampleJSON{Split: split.String(), Index: i, Tokens: s.Tokens, Labels: s.Labels, LossMask: s.LossMask, PositionIDs: s.PositionIDs, DocIDs: s.DocIDs}
		if blended {
			id := s.DatasetID
			line.DatasetID = &id
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}

func cmdDataInspect(env *cli, args []string) error {
	fs := newFlags("data inspect", dataInspectSynopsis)
	if err := parseFlags(fs, args, env.stdout, dataInspectSynopsis); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one dataset prefix (PREFIX.bin and PREFIX.idx), got %d arguments", fs.NArg())
	}
	ds, err := indexed.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer ds.Close()
	var tokens int64
	minLen, maxLen := int32(-1), int32(0)
	var hist [33]int64 // bucket b: lengths in [2^(b-1), 2^b), bucket 0: empty
	for i := 0; i < ds.NumSequences(); i++ {
		l := ds.SequenceLength(i)
		tokens += int64(l)
		if minLen < 0 || l < minLen {
			minLen = l
		}
		maxLen = max(maxLen, l)
		hist[bits.Len32(uint32(l))]++
	}
	empty := 0
	for k := 0; k < ds.NumDocuments(); k++ {
		if ds.DocumentIndex(k) == ds.DocumentIndex(k+1) {
			empty++
		}
	}
	w := env.stdout
	fmt.Fprintf(w, "dataset    %s\n", ds.Prefix)
	fmt.Fprintf(w, "dtype      %s (code %d)\n", ds.DType, uint8(ds.DType))
	fmt.Fprintf(w, "documents  %d (%d empty)\n", ds.NumDocuments(), empty)
	fmt.Fprintf(w, "sequences  %d\n", ds.NumSequences())
	fmt.Fprintf(w, "tokens     %d\n", tokens)
	fmt.Fprintf(w, "multimodal %v\n", ds.Multimodal)
	if ds.NumSequences() > 0 {
		fmt.Fprintf(w, "length     min %d, mean %.1f, max %d tokens per sequence\n", minLen, float64(tokens)/float64(ds.NumSequences()), maxLen)
	}
	fmt.Fprintln(w, "sequence length histogram:")
	for b, c := range hist {
		if c == 0 {
			continue
		}
		lo, hi := 0, 0
		if b > 0 {
			lo, hi = 1<<(b-1), 1<<b-1
		}
		fmt.Fprintf(w, "  %10d – %-10d %d\n", lo, hi, c)
	}
	return nil
}
