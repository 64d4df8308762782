package ddp

import (
	"reflect"
	"testing"
)

// The cases follow Megatron's layout walk (megatron/core/distributed/
// param_and_grad_buffer.py; distrib_optimizer.py's
// _compute_per_buffer_param_layout): parameters in reverse registration
// order, dist-opt starts padded to 64, bucket ends padded to lcm(DP, 128),
// a bucket closed once it holds BucketSize elements, the shared embedding in
// a bucket of its own. Unpadded is Megatron's numel_unpadded: up to the last
// parameter's end, or up to the shared embedding's aligned start when the
// bucket is closed for it (192, not 158, in the DP=2 case).
func TestLayoutMegatronWalk(t *testing.T) {
	params := []ParamInfo{{Name: "emb", Numel: 100, SharedEmbedding: true}, {Name: "a", Numel: 30}, {Name: "b", Numel: 50}, {Name: "c", Numel: 10}}
	cases := []struct {
		name string
		cfg  LayoutConfig
		want Layout
	}{
		{"plain DDP, one bucket: reverse order, no padding, embedding alone", LayoutConfig{},
			Layout{Range: [][2]int{{90, 190}, {60, 90}, {10, 60}, {0, 10}},
				Buckets: []Bucket{{Start: 0, End: 90, Params: []int{3, 2, 1}, Unpadded: 90}, {Start: 90, End: 190, Params: []int{0}, Unpadded: 100}}, Total: 190}},
		{"plain DDP, buckets close at 40 elements", LayoutConfig{BucketSize: 40},
			Layout{Range: [][2]int{{90, 190}, {60, 90}, {10, 60}, {0, 10}},
				Buckets: []Bucket{{Start: 0, End: 60, Params: []int{3, 2}, Unpadded: 60}, {Start: 60, End: 90, Params: []int{1}, Unpadded: 30}, {Start: 90, End: 190, Params: []int{0}, Unpadded: 100}}, Total: 190}},
		{"distributed optimizer DP=2: params at multiples of 64, buckets end at multiples of 128", LayoutConfig{DPSize: 2, DistributedOptimizer: true},
			Layout{Range: [][2]int{{256, 356}, {128, 158}, {64, 114}, {0, 10}},
				Buckets: []Bucket{{Start: 0, End: 256, Params: []int{3, 2, 1}, Unpadded: 192}, {Start: 256, End: 384, Params: []int{0}, Unpadded: 100}}, Total: 384}},
		{"distributed optimizer DP=3: bucket ends at lcm(3,128)=384", LayoutConfig{DPSize: 3, DistributedOptimizer: true, BucketSize: 60},
			Layout{Range: [][2]int{{768, 868}, {384, 414}, {64, 114}, {0, 10}},
				Buckets: []Bucket{{Start: 0, End: 384, Params: []int{3, 2}, Unpadded: 114}, {Start: 384, End: 768, Params: []int{1}, Unpadded: 64}, {Start: 768, End: 1152, Params: []int{0}, Unpadded: 100}}, Total: 1152}},
	}
	for _, c := range cases {
		got, err := NewLayout(params, c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// Each DP rank owns the d-th equal slice of every bucket; the slices tile it.
func TestBucketShardsTile(t *testing.T) {
	b := Bucket{Start: 384, End: 768}
	next := b.Start
	for d := range 3 {
		lo, hi := b.Shard(d, 3)
		if lo != next || hi-lo != 128 {
			t.Fatalf("rank %d owns [%d, %d), want [%d, %d)", d, lo, hi, next, next+128)
		}
		next = hi
	}
}

func TestDefaultBucketSize(t *testing.T) {
	for _, c := range []struct{ dp, want int }{{1, 40_000_000}, {8, 40_000_000}, {64, 64_000_000}} {
		if got := DefaultBucketSize(c.dp); got != c.want {
			t.Errorf("DefaultBucketSize(%d) = %d, want %d", c.dp, got, c.want)
		}
	}
}

func TestLayoutRejectsBadInput(t *testing.T) {
	if _, err := NewLayout([]ParamInfo{{Name: "x", Numel: 0}}, LayoutConfig{}); err == nil {
		t.Error("an empty parameter was accepted")
	}
	if _, err := NewLayout([]ParamInfo{{Name: "x", Numel: 4}}, LayoutConfig{BucketSize: -1}); err == nil {
		t.Error("a negative bucket size was accepted")
	}
}
