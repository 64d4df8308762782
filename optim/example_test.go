package optim_test

import (
	"fmt"
	"github.com/gotron/gotron/tensor"

	"github.com/gotron/gotron/optim"
)

// A minimal training loop: Megatron's iteration order with a cosine schedule
// counted in samples, gradient clipping and AdamW.
func Example() {
	w := &optim.Param{Name: "linear.weight", Data: tensor.FromFloat32([]float32{1, 2, 3, 4}, 2, 2), Grad: tensor.Zeros(2, 2)}
	b := &optim.Param{Name: "linear.bias", Data: tensor.FromFloat32([]float32{0.5, -0.5}, 2), Grad: tensor.Zeros(2)}
	for _, p := range []*optim.Param{w, b} {
		p.NoWeightDecay = optim.DefaultNoWeightDecay(p.Name, p.Data.Shape())
	}
	params := []*optim.Param{w, b}

	flags := optim.DefaultSchedulerFlags()
	flags.LR, flags.MinLR, flags.LRDecayStyle = 1e-2, 1e-3, optim.DecayCosine
	flags.TrainIters, flags.GlobalBatchSize, flags.LRWarmupIters = 4, 8, 1
	cfg, err := flags.Config()
	if err != nil {
		fmt.Println(err)
		return
	}
	sched, _ := optim.NewScheduler(cfg)
	opt, _ := optim.NewAdamW(optim.DefaultGroups(params), optim.AdamWConfig{})
	grads, _ := optim.NewGrads(params)
	mb, _ := optim.NewMicrobatches(optim.MicrobatchConfig{GlobalBatchSize: 8, MicroBatchSize: 2, DataParallelSize: 1})

	var consumed int64
	for it := 1; it <= 4; it++ {
		if err := mb.UpdateChecked(consumed); err != nil {
			fmt.Println(err)
			return
		}
		for _, p := range params { // stand-in for forward/backward
			for i := range p.Grad.Float32s() {
				p.Grad.Float32s()[i] = float32(i+1) * 0.5
			}
		}
		if grads.FoundInf() {
			continue
		}
		norm := grads.ClipGradNorm(1.0)
		sched.Apply(opt.Groups())
		fmt.Printf("iter %d: microbatches %d, lr %.5f, wd %.2f/%.2f, grad norm %.4f\n",
			it, mb.Num(), opt.Groups()[0].LR, opt.Groups()[0].WD, opt.Groups()[1].WD, norm)
		opt.Step()
		n := int64(mb.CurrentRunningGlobalBatchSize())
		sched.Step(n)
		consumed += n
	}
	fmt.Printf("weight %.5f, bias %.5f\n", w.Data.Float32s(), b.Data.Float32s())
	// Output:
	// iter 1: microbatches 4, lr 0.00000, wd 0.01/0.00, grad norm 2.9580
	// iter 2: microbatches 4, lr 0.01000, wd 0.01/0.00, grad norm 2.9580
	// iter 3: microbatches 4, lr 0.00775, wd 0.01/0.00, grad norm 2.9580
	// iter 4: microbatches 4, lr 0.00325, wd 0.01/0.00, grad norm 2.9580
	// weight [0.97879 1.97858 2.97837 3.97816], bias [0.47900 -0.52100]
}
