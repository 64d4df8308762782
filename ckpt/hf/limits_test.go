package hf

import (
	"runtime"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
)

// setVocab rewrites config.json's vocab_size in a fixture copy.
func setVocab(t *testing.T, dir, vocab string) {
	t.Helper()
	editConfig(t, dir, `"vocab_size": 260`, `"vocab_size": `+vocab)
}

// TestImportChecksShapesBeforeAllocating: a config.json whose vocab_size
// disagrees with the weights fails on the tensor's shape without allocating
// the model it describes (2e7 rows used to cost 2.5 GB and 30 s before the
// same error; 1e12 rows aborted the process out of memory, and are now
// refused as a size no tensor dimension can have).
func TestImportChecksShapesBeforeAllocating(t *testing.T) {
	for vocab, want := range map[string]string{
		"20000000":      "transformer.wte.weight has shape [260 32], config.json implies [20000000 32]",
		"1000000000000": "config.json: vocab_size: 1000000000000 is out of range: must be between 1 and 2147483647",
	} {
		t.Run(vocab, func(t *testing.T) {
			dir := copyFixture(t, "gpt2_tied_f32")
			setVocab(t, dir, vocab)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, _, err := LoadModel(dir)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v", err)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Fatalf("allocated %d MB before refusing", alloc>>20)
			}
		})
	}
}

// TestImportRefusesWhatCannotFit: a model larger than the machine's
// available memory is refused before allocation, naming both.
func TestImportRefusesWhatCannotFit(t *testing.T) {
	dir := copyFixture(t, "gpt2_tied_f32")
	small := func() (meminfo.Info, bool) { return meminfo.Info{TotalBytes: 2e6, AvailableBytes: 1e5}, true }
	_, _, err := Import(dir, ImportOptions{machine: small})
	if err == nil || !strings.Contains(err.Error(), "needs at least") || !strings.Contains(err.Error(), "0.1 MB available of 2.0 MB (/proc/meminfo)") {
		t.Fatalf("err = %v", err)
	}
	roomy := func() (meminfo.Info, bool) { return meminfo.Info{TotalBytes: 2e9, AvailableBytes: 1e9}, true }
	if _, _, err := Import(dir, ImportOptions{machine: roomy}); err != nil {
		t.Fatal(err)
	}
}

// TestImportPartChecksItsShare: a rank's part of a model (a pipeline
// stage's tensor-parallel slice) is checked against the machine's memory
// for what it holds, not for the whole model: on a machine the whole
// import does not fit, the part imports.
func TestImportPartChecksItsShare(t *testing.T) {
	dir := "testdata/llama_mha_untied_f16_sharded" // 25,760 values
	world, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	machine := func() (meminfo.Info, bool) { return meminfo.Info{TotalBytes: 2e6, AvailableBytes: 1e5}, true }
	if _, _, err := Import(dir, ImportOptions{machine: machine}); err == nil || !strings.Contains(err.Error(), "the float32 model of config.json") {
		t.Fatalf("the whole import on a machine with 0.1 MB: %v, want it refused", err)
	}
	part := func(gpt.Config) (gpt.Part, error) {
		return gpt.Part{FirstLayer: 1, EndLayer: 2, Head: true, TP: &tp.Region{Group: world[1]}}, nil
	}
	if _, _, err := Import(dir, ImportOptions{machine: machine, Part: part}); err != nil {
		t.Fatalf("the last stage's TP=2 slice on a machine with 0.1 MB: %v", err)
	}
	tiny := func() (meminfo.Info, bool) { return meminfo.Info{TotalBytes: 2e6, AvailableBytes: 1e4}, true }
	if _, _, err := Import(dir, ImportOptions{machine: tiny, Part: part}); err == nil || !strings.Contains(err.Error(), "this rank's part of the float32 model of config.json") {
		t.Fatalf("the last stage's TP=2 slice on a machine with 0.01 MB: %v, want it refused", err)
	}
}
