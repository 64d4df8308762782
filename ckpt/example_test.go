package ckpt_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
)

func Example() {
	dir, _ := os.MkdirTemp("", "save")
	defer os.RemoveAll(dir)

	w, _ := safetensors.FromFloat32(safetensors.BF16, []int{2, 2}, []float32{1, 2, 3, 4})
	c := &ckpt.Checkpoint{
		Meta:   ckpt.Meta{ConsumedTrainSamples: 3200, Args: json.RawMessage(`{"num_layers":2}`)},
		Groups: map[string]map[string]safetensors.Tensor{ckpt.GroupModel: {"w": w}},
	}
	if err := ckpt.Save(context.Background(), dir, 100, c); err != nil {
		log.Fatal(err)
	}

	got, err := ckpt.Load(dir, -1) // the latest
	if err != nil {
		log.Fatal(err)
	}
	defer got.Close()
	err = got.Expect(ckpt.GroupModel, map[string]ckpt.Spec{"w": {DType: safetensors.BF16, Shape: []int{4, 1}}})
	fmt.Println(got.Meta.Iteration, got.Meta.ConsumedTrainSamples)
	fmt.Println(err)
	// Output:
	// 100 3200
	// ckpt: iter_0000100/model.safetensors: tensor w has shape [2 2], model expects [4 1]
}
