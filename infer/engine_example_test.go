package infer_test

import (
	"context"
	"fmt"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// The engine is a synchronous core: Add queues requests, each Step runs one
// batched forward over every sequence it can schedule and returns what
// happened. Run it by hand (as tests do), or through a Runner.
func ExampleEngine() {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 64, InitMethodStd: 0.3}
	m, _ := gpt.New(cfg, tensor.NewRNG(1))
	e, _ := infer.NewEngine(m, infer.EngineConfig{BlockTokens: 4})
	a, _ := e.Add(infer.Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sampling: infer.Sampling{TopK: 1}})
	b, _ := e.Add(infer.Request{Prompt: []int32{7, 8}, MaxTokens: 2, Sampling: infer.Sampling{TopK: 1}})
	count := map[infer.SeqID]int{}
	steps := 0
	for e.HasWork() {
		evs, _ := e.Step()
		steps++
		for _, ev := range evs {
			count[ev.Seq]++
			if ev.Finish != "" {
				fmt.Printf("sequence %d: %d tokens, %s\n", ev.Seq, count[ev.Seq], ev.Finish)
			}
		}
	}
	fmt.Println("steps:", steps, "blocks used:", e.Stats().KVBlocksUsed, a, b)
	// Output:
	// sequence 1: 2 tokens, length
	// sequence 0: 4 tokens, length
	// steps: 4 blocks used: 0 0 1
}

// A Runner steps the engine on its own goroutine; streams deliver each
// request's events.
func ExampleRunner() {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 64, InitMethodStd: 0.3}
	m, _ := gpt.New(cfg, tensor.NewRNG(1))
	e, _ := infer.NewEngine(m, infer.EngineConfig{})
	r := infer.NewRunner(e)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()

	s, _ := r.Submit(ctx, infer.Request{Prompt: []int32{1, 2, 3}, MaxTokens: 3, Sampling: infer.Sampling{TopK: 1}})
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			break
		}
		if ev.Finish != "" {
			fmt.Println("finished:", ev.Finish, ev.CompletionTokens, "tokens")
		}
	}
	stop()
	<-done
	// Output: finished: length 3 tokens
}
