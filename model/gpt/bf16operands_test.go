package gpt

import (
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
// layer's bfloat16 input beside the float32 one it keeps for the other
// ops (2 bytes an element more, without recomputation: rows × Σ inputs'
// widths / 2 float32 slots); the float32 inputs would go only once the ops
// producing them wrote bfloat16.
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
			want := c.NumLayers*perLayer + rows*c.HiddenSize/2
			if simLive-offLive != want {
				t.Errorf("%s: the tape holds %d float32 slots with bfloat16 operands, %d without: %d more, want %d (the bfloat16 inputs)", what, simLive, offLive, simLive-offLive, want)
			}
			t.Logf("%s: activations after the forward: %d bytes with bfloat16 operands, %d on float32 operands (+%.1f%%)", what, 4*simLive, 4*offLive, 100*float64(simLive-offLive)/float64(offLive))
		}
	}
}
