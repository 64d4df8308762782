package tensorboard_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/gotron/gotron/train/tensorboard"
)

// Example writes the scalars of one logged iteration as Megatron does: each
// tag at the iteration and its " vs samples" twin at the consumed samples.
func Example() {
	dir, err := os.MkdirTemp("", "tb")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	w, err := tensorboard.New(dir)
	if err != nil {
		log.Fatal(err)
	}
	iteration, consumed := int64(10), int64(80)
	for _, s := range []struct {
		tag   string
		value float64
	}{{tensorboard.TagLearningRate, 6e-4}, {tensorboard.TagBatchSize, 8}, {tensorboard.TagLMLoss, 7.25}} {
		if err := w.AddScalar(s.tag, s.value, iteration); err != nil {
			log.Fatal(err)
		}
		if err := w.AddScalar(tensorboard.VsSamples(s.tag), s.value, consumed); err != nil {
			log.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.HasPrefix(filepath.Base(w.Path()), "events.out.tfevents."))
	// Output: true
}
