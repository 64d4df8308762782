package main

import (
	"flag"
	"fmt"

	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// fp8Flags are Megatron's FP8 flags (--fp8-format and the flags it
// reads), shared by train and inference.
type fp8Flags struct {
	format, recipe string
	margin         int
	historyLen     int
	algo           string
	noWgrad        bool
	paramGather    bool
	firstLastBF16  bool
	atStart, atEnd int
	// forInference: Megatron allows --fp8-param-gather without the
	// distributed optimizer in inference.
	forInference bool
}

// fp8FlagNames are the flags fp8Flags defines.
var fp8FlagNames = map[string]bool{"fp8-format": true, "fp8-recipe": true, "fp8-margin": true, "fp8-amax-history-len": true,
	"fp8-amax-compute-algo": true, "no-fp8-wgrad": true, "disable-fp8-wgrad": true, "fp8-param-gather": true,
	"first-last-layers-bf16": true, "num-layers-at-start-in-bf16": true, "num-layers-at-end-in-bf16": true}

// fp8DependentFlags are the flags that mean something only with
// --fp8-format (Megatron reads them only when args.fp8 is set).
var fp8DependentFlags = []string{"fp8-recipe", "fp8-margin", "fp8-amax-history-len", "fp8-amax-compute-algo", "no-fp8-wgrad",
	"disable-fp8-wgrad", "first-last-layers-bf16", "num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16"}

// add registers the flags on fs.
func (f *fp8Flags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.format, "fp8-format", "", "FP8 linear layers (QKV, attention projection, fc1, fc2): e4m3 (every tensor E4M3) or hybrid (gradients E5M2); emulated on the CPU with float32 sums, slower than bf16 there (docs/fp8.md)")
	fs.StringVar(&f.recipe, "fp8-recipe", "delayed", "with --fp8-format: tensorwise (each tensor scaled by its own amax, TE's Float8CurrentScaling) or delayed (scales from an amax history, TE's DelayedScaling); mxfp8, blockwise and custom are refused")
	fs.IntVar(&f.margin, "fp8-margin", 0, "delayed recipe: scales divided by 2^margin")
	fs.IntVar(&f.historyLen, "fp8-amax-history-len", 1, "delayed recipe: amaxes kept per tensor")
	fs.StringVar(&f.algo, "fp8-amax-compute-algo", "most_recent", "delayed recipe: most_recent or max (of the history)")
	fs.BoolVar(&f.noWgrad, "no-fp8-wgrad", false, "delayed recipe: weight gradients from the unquantized operands (TE's override_linear_precision)")
	fs.BoolVar(&f.noWgrad, "disable-fp8-wgrad", false, "= --no-fp8-wgrad")
	fs.BoolVar(&f.paramGather, "fp8-param-gather", false, "with --fp8-format: FP8 weights quantized from the float32 main parameters (under --bf16 not from the bfloat16 weight); Megatron needs --use-distributed-optimizer for it in training")
	fs.BoolVar(&f.firstLastBF16, "first-last-layers-bf16", false, "with --fp8-format: keep the first --num-layers-at-start-in-bf16 and last --num-layers-at-end-in-bf16 layers out of FP8 (not with the delayed recipe)")
	fs.IntVar(&f.atStart, "num-layers-at-start-in-bf16", 1, "with --first-last-layers-bf16: layers at the start kept out of FP8")
	fs.IntVar(&f.atEnd, "num-layers-at-end-in-bf16", 1, "with --first-last-layers-bf16: layers at the end kept out of FP8")
}

// config returns the FP8 setting the flags ask for (nil: none), numLayers
// and pp the model's layers and pipeline size, distOpt train's
// --use-distributed-optimizer (ignored for inference).
func (f *fp8Flags) config(given map[string]bool, numLayers, pp int, distOpt bool) (*gpt.FP8Config, error) {
	if f.format == "" {
		if given["fp8-param-gather"] && f.paramGather {
			// TransformerConfig.__post_init__
			return nil, fmt.Errorf("--fp8-param-gather without --fp8-format: Megatron refuses it (\"fp8_param must be used together with fp8 mode.\")")
		}
		for _, name := range fp8DependentFlags {
			if given[name] {
				return nil, fmt.Errorf("--%s without --fp8-format: FP8 is off, so it would do nothing (Megatron ignores it then); give --fp8-format e4m3 or hybrid", name)
			}
		}
		return nil, nil
	}
	var r fp8.Recipe
	switch f.format {
	case "e4m3":
	case "hybrid":
		r.Hybrid = true
	default:
		return nil, fmt.Errorf("--fp8-format %q: want e4m3 or hybrid", f.format)
	}
	switch f.recipe {
	case "tensorwise":
		r.Kind = fp8.Tensorwise
	case "delayed":
		r.Kind = fp8.Delayed
	case "mxfp8", "blockwise", "custom":
		return nil, fmt.Errorf("--fp8-recipe %s: needs TE's %s recipe, not built in gotron (tensorwise and delayed are)", f.recipe, map[string]string{"mxfp8": "MXFP8BlockScaling", "blockwise": "Float8BlockScaling", "custom": "custom quantizer-factory"}[f.recipe])
	default:
		return nil, fmt.Errorf("--fp8-recipe %q: want tensorwise or delayed (Megatron's mxfp8, blockwise and custom are not built)", f.recipe)
	}
	switch f.algo {
	case "most_recent":
		r.AmaxAlgo = fp8.MostRecent
	case "max":
		r.AmaxAlgo = fp8.MaxOfHistory
	default:
		return nil, fmt.Errorf("--fp8-amax-compute-algo %q: want most_recent or max", f.algo)
	}
	r.Margin, r.AmaxHistoryLen, r.NoWgradFP8 = f.margin, f.historyLen, f.noWgrad
	if r.Kind == fp8.Tensorwise {
		for _, name := range []string{"fp8-margin", "fp8-amax-history-len", "fp8-amax-compute-algo"} {
			if given[name] {
				return nil, fmt.Errorf("--%s: read only by --fp8-recipe delayed; with tensorwise it would do nothing", name)
			}
		}
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	c := &gpt.FP8Config{Recipe: r, ParamGather: f.paramGather}
	if f.paramGather && !distOpt && !f.forInference {
		return nil, fmt.Errorf("--fp8-param-gather: Megatron supports it only with --use-distributed-optimizer (or FSDP, or in inference)")
	}
	if f.firstLastBF16 {
		perStage := numLayers / max(pp, 1)
		for _, n := range []struct {
			name string
			v    int
		}{{"num-layers-at-start-in-bf16", f.atStart}, {"num-layers-at-end-in-bf16", f.atEnd}} {
			if n.v < 0 || n.v > perStage {
				return nil, fmt.Errorf("--%s %d: must be between 0 and the layers per pipeline stage (%d), as Megatron", n.name, n.v, perStage)
			}
		}
		c.BF16LayersAtStart, c.BF16LayersAtEnd = f.atStart, f.atEnd
	} else {
		for _, name := range []string{"num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16"} {
			if given[name] {
				return nil, fmt.Errorf("--%s: read only with --first-last-layers-bf16", name)
			}
		}
	}
	return c, nil
}

// decodeConfig is config for decoding (gotron inference, generate): the
// tensorwise recipe only, the delayed one refused (its scales are state a
// checkpoint would carry).
func (f *fp8Flags) decodeConfig(given map[string]bool, numLayers, pp int) (*gpt.FP8Config, error) {
	f.forInference = true
	c, err := f.config(given, numLayers, pp, false)
	if err != nil || c == nil {
		return c, err
	}
	if c.Recipe.Kind == fp8.Delayed {
		return nil, fmt.Errorf("--fp8-recipe delayed at inference: not built (gotron's checkpoints keep a delayed run's amax histories and scales, but decoding does not run the delayed recipe); --fp8-recipe tensorwise is built")
	}
	return c, nil
}

// applyDecodeFP8 sets m.FP8 from the flags for decoding on dev (nothing
// without --fp8-format). Under --bf16 the model's weights are bfloat16
// already (RoundToBF16): --fp8-param-gather quantizes the same values, as
// Megatron's FP8 parameters loaded from a bfloat16 checkpoint.
func applyDecodeFP8(m *gpt.Model, f *fp8Flags, given map[string]bool, bf16 bool, pp int, dev tensor.Device, getenv func(string) string) error {
	c, err := f.decodeConfig(given, m.Config.NumLayers, pp)
	if err != nil || c == nil {
		return err
	}
	if dev == tensor.CUDA && !tensor.CUDAUnverified(getenv, "fp8") {
		return fmt.Errorf("--fp8-format on --device cuda: FP8 decoding through cuBLASLt's FP8 products is built but has not run on a GPU in this release; set GOTRON_CUDA_UNVERIFIED=fp8 to run it anyway, or use --device cpu or sim (the emulation)")
	}
	if err := c.Validate(m.Config); err != nil {
		return err
	}
	m.FP8 = gpt.NewFP8(*c, bf16)
	m.FP8.CacheWeights = true // decoding: the weights never change
	return nil
}
