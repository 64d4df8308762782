package parallel_test

import (
	"fmt"

	"github.com/gotron/gotron/parallel"
)

// Megatron's layout for 8 ranks with TP=2, PP=2 (so DP=2).
func ExampleNewLayout() {
	l, err := parallel.NewLayout(parallel.Config{WorldSize: 8, TP: 2, PP: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("tp:", l.Groups(parallel.TP))
	fmt.Println("dp:", l.Groups(parallel.DP))
	fmt.Println("pp:", l.Groups(parallel.PP))
	fmt.Println("rank 5's model-parallel group:", l.GroupOf(parallel.TPPP, 5))
	c, _ := l.Coords(5)
	fmt.Printf("rank 5: tp %d, dp %d, pp %d, last stage %v\n", c.TP, c.DP, c.PP, c.LastStage)
	// Output:
	// tp: [[0 1] [2 3] [4 5] [6 7]]
	// dp: [[0 2] [1 3] [4 6] [5 7]]
	// pp: [[0 4] [1 5] [2 6] [3 7]]
	// rank 5's model-parallel group: [0 1 4 5]
	// rank 5: tp 1, dp 0, pp 1, last stage true
}

func ExampleNewLayout_error() {
	_, err := parallel.NewLayout(parallel.Config{WorldSize: 12, TP: 8})
	fmt.Println(err)
	// Output: parallel: world size 12 is not divisible by TP·CP·PP = 8·1·1 = 8 (TP=8, CP=1, PP=1; DP = world/(TP·CP·PP) must be a whole number)
}
