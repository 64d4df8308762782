package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
)

const scoreSynopsis = "score --load DIR (--tokens-file F.json | --text \"...\") [--out logits.npy]"

// scoreFlags are gotron score's flags.
type scoreFlags struct {
	load, tokensFile, text, out string
	device                      string
	memFraction                 float64
	tok                         tokenizer.Config
}

func newScoreFlags() (*flag.FlagSet, *scoreFlags) {
	fs := newFlags("score", scoreSynopsis)
	f := &scoreFlags{}
	fs.StringVar(&f.load, "load", "", "a gotron checkpoint directory or a Hugging Face model directory")
	fs.StringVar(&f.tokensFile, "tokens-file", "", "JSON list of token ids to score")
	fs.StringVar(&f.text, "text", "", "text to tokenize and score (tokenizer: flags, or the files carried in --load)")
	fs.StringVar(&f.device, "device", "cpu", deviceUsage)
	fs.Float64Var(&f.memFraction, "device-memory-fraction", 0, memFractionUsage)
	fs.StringVar(&f.out, "out", "", "write logits [T, vocab] (float32, unpadded vocabulary) to this .npy file")
	fs.StringVar(&f.tok.Type, "tokenizer-type", "", "GPT2BPETokenizer, HuggingFaceTokenizer, Llama2Tokenizer, ... (default: from --load)")
	fs.StringVar(&f.tok.VocabFile, "vocab-file", "", "vocabulary file (GPT-2 vocab.json)")
	fs.StringVar(&f.tok.MergeFile, "merge-file", "", "BPE merges file (GPT-2 merges.txt)")
	fs.StringVar(&f.tok.Model, "tokenizer-model", "", "SentencePiece .model or tokenizer.json")
	return fs, f
}

func cmdScore(ctx context.Context, env *cli, args []string) error {
	fs, f := newScoreFlags()
	if err := parseFlags(fs, args, env.stdout, scoreSynopsis); err != nil {
		return err
	}
	if f.load == "" {
		return errors.New("--load is required")
	}
	if (f.tokensFile == "") == (f.text == "") {
		return errors.New("set exactly one of --tokens-file and --text")
	}
	dev, err := parseDevice(f.device, f.memFraction)
	if err != nil {
		return err
	}
	m, info, tokDir, err := loadAny(f.load)
	if err != nil {
		return err
	}
	warnNonFinite(env.stderr, f.load, m)
	var tok tokenizer.Tokenizer
	if f.text != "" || f.tok.Type != "" {
		if tok, err = checkpointTokenizer(f.tok, tokDir, m.Config.VocabSize, f.load, env.stderr); err != nil {
			return err
		}
	}
	vocab := info.VocabSize
	if vocab == 0 && tok != nil {
		vocab = tok.VocabSize()
	}
	if vocab == 0 || vocab > m.Config.VocabSize {
		vocab = m.Config.VocabSize
	}
	var ids []int32
	if f.text != "" {
		for _, id := range tok.Encode(f.text) {
			ids = append(ids, int32(id))
		}
	} else if ids, err = readTokensFile(f.tokensFile, vocab); err != nil {
		return err
	}
	if len(ids) == 0 {
		return errors.New("no tokens to score")
	}
	if len(ids) > m.Config.MaxPositionEmbeddings {
		return fmt.Errorf("%d tokens exceed the model's max_position_embeddings %d", len(ids), m.Config.MaxPositionEmbeddings)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.Config.CheckDevice(dev); err != nil {
		return err
	}
	m.ToDevice(dev)
	logits := scoreLogits(m, ids, vocab)
	if f.out != "" {
		if err := writeNPY(f.out, logits, len(ids), vocab); err != nil {
			return err
		}
	}
	printScores(env.stdout, ids, logits, vocab, tok)
	return nil
}

// readTokensFile reads a JSON list of token ids, each in [0, vocab).
func readTokensFile(path string, vocab int) ([]int32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	var raw []int64
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("--tokens-file %s: want a JSON list of token ids: %w", path, err)
	}
	ids := make([]int32, len(raw))
	for i, x := range raw {
		if x < 0 || x >= int64(vocab) {
			return nil, fmt.Errorf("--tokens-file %s: token %d at index %d is outside the vocabulary [0, %d)", path, x, i, vocab)
		}
		ids[i] = int32(x)
	}
	return ids, nil
}

// scoreLogits runs the model on one sequence and returns its logits (T,
// vocab), the padded vocabulary columns dropped.
func scoreLogits(m *gpt.Model, ids []int32, vocab int) []float32 {
	T, Vp := len(ids), m.Config.VocabSize
	dev := m.Params()[0].Device()
	tokens := tensor.FromInt32(ids, 1, T).ToDevice(dev)
	full := tensor.ToHost(m.Forward(tensor.NewTape(), gpt.Batch{Tokens: tokens}, nil, false)).Float32s() // (1, T, Vp)
	out := make([]float32, T*vocab)
	for t := range T {
		copy(out[t*vocab:(t+1)*vocab], full[t*Vp:t*Vp+vocab])
	}
	return out
}

// logProbs returns log p(ids[t] | ids[:t]) for t = 1..T-1, from logits
// (T, vocab) with a float64 log-softmax.
func logProbs(ids []int32, logits []float32, vocab int) []float64 {
	lp := make([]float64, 0, len(ids))
	for t := 1; t < len(ids); t++ {
		row := logits[(t-1)*vocab : t*vocab]
		mx := math.Inf(-1)
		for _, x := range row {
			mx = math.Max(mx, float64(x))
		}
		var s float64
		for _, x := range row {
			s += math.Exp(float64(x) - mx)
		}
		lp = append(lp, float64(row[ids[t]])-mx-math.Log(s))
	}
	return lp
}

// printScores prints one line per predicted token, then the perplexity
// exp(-mean log p) over the T-1 predictions.
func printScores(w io.Writer, ids []int32, logits []float32, vocab int, tok tokenizer.Tokenizer) {
	lp := logProbs(ids, logits, vocab)
	fmt.Fprintf(w, "%8s %8s %12s", "position", "token", "logprob")
	if tok != nil {
		fmt.Fprintf(w, "  text")
	}
	fmt.Fprintln(w)
	var sum float64
	for i, x := range lp {
		t := i + 1
		fmt.Fprintf(w, "%8d %8d %12.6f", t, ids[t], x)
		if tok != nil {
			fmt.Fprintf(w, "  %q", tok.Decode([]int{int(ids[t])}))
		}
		fmt.Fprintln(w)
		sum += x
	}
	if len(lp) == 0 {
		fmt.Fprintf(w, "tokens 1: nothing to predict (perplexity needs at least 2 tokens)\n")
		return
	}
	mean := sum / float64(len(lp))
	fmt.Fprintf(w, "tokens %d scored %d mean_logprob %.6f perplexity %.6f\n", len(ids), len(lp), mean, math.Exp(-mean))
}

// writeNPY writes x (rows, cols) as a NumPy .npy v1.0 file: magic, version,
// a little-endian uint16 header length, the header dict padded with spaces
// and a newline so the data starts at a multiple of 64 bytes, then the data.
func writeNPY(path string, x []float32, rows, cols int) error {
	hdr := fmt.Sprintf("{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols)
	const pre = 10 // magic (6) + version (2) + length (2)
	pad := 64 - (pre+len(hdr)+1)%64
	if pad == 64 {
		pad = 0
	}
	for range pad {
		hdr += " "
	}
	hdr += "\n"
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	w := bufio.NewWriter(f)
	w.WriteString("\x93NUMPY\x01\x00")
	binary.Write(w, binary.LittleEndian, uint16(len(hdr)))
	w.WriteString(hdr)
	binary.Write(w, binary.LittleEndian, x)
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("--out %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--out %s: %w", path, err)
	}
	return nil
}
