package dist_test

import (
	"context"
	"fmt"

	"github.com/gotron/gotron/dist"
	"github.com/gotron/gotron/dist/inproc"
)

// Four ranks average their gradients, then the tensor-parallel pairs
// {0,1} and {2,3} each sum a value.
func Example() {
	out := make([][]float32, 4)
	err := inproc.Run(context.Background(), 4, func(ctx context.Context, pg dist.ProcessGroup) error {
		grad := []float32{float32(pg.Rank()), 1}
		if err := pg.AllReduce(ctx, dist.Float32s(grad), dist.Avg); err != nil {
			return err
		}
		r := pg.Rank()
		tp, err := pg.NewGroup([]int{r / 2 * 2, r/2*2 + 1})
		if err != nil {
			return err
		}
		x := []float32{float32(r)}
		if err := tp.AllReduce(ctx, dist.Float32s(x), dist.Sum); err != nil {
			return err
		}
		out[r] = append(grad, x[0])
		return nil
	})
	fmt.Println(out, err)
	// Output: [[1.5 1 1] [1.5 1 1] [1.5 1 5] [1.5 1 5]] <nil>
}
