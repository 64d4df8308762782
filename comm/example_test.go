package comm_test

import (
	"context"
	"fmt"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
)

// Four ranks average their gradients, then the tensor-parallel pairs
// {0,1} and {2,3} each sum a value.
func Example() {
	out := make([][]float32, 4)
	err := inproc.Run(context.Background(), 4, func(ctx context.Context, pg comm.ProcessGroup) error {
		grad := []float32{float32(pg.Rank()), 1}
		if err := pg.AllReduce(ctx, comm.Float32s(grad), comm.Avg); err != nil {
			return err
		}
		r := pg.Rank()
		tp, err := pg.NewGroup([]int{r / 2 * 2, r/2*2 + 1})
		if err != nil {
			return err
		}
		x := []float32{float32(r)}
		if err := tp.AllReduce(ctx, comm.Float32s(x), comm.Sum); err != nil {
			return err
		}
		out[r] = append(grad, x[0])
		return nil
	})
	fmt.Println(out, err)
	// Output: [[1.5 1 1] [1.5 1 1] [1.5 1 5] [1.5 1 5]] <nil>
}
