package gpt

import (
	"math"
	"os"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// bf16OperandStep runs one --bf16 training step of c's model on dev (its
// weights registered for bfloat16 copies) and returns the loss, every
// gradient and the tape's activations after the forward, in float32
// slots.
func bf16OperandStep(t *testing.T, c Config, bt Batch, dev tensor.Device, rc Recompute) (float32, [][]float32, int) {
	t.Helper()
	m := stageModel(t, c)
	m.Recompute = rc
	m.ToDevice(dev)
	tensor.NewBF16Weights(m.Params())
	tp := tensor.NewTape()
	tp.SetMatmulPrecision(tensor.MatmulBF16)
	b := onDevice(bt, dev)
	loss := m.Loss(tp, m.Forward(tp, b, tensor.NewRNG(3), true), b)
	live := tp.LiveFloats()
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	var grads [][]float32
	for _, p := range m.Params() {
		grads = append(grads, tensor.ToHost(p.Grad).Float32s())
	}
	return tensor.ToHost(loss).Float32s()[0], grads, live
}

// TestSimBF16OperandsModelStep: a --bf16 training step of GPT-2- and
// Llama-style models on the simulated device with bfloat16 GEMM operands
// (every linear layer's weights from their bfloat16 copies, inputs and
// output gradients cast once) gives the CPU's loss and gradients bit for
// bit, with every recomputation mode. The tape then holds each linear
// layer's bfloat16 input (2 bytes an element, without recomputation:
// rows × Σ inputs' widths / 2 float32 slots) and no longer the float32
// outputs of the norms and activations that only linear layers read
// (rows × their widths): fewer bytes than on float32 operands.
func TestSimBF16OperandsModelStep(t *testing.T) {
	for _, c := range []Config{gpt2Tiny(), llamaTiny()} {
		c, bt := deviceCase(c)
		for _, rc := range deviceRecomputes {
			before := tensor.BF16GemmOperandCounts()
			cl, cg, _ := bf16OperandStep(t, c, bt, tensor.CPU, rc)
			mid := tensor.BF16GemmOperandCounts()
			sl, sg, simLive := bf16OperandStep(t, c, bt, tensor.Sim, rc)
			d := tensor.BF16GemmOperandCounts().Sub(mid)
			what := c.Activation.String()
			sameBits(t, what+" loss", []float32{sl}, []float32{cl})
			for i := range cg {
				sameBits(t, what+" gradient", sg[i], cg[i])
			}
			if cpu := mid.Sub(before); cpu.BF16OperandProducts != 0 || cpu.WeightCasts+cpu.ActCasts != 0 || cpu.FP32OperandProducts == 0 {
				t.Errorf("%s: the CPU's counts %v: want its products on float32 operands, no casts", what, cpu)
			}
			// 4 linear layers a layer and the output layer
			linears := int64(4*c.NumLayers + 1)
			products := 3 * linears
			if rc.Full { // every layer's forward again
				products += int64(4 * c.NumLayers)
			}
			if d.FP32OperandProducts != 0 || d.BF16OperandProducts != products || d.WeightCasts != linears {
				t.Errorf("%s %+v: sim counts %v: want %d products on bfloat16 operands, %d weight casts (once each, recomputation too)", what, rc, d, products, linears)
			}
			// the norms' kernels (the input norms', the MLP's fused
			// with the residual add, the final norm's) write the linear
			// layers' bfloat16 operands, again when a layer's forward
			// is recomputed; the others are cast
			fused := int64(2*c.NumLayers + 1)
			if rc.Full {
				fused += int64(2 * c.NumLayers)
			}
			// every forward product's input and every output gradient
			operands := (products - 2*linears) + linears
			if d.FusedCasts != fused || d.ActCasts+d.FusedCasts != operands {
				t.Errorf("%s %+v: sim counts %v: want %d operands written by the norms, the rest of the %d linear inputs and output gradients cast", what, rc, d, fused, operands)
			}
			if rc != (Recompute{}) {
				continue
			}
			prev := tensor.SetSimBF16GemmOperands(false)
			_, _, offLive := bf16OperandStep(t, c, bt, tensor.Sim, rc)
			tensor.SetSimBF16GemmOperands(prev)
			rows := bt.Tokens.Numel()
			ffn := c.FFNHiddenSize
			if ffn == 0 {
				ffn = 4 * c.HiddenSize
			}
			// inputs: QKV and fc1 read the hidden state, proj the
			// attention's output (hidden wide), fc2 the activation (ffn
			// wide); the output layer the final norm's output
			perLayer := 3*rows*c.HiddenSize/2 + rows*ffn/2
			added := c.NumLayers*perLayer + rows*c.HiddenSize/2
			// gone: the float32 outputs of the two norms and the
			// activation a layer, and of the final norm, which only
			// the linear layers read (tensor.Tape.ForwardDone); the
			// attention's output stays (its backward reads it)
			gone := c.NumLayers*rows*(2*c.HiddenSize+ffn) + rows*c.HiddenSize
			if simLive-offLive != added-gone {
				t.Errorf("%s: the tape holds %d float32 slots with bfloat16 operands, %d without: %+d, want %+d (%d of bfloat16 inputs, %d of float32 outputs read by linear layers only)", what, simLive, offLive, simLive-offLive, added-gone, added, gone)
			}
			t.Logf("%s: activations after the forward: %d bytes with bfloat16 operands, %d on float32 operands (%+.1f%%)", what, 4*simLive, 4*offLive, 100*float64(simLive-offLive)/float64(offLive))
		}
	}
}

// TestBF16OperandsMemory124M measures (GOTRON_BF16_MEMORY=1; about a
// minute on two cores, so not in the default run) the tape's activations
// after the forward and the loss of GPT-2 124M (gpt2-small, one sequence
// of 256 tokens, no dropout) under --bf16: on the CPU, on the simulated
// device on float32 operands (the CUDA backend without gemm-bf16) and on
// bfloat16 operands (with it); docs/design/cuda.md quotes the numbers.
func TestBF16OperandsMemory124M(t *testing.T) {
	if os.Getenv("GOTRON_BF16_MEMORY") == "" {
		t.Skip("set GOTRON_BF16_MEMORY=1 to measure GPT-2 124M's activations (about a minute)")
	}
	c, err := Preset("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	const seq = 256
	tokens := make([]int32, seq)
	for i := range tokens {
		tokens[i] = int32((i*7919 + 13) % c.VocabSize)
	}
	bt := Batch{Tokens: tensor.FromInt32(tokens, 1, seq), Labels: tensor.FromInt32(append(tokens[1:], 0), 1, seq)}
	m := stageModel(t, c)
	measure := func(dev tensor.Device) (int, float32) {
		m.ToDevice(dev)
		tensor.NewBF16Weights(m.Params())
		tp := tensor.NewTape()
		tp.SetMatmulPrecision(tensor.MatmulBF16)
		b := onDevice(bt, dev)
		loss := m.Loss(tp, m.Forward(tp, b, nil, true), b)
		return tp.LiveFloats(), tensor.ToHost(loss).Float32s()[0]
	}
	cpuLive, cpuLoss := measure(tensor.CPU)
	prev := tensor.SetSimBF16GemmOperands(false)
	offLive, offLoss := measure(tensor.Sim)
	tensor.SetSimBF16GemmOperands(prev)
	onLive, onLoss := measure(tensor.Sim)
	m.ToDevice(tensor.CPU)
	if math.Float32bits(offLoss) != math.Float32bits(cpuLoss) || math.Float32bits(onLoss) != math.Float32bits(cpuLoss) {
		t.Errorf("losses: cpu %v, sim on float32 operands %v, on bfloat16 operands %v: want the same bits", cpuLoss, offLoss, onLoss)
	}
	mb := func(n int) float64 { return float64(4*n) / 1e6 }
	t.Logf("GPT-2 124M, 1×%d tokens, --bf16, activations after the forward: CPU %.1f MB, sim on float32 operands %.1f MB, sim on bfloat16 operands %.1f MB (%+.1f%%)",
		seq, mb(cpuLive), mb(offLive), mb(onLive), 100*float64(onLive-offLive)/float64(offLive))
	if onLive >= offLive {
		t.Errorf("bfloat16 operands hold %d float32 slots, float32 operands %d: want fewer", onLive, offLive)
	}
}
