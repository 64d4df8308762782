package tokenizer_test

import (
	"fmt"

	"github.com/gotron/gotron/tokenizer"
)

func ExampleNew() {
	tok, err := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeNull, VocabSize: 50257})
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := append(tokenizer.Tokenize(tok, "464 2068 7586"), tok.EOD())
	fmt.Println(ids, tokenizer.PaddedVocabSize(tok.VocabSize(), 128, 8))
	// Output: [464 2068 7586 50256] 51200
}

func ExampleLoadSentencePiece() {
	sp, err := tokenizer.LoadSentencePiece("testdata/spm/llama2_bpe.model")
	if err != nil {
		fmt.Println(err)
		return
	}
	llama, err := tokenizer.NewLlama2(sp)
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := llama.Tokenize("Hello world")
	fmt.Println(ids[0], llama.Decode(ids), llama.EOD())
	// Output: 1 Hello world 2
}
