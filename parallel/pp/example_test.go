package pp_test

import (
	"fmt"
	"os"

	"github.com/gotron/gotron/parallel/pp"
)

// The last of two pipeline ranks in 1F1B with three micro-batches: it
// receives each activation, runs forward and backward, and sends the
// gradient back (receiving the next activation first, as an odd rank).
func ExampleActions() {
	actions, err := pp.Actions(pp.Config{PP: 2, Microbatches: 3}, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range actions {
		fmt.Println(a)
	}
	// Output:
	// recv-act c0 m0 from 0
	// F c0 m0
	// B c0 m0
	// recv-act c0 m1 from 0
	// send-grad c0 m0 to 0
	// F c0 m1
	// B c0 m1
	// recv-act c0 m2 from 0
	// send-grad c0 m1 to 0
	// F c0 m2
	// B c0 m2
	// send-grad c0 m2 to 0
}

// Two model chunks per rank: rank 0 runs 2·(PP−1) + (VPP−1)·G = 4 warm-up
// forwards.
func ExampleWriteTimeline() {
	err := pp.WriteTimeline(os.Stdout, pp.Config{PP: 2, VPP: 2, Microbatches: 4}, 1, 2)
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// interleaved-1f1b: PP=2 VPP=2 M=4 G=2; one column per time unit, forward 1, backward 2; "." idle
	// rank 0 | F0a F1a F0b F1b F2a .   B0b     F3a B1b     F2b B0a     F3b B1a     .   B2b     .   B3b     B2a     B3a
	// rank 1 | .   F0a F1a F0b B0b     F1b B1b     F2a B0a     F3a B1a     F2b B2b     F3b B3b     B2a     B3a
	// makespan 27 units; idle 6 of 54 rank-units, bubble 6/48 = 0.125 of compute ((PP-1)/(VPP*M) = 0.125)
}

func ExampleConfig_Validate() {
	err := pp.Config{PP: 4, VPP: 2, Microbatches: 6}.Validate()
	fmt.Println(err)
	// Output:
	// pp: --num-microbatches 6 with --microbatch-group-size-per-virtual-pipeline-stage 4 (default: --pipeline-model-parallel-size) leaves a last group of 2 micro-batches; Megatron wants the remainder M mod G to be 0 or at least --pipeline-model-parallel-size 4, since a shorter last group stalls the pipeline on its own dependencies
}
