package hf_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gotron/gotron/ckpt/hf"
)

// Import a Hugging Face Llama checkpoint, then export it again as bfloat16.
func Example() {
	m, info, err := hf.LoadModel("testdata/llama_gqa_untied_f32")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s %s: %d layers, %d heads, %d kv heads, vocab %d padded to %d\n", info.Arch, info.DType,
		m.Config.NumLayers, m.Config.NumAttentionHeads, m.Config.NumQueryGroups, info.VocabSize, m.Config.VocabSize)

	dir, _ := os.MkdirTemp("", "hf-example")
	defer os.RemoveAll(dir)
	if err := hf.Export(context.Background(), dir, m, info, hf.ExportOptions{DType: "BF16"}); err != nil {
		fmt.Println(err)
		return
	}
	_, back, _ := hf.LoadModel(dir)
	fmt.Println("exported as", back.DType)
	// Output:
	// llama F32: 2 layers, 4 heads, 2 kv heads, vocab 100 padded to 128
	// exported as BF16
}
