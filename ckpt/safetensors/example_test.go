package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log"

	"github.com/gotron/gotron/ckpt/safetensors"
)

func Example() {
	w, _ := safetensors.FromFloat32(safetensors.F32, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	var buf bytes.Buffer
	if _, err := safetensors.Encode(&buf, map[string]safetensors.Tensor{"w": w}, map[string]string{"format": "pt"}); err != nil {
		log.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(buf.Bytes()) // header length, a multiple of 8
	fmt.Printf("%d %s\n", n, buf.Bytes()[8:8+n])

	f, err := safetensors.Parse("w.safetensors", buf.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	t, _ := f.Tensor("w")
	vals := make([]float32, t.NumElements())
	t.DecodeFloat32(vals)
	fmt.Println(t.DType, t.Shape, vals)
	// Output:
	// 88 {"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}
	// F32 [2 3] [1 2 3 4 5 6]
}
