package gpt

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// onDevice returns bt with every tensor copied to dev (the data loader's
// transfer).
func onDevice(bt Batch, dev tensor.Device) Batch {
	mv := func(t *tensor.Tensor) *tensor.Tensor {
		if t == nil {
			return nil
		}
		return t.ToDevice(dev)
	}
	return Batch{Tokens: mv(bt.Tokens), Positions: mv(bt.Positions), DocIDs: mv(bt.DocIDs), Labels: mv(bt.Labels), LossMask: mv(bt.LossMask)}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d: %v, want %v (bit for bit)", what, i, got[i], want[i])
		}
	}
}

// deviceCase is the device tests' model config and batch: c with dropout,
// and a batch of two sequences with document boundaries.
func deviceCase(c Config) (Config, Batch) {
	c.HiddenDropout, c.AttentionDropout = 0.1, 0.1
	bt := batches(c, 0, 1)[0]
	docs := make([]int32, 16)
	for i := range docs {
		docs[i] = int32(i % 8 / 5)
	}
	bt.DocIDs = tensor.FromInt32(docs, 2, 8)
	return c, bt
}

// deviceRecomputes are the recomputation modes the device tests run.
var deviceRecomputes = []Recompute{{}, {Selective: true}, {Full: true, Method: "uniform", NumLayers: 2}}

// deviceStep runs one training step (forward with dropout, loss, backward)
// of c's model on dev and returns the loss and every parameter's gradient,
// read back to the host.
func deviceStep(t *testing.T, c Config, bt Batch, dev tensor.Device, rc Recompute) (float32, [][]float32) {
	t.Helper()
	m := stageModel(t, c)
	m.Recompute = rc
	m.ToDevice(dev)
	tp := tensor.NewTape()
	b := onDevice(bt, dev)
	loss := m.Loss(tp, m.Forward(tp, b, tensor.NewRNG(3), true), b)
	if loss.Device() != dev {
		t.Fatalf("loss on %v, want %v", loss.Device(), dev)
	}
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	var grads [][]float32
	for _, p := range m.Params() {
		grads = append(grads, tensor.ToHost(p.Grad).Float32s())
	}
	return tensor.ToHost(loss).Float32s()[0], grads
}

// deviceDecode decodes bt's first tokens in chunks of 3, 1 and 2 with c's
// model on dev (its weights rounded to bf16 on the device when bf16) and
// returns the logits of each chunk.
func deviceDecode(t *testing.T, c Config, bt Batch, dev tensor.Device, bf16 bool) [][]float32 {
	t.Helper()
	m := stageModel(t, c)
	m.ToDevice(dev)
	if bf16 { // rounded on the device, through a host copy
		m.RoundToBF16()
		if err := m.CheckBF16(); err != nil {
			t.Fatal(err)
		}
	}
	kv := m.NewKVCache(8)
	toks := bt.Tokens.Int32s()
	var out [][]float32
	for _, n := range []int{3, 1, 2} {
		l, err := m.Decode(kv, toks[kv.Len:kv.Len+n])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// TestSimDeviceMatchesCPU: the model's training step (forward with dropout
// and document masks, loss, backward, recomputation) and decoding run on the
// simulated device — whose storage the model code cannot read — and give
// the CPU's losses, gradients and logits bit for bit, for GPT-2- and
// Llama-style models. Host transfers happen only at the edges: the batch in,
// the loss and logits out.
func TestSimDeviceMatchesCPU(t *testing.T) {
	for _, c := range []Config{gpt2Tiny(), llamaTiny()} {
		c, bt := deviceCase(c)
		for _, rc := range deviceRecomputes {
			cl, cg := deviceStep(t, c, bt, tensor.CPU, rc)
			before := tensor.SimTransfers()
			sl, sg := deviceStep(t, c, bt, tensor.Sim, rc)
			sameBits(t, c.Activation.String()+" loss", []float32{sl}, []float32{cl})
			for i := range cg {
				sameBits(t, c.Activation.String()+" gradient", sg[i], cg[i])
			}
			if d := tensor.SimTransfers(); d.ToHost == before.ToHost {
				t.Errorf("%v: no transfer counted", c.Activation)
			}
		}
		for _, bf16 := range []bool{false, true} {
			want, got := deviceDecode(t, c, bt, tensor.CPU, bf16), deviceDecode(t, c, bt, tensor.Sim, bf16)
			for i := range want {
				sameBits(t, c.Activation.String()+" decode logits", got[i], want[i])
			}
		}
	}
}

// TestSimMoEMatchesCPU: an MoE model's training step (aux loss and z-loss,
// the router's gradient through the experts) on the simulated device gives
// the CPU's loss and gradients bit for bit; the router reads the logits
// back and routes on the host there, and the dispatcher's permutation
// (Routing.PermutationOn) is the host's uploaded: two copies in a route,
// the rows and the probability indices, as before the GPU built them.
func TestSimMoEMatchesCPU(t *testing.T) {
	c, bt := deviceCase(moeTestConfig())
	cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{})
	before := tensor.SimTransfers()
	sl, sg := deviceStep(t, c, bt, tensor.Sim, Recompute{})
	d := tensor.SimTransfers().Sub(before)
	sameBits(t, "moe loss", []float32{sl}, []float32{cl})
	for i := range cg {
		sameBits(t, "moe gradient", sg[i], cg[i])
	}
	if s := d.Sites["tensor.(*Routing).PermutationOn"]; s.In != 2*int64(c.NumLayers) || s.Out != 0 {
		t.Errorf("the permutation was copied %+v (all sites %+v), want 2 uploads a layer (the rows and indices)", s, d.Sites)
	}
}
