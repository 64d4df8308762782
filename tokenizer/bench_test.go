package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// goSource is this package's hand-written Go source files, concatenated:
// the "Go source" text of the preprocess throughput target.
func goSource(b *testing.B) string {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		b.Fatal("no Go files", err)
	}
	var sb strings.Builder
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		if !strings.HasPrefix(string(src), "// Code generated") {
			sb.Write(src)
		}
	}
	return sb.String()
}

// cpuMBps reports throughput per CPU-second of this process (user+system,
// all threads), which a loaded machine disturbs less than wall time.
func cpuMBps(b *testing.B, bytesPerOp int) func() {
	before := cpuSeconds()
	return func() {
		if used := cpuSeconds() - before; used > 0 {
			b.ReportMetric(float64(bytesPerOp)*float64(b.N)/used/1e6, "MB/cpu-s")
		}
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkGPT2Encode reports GPT-2 encoding throughput (MB/s) on Go source
// with a warm word cache, as in a preprocess run over many documents.
func BenchmarkGPT2Encode(b *testing.B) {
	tok := gpt2Fixture(b)
	text := goSource(b)
	tok.Encode(text)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	defer cpuMBps(b, len(text))()
	for b.Loop() {
		tok.Encode(text)
	}
}

// BenchmarkGPT2EncodeColdCache is BenchmarkGPT2Encode with an empty word
// cache at every iteration (every distinct word runs BPE).
func BenchmarkGPT2EncodeColdCache(b *testing.B) {
	tok := gpt2Fixture(b)
	text := goSource(b)
	b.SetBytes(int64(len(text)))
	defer cpuMBps(b, len(text))()
	for b.Loop() {
		tok.bpe.cache = newWordCache()
		tok.Encode(text)
	}
}

// BenchmarkGPT2EncodeMultilingual is BenchmarkGPT2Encode on the
// multilingual corpus.
func BenchmarkGPT2EncodeMultilingual(b *testing.B) {
	tok := gpt2Fixture(b)
	text := string(readTestdata(b, "multilingual.txt.gz"))
	tok.Encode(text)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	defer cpuMBps(b, len(text))()
	for b.Loop() {
		tok.Encode(text)
	}
}

// BenchmarkSentencePieceEncode reports spm BPE (Llama-2 settings) and
// unigram throughput on the multilingual corpus, line by line.
func BenchmarkSentencePieceEncode(b *testing.B) {
	text := string(readTestdata(b, "multilingual.txt.gz"))
	lines := strings.Split(text, "\n")
	for _, name := range []string{"llama2_bpe", "unigram_nfkc"} {
		b.Run(name, func(b *testing.B) {
			sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", name+".model"))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			defer cpuMBps(b, len(text))()
			for b.Loop() {
				for _, l := range lines {
					sp.Encode(l)
				}
			}
		})
	}
}
