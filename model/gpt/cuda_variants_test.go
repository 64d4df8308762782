package gpt

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// The model variants whose CUDA kernels are built but have not yet run on a
// GPU, each behind its GOTRON_CUDA_UNVERIFIED feature (CheckDeviceEnv).

// sqreluTiny is gpt2Tiny with the squared ReLU (--squared-relu).
func sqreluTiny() Config {
	c := gpt2Tiny()
	c.Activation = SquaredReLU
	return c
}

// outputGateTiny is llamaTiny with the attention output gate
// (--attention-output-gate).
func outputGateTiny() Config {
	c := llamaTiny()
	c.AttentionOutputGate = true
	return c
}

// gdnTiny is gdnGoldenConfig's hybrid model (gated delta net layers with
// GQA, attention layers) without the attention output gate.
func gdnTiny() Config {
	c := gdnGoldenConfig()
	c.AttentionOutputGate = false
	return c
}

// TestCheckDeviceUnverified: on --device cuda the squared ReLU, the
// output gate, multi-latent attention, the gated delta net and DeepSeek
// sparse attention are refused,
// naming the GOTRON_CUDA_UNVERIFIED feature that allows them and that they
// have not run on a GPU, and allowed when the variable names them (or is 1
// or all). The CPU and the simulated device take them all.
func TestCheckDeviceUnverified(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOTRON_CUDA_UNVERIFIED" {
				return v
			}
			return ""
		}
	}
	for _, c := range []struct {
		name    string
		cfg     Config
		flag    string
		feature string
	}{
		{"sqrelu", sqreluTiny(), "--squared-relu", "sqrelu"},
		{"output-gate", outputGateTiny(), "--attention-output-gate", "output-gate"},
		{"mla", mlaTiny(), "--multi-latent-attention", "mla"},
		{"mla-wide", mlaWideTiny(), "--multi-latent-attention", "mla"},
		{"gdn", gdnTiny(), "--experimental-attention-variant gated_delta_net", "gdn"},
	} {
		err := c.cfg.CheckDeviceEnv(tensor.CUDA, env(""))
		if err == nil || !strings.Contains(err.Error(), c.flag+" with --device cuda") ||
			!strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED="+c.feature) || !strings.Contains(err.Error(), "not run on a GPU") {
			t.Errorf("%s without GOTRON_CUDA_UNVERIFIED: %v, want a refusal naming %s, the feature and that it has not run on a GPU", c.name, err, c.flag)
		}
		if err := c.cfg.CheckDeviceEnv(tensor.CUDA, env("cp,moe-router")); err == nil {
			t.Errorf("%s with GOTRON_CUDA_UNVERIFIED=cp,moe-router: allowed", c.name)
		}
		for _, v := range []string{c.feature, "1", "all", "cp, " + c.feature} {
			if err := c.cfg.CheckDeviceEnv(tensor.CUDA, env(v)); err != nil {
				t.Errorf("%s with GOTRON_CUDA_UNVERIFIED=%q: %v", c.name, v, err)
			}
		}
		for _, dev := range []tensor.Device{tensor.CPU, tensor.Sim} {
			if err := c.cfg.CheckDeviceEnv(dev, env("")); err != nil {
				t.Errorf("%s on %v: %v", c.name, dev, err)
			}
		}
	}
	both := outputGateTiny()
	both.Activation = SquaredReLU
	if err := both.CheckDeviceEnv(tensor.CUDA, env("sqrelu")); err == nil || !strings.Contains(err.Error(), "output-gate") {
		t.Errorf("squared ReLU and output gate with only sqrelu named: %v, want the output gate refused", err)
	}
	m, _, _ := newDSAGoldenModel(t, "dsa_dense_loss") // DSA on MLA: both named
	for v, ok := range map[string]bool{"mla": false, "dsa": false, "mla,dsa": true, "1": true} {
		err := m.Config.CheckDeviceEnv(tensor.CUDA, env(v))
		if ok != (err == nil) || (!ok && !strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED=")) {
			t.Errorf("DSA with GOTRON_CUDA_UNVERIFIED=%s: %v", v, err)
		}
	}
	if err := m.Config.CheckDeviceEnv(tensor.CUDA, env("mla")); err == nil || !strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED=dsa") {
		t.Errorf("DSA with only mla named: %v, want a refusal naming dsa", err)
	}
	gated := gdnGoldenConfig() // gated delta net and output gate
	if err := gated.CheckDeviceEnv(tensor.CUDA, env("gdn")); err == nil || !strings.Contains(err.Error(), "output-gate") {
		t.Errorf("gated delta net and output gate with only gdn named: %v, want the output gate refused", err)
	}
}

// mlaTiny is TestMLASimDeviceMatchesCPU's MLA model: YaRN, a query latent,
// v heads (5 channels) padded to the q·k heads' 10.
func mlaTiny() Config {
	c := gpt2Tiny()
	c.MLA = DefaultMLA()
	c.MLA.QLoraRank, c.MLA.KVLoraRank, c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim = 12, 10, 6, 4, 5
	c.MLA.ScalingFactor, c.MLA.Mscale, c.MLA.MscaleAllDim = 40, 0.707, 0.3
	return c
}

// mlaWideTiny is an MLA model whose q·k heads are wider than the CUDA
// flash kernels take (136 + 8 = 144 > 128 channels, as DeepSeek's 192),
// four of them, with a plain query projection and the latents' norms
// (--qk-layernorm).
func mlaWideTiny() Config {
	c := gpt2Tiny()
	c.NumAttentionHeads, c.QKLayerNorm = 4, true
	c.MLA = DefaultMLA()
	c.MLA.KVLoraRank, c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim = 12, 136, 8, 16
	return c
}

// TestSimVariantsMatchCPU: the squared-ReLU, output-gate and gated delta
// net models' training step and decoding on the simulated device are the
// CPU's bit for bit.
func TestSimVariantsMatchCPU(t *testing.T) {
	for _, cfg := range []Config{sqreluTiny(), outputGateTiny(), gdnTiny()} {
		c, bt := deviceCase(cfg)
		cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{Selective: true})
		sl, sg := deviceStep(t, c, bt, tensor.Sim, Recompute{Selective: true})
		sameBits(t, "loss", []float32{sl}, []float32{cl})
		for i := range cg {
			sameBits(t, "gradient", sg[i], cg[i])
		}
		want, got := deviceDecode(t, c, bt, tensor.CPU, false), deviceDecode(t, c, bt, tensor.Sim, false)
		for i := range want {
			sameBits(t, "decode logits", got[i], want[i])
		}
	}
}

// TestCUDAVariantsMatchCPU: the squared-ReLU, output-gate and gated delta
// net models (their CUDA kernels: elem.cu's elem_sqrelu_* and
// elem_sigmoid_gate_*, gdn.cu's) give the CPU's loss, every gradient (with
// each recomputation) and the decoding logits within float32 tolerance on a
// GPU (the GPU's delta rule is the recurrence, the CPU's training forward
// the chunked form). It skips without one, and runs each variant only when
// GOTRON_CUDA_UNVERIFIED names its feature (sqrelu, output-gate, gdn), as
// training does: built, not yet run on a GPU (tools/gpu/check.sh
// unverified).
func TestCUDAVariantsMatchCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	const tol = 1e-3
	for name, cfg := range map[string]Config{"sqrelu": sqreluTiny(), "output-gate": outputGateTiny(), "gdn": gdnTiny()} {
		t.Run(name, func(t *testing.T) {
			if err := cfg.CheckDevice(tensor.CUDA); err != nil {
				t.Skip(err)
			}
			c, bt := deviceCase(cfg)
			for _, rc := range deviceRecomputes {
				cl, cg := deviceStep(t, c, bt, tensor.CPU, rc)
				gl, gg := deviceStep(t, c, bt, tensor.CUDA, rc)
				cudaClose(t, name+" loss", []float32{gl}, []float32{cl}, tol)
				params := stageModel(t, c).Params()
				for i := range cg {
					cudaClose(t, name+" gradient of "+params[i].Name, gg[i], cg[i], tol)
				}
			}
			want, got := deviceDecode(t, c, bt, tensor.CPU, false), deviceDecode(t, c, bt, tensor.CUDA, false)
			for i := range want {
				cudaClose(t, name+" decode logits", got[i], want[i], tol)
			}
		})
	}
}

// mlaDecode decodes bt's first tokens in chunks of 3, 1 and 2 with c's
// model on dev, the latents cached or not (--cache-mla-latents), and
// returns the logits of each chunk.
func mlaDecode(t *testing.T, c Config, bt Batch, dev tensor.Device, latents bool) [][]float32 {
	t.Helper()
	m := stageModel(t, c)
	m.CacheMLALatents = latents
	m.ToDevice(dev)
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

// TestCUDAMLAMatchesCPU: multi-latent attention models give the CPU's loss,
// every gradient (with each recomputation) and the decoding logits (the
// latents cached and not) within float32 tolerance on a GPU: mlaTiny (v
// padded to the q·k heads, YaRN, a query latent) and mlaWideTiny, whose
// 144-channel heads the flash kernels do not take, with the materialized
// path's scores limited to two heads of a batch row, so that its attention
// runs by chunks of two heads (tensor's attention_heads.go) as DeepSeek's
// 192-channel heads do at long sequences. It skips without a GPU and
// unless GOTRON_CUDA_UNVERIFIED names mla: built, not yet run on a GPU
// (tools/gpu/check.sh unverified).
func TestCUDAMLAMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if mla := mlaTiny(); mla.CheckDevice(tensor.CUDA) != nil {
		t.Skip(mla.CheckDevice(tensor.CUDA))
	}
	defer tensor.SetCUDAAttentionHeadChunks(tensor.SetCUDAAttentionHeadChunks(true))
	const tol = 1e-3
	for name, cfg := range map[string]Config{"mla": mlaTiny(), "mla-wide": mlaWideTiny()} {
		t.Run(name, func(t *testing.T) {
			c, bt := deviceCase(cfg)
			if name == "mla-wide" {
				T := int64(bt.Tokens.Dim(1))
				defer tensor.SetCUDAAttentionScoresLimit(tensor.SetCUDAAttentionScoresLimit(2 * T * T * 4))
			}
			for _, rc := range deviceRecomputes {
				cl, cg := deviceStep(t, c, bt, tensor.CPU, rc)
				gl, gg := deviceStep(t, c, bt, tensor.CUDA, rc)
				cudaClose(t, name+" loss", []float32{gl}, []float32{cl}, tol)
				params := stageModel(t, c).Params()
				for i := range cg {
					cudaClose(t, name+" gradient of "+params[i].Name, gg[i], cg[i], tol)
				}
			}
			for _, latents := range []bool{false, true} {
				want, got := mlaDecode(t, c, bt, tensor.CPU, latents), mlaDecode(t, c, bt, tensor.CUDA, latents)
				for i := range want {
					cudaClose(t, fmt.Sprintf("%s decode logits (latents cached: %v)", name, latents), got[i], want[i], tol)
				}
			}
		})
	}
}

// TestSimMLAWideMatchesCPU: mlaWideTiny's training step and decoding
// (latents cached and not) on the simulated device are the CPU's bit for
// bit.
func TestSimMLAWideMatchesCPU(t *testing.T) {
	c, bt := deviceCase(mlaWideTiny())
	cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{})
	sl, sg := deviceStep(t, c, bt, tensor.Sim, Recompute{})
	sameBits(t, "loss", []float32{sl}, []float32{cl})
	for i := range cg {
		sameBits(t, "gradient", sg[i], cg[i])
	}
	for _, latents := range []bool{false, true} {
		want, got := mlaDecode(t, c, bt, tensor.CPU, latents), mlaDecode(t, c, bt, tensor.Sim, latents)
		for i := range want {
			sameBits(t, "decode logits", got[i], want[i])
		}
	}
}
