package gpt

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestPipelineSplitAccountedGolden: with --account-for-embedding-in-pipeline-split
// and --account-for-loss-in-pipeline-split every (pipeline rank, virtual
// stage) gets the layer offset and the number of layers of Megatron's own
// get_transformer_layer_offset and get_num_layers_to_build
// (testdata/megatron_pipeline_split.json, written by
// tools/golden/megatron_pipeline_split.py from Megatron's code).
func TestPipelineSplitAccountedGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/megatron_pipeline_split.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		NumLayers        int        `json:"num_layers"`
		PP               int        `json:"pp"`
		VPP              int        `json:"vpp"`
		AccountEmbedding bool       `json:"account_embedding"`
		AccountLoss      bool       `json:"account_loss"`
		Stages           [][][2]int `json:"stages"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("%d golden cases, want the 11 of the script", len(cases))
	}
	for _, c := range cases {
		s := PipelineSplit{PP: c.PP, VPP: c.VPP, AccountForEmbedding: c.AccountEmbedding, AccountForLoss: c.AccountLoss}
		for r, want := range c.Stages {
			got, err := s.LayerRanges(c.NumLayers, r)
			if err != nil {
				t.Fatalf("%d layers %+v rank %d: %v", c.NumLayers, s, r, err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d layers %+v rank %d: %d chunks, Megatron %d", c.NumLayers, s, r, len(got), len(want))
			}
			for ch := range want {
				if got[ch][0] != want[ch][0] || got[ch][1]-got[ch][0] != want[ch][1] {
					t.Errorf("%d layers %+v rank %d chunk %d: layers [%d, %d), Megatron offset %d and %d layers",
						c.NumLayers, s, r, ch, got[ch][0], got[ch][1], want[ch][0], want[ch][1])
				}
			}
		}
	}
}

// TestPipelineSplitAccountedBadInput: the account-for flags are refused
// where Megatron refuses them, naming the flags.
func TestPipelineSplitAccountedBadInput(t *testing.T) {
	for _, c := range []struct {
		layers int
		split  PipelineSplit
		want   string
	}{
		{8, PipelineSplit{PP: 4, AccountForEmbedding: true}, "--num-layers=8 plus the layer(s) --account-for-embedding-in-pipeline-split counts (9) is not divisible by --pipeline-model-parallel-size=4"},
		{8, PipelineSplit{PP: 2, AccountForEmbedding: true, AccountForLoss: true, FirstLayers: 5}, "cannot be combined with --decoder-first-pipeline-num-layers"},
		{6, PipelineSplit{PP: 4, VPP: 3, AccountForEmbedding: true, AccountForLoss: true}, "2 layers per pipeline rank (--num-layers=6 with --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split, / --pipeline-model-parallel-size=4) are not divisible by 3 virtual stages"},
		{6, PipelineSplit{PP: 4, LayersPerVirtualStage: 3, AccountForEmbedding: true, AccountForLoss: true}, "not divisible by --num-layers-per-virtual-pipeline-stage=3"},
	} {
		_, err := c.split.Chunks(c.layers)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d layers %+v: %v, want an error saying %q", c.layers, c.split, err, c.want)
		}
	}
	// --num-layers-per-virtual-pipeline-stage counts the accounted layers,
	// as Megatron's validate_args: 6 + 2 over 4 ranks, 1 per chunk: 2 chunks.
	if vpp, err := (PipelineSplit{PP: 4, LayersPerVirtualStage: 1, AccountForEmbedding: true, AccountForLoss: true}).Chunks(6); err != nil || vpp != 2 {
		t.Errorf("6 layers, PP 4, 1 layer per virtual stage, both accounted: %d chunks, %v; want 2", vpp, err)
	}
}
