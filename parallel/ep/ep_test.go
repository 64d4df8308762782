package ep

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

func epConfig() gpt.Config {
	return gpt.Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 2, FFNHiddenSize: 24, VocabSize: 40,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2, FFNHiddenSize: 12, AuxLossCoeff: 0.01, ZLossCoeff: 1e-3,
			SharedExpertFFN: 8, LayerFreq: "[1,1]"}}
}

func batchOf(rank int) gpt.Batch {
	const b, t, v = 2, 6, 40
	ids, labels := make([]int32, b*t), make([]int32, b*t)
	for i := range ids {
		ids[i] = int32((i*7 + 3 + 11*rank) % v)
		labels[i] = int32((i*5 + 1 + 3*rank) % v)
	}
	return gpt.Batch{Tokens: tensor.FromInt32(ids, b, t), Labels: tensor.FromInt32(labels, b, t)}
}

type result struct {
	loss  float64
	grads map[string][]float32
	aux   map[string]float64
}

func step(t *testing.T, m *gpt.Model, bt gpt.Batch) result {
	for _, p := range m.Params() {
		p.Grad = nil
	}
	tp := tensor.NewTape()
	loss := m.Loss(tp, m.Forward(tp, bt, tensor.NewRNG(1), true), bt)
	l := float64(tensor.ToHost(loss).Float32s()[0])
	if err := tp.Backward(loss); err != nil {
		t.Error(err)
		return result{}
	}
	g := map[string][]float32{}
	for _, p := range m.Params() {
		if p.Grad != nil {
			g[p.Name] = append([]float32(nil), p.Grad.Float32s()...)
		}
	}
	return result{l, g, m.MoEMetrics(1)}
}

// TestDispatchersMatchOneRank: with EP ranks each routing its own batch,
// both dispatchers give every rank the loss, the logged aux losses and the
// gradients of the dense weights and router that one process gets on that
// batch, and each expert's gradient is the sum over the ranks' batches.
func TestDispatchersMatchOneRank(t *testing.T) {
	for _, c := range []struct {
		ep       int
		alltoall bool
	}{{2, true}, {4, false}, {2, false}, {4, true}} {
		t.Run(fmt.Sprintf("EP=%d/alltoall=%v", c.ep, c.alltoall), func(t *testing.T) {
			want := make([]result, c.ep)
			for r := range c.ep {
				m, err := gpt.New(epConfig(), tensor.NewRNG(7))
				if err != nil {
					t.Fatal(err)
				}
				want[r] = step(t, m, batchOf(r))
			}
			pgs, err := inproc.NewWorld(c.ep)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]result, c.ep)
			var wg sync.WaitGroup
			for r := range c.ep {
				wg.Add(1)
				go func(r int, pg comm.ProcessGroup) {
					defer wg.Done()
					m, err := gpt.New(epConfig(), tensor.NewRNG(7))
					if err != nil {
						t.Error(err)
						return
					}
					if err := m.SliceExperts(&Group{PG: pg, UseAllToAll: c.alltoall}); err != nil {
						t.Error(err)
						return
					}
					got[r] = step(t, m, batchOf(r))
				}(r, pgs[r])
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			close := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(1, math.Abs(b)) }
			for r := range c.ep {
				if !close(got[r].loss, want[r].loss) {
					t.Fatalf("rank %d: loss %v, one process %v", r, got[r].loss, want[r].loss)
				}
				for name, v := range want[r].aux {
					if !close(got[r].aux[name], v) {
						t.Fatalf("rank %d: %s %v, one process %v", r, name, got[r].aux[name], v)
					}
				}
				for name, g := range got[r].grads {
					expert := strings.Contains(name, "local_experts")
					w := want[r].grads[name]
					if w == nil && !expert {
						t.Fatalf("rank %d: gradient %s unknown to one process", r, name)
					}
					for i := range g {
						var ref float64
						if expert { // the sum over every rank's batch (none when no token came)
							for q := range c.ep {
								if wq := want[q].grads[name]; wq != nil {
									ref += float64(wq[i])
								}
							}
						} else {
							ref = float64(w[i])
						}
						if !close(float64(g[i]), ref) {
							t.Fatalf("rank %d: %s[%d] = %g, want %g", r, name, i, g[i], ref)
						}
					}
				}
			}
		})
	}
}

// TestExpertTensorParallelMatchesOneRank: with expert tensor parallelism
// (EP×ETP ranks, ETP fastest, each expert's fc1 rows and fc2 columns split
// over the expert-TP ranks) both dispatchers give every rank the loss, the
// logged aux losses and the dense and router gradients that one process
// gets on that rank's batch, and each expert slice's gradient is that slice
// of the sum over every rank's batch.
func TestExpertTensorParallelMatchesOneRank(t *testing.T) {
	for _, c := range []struct {
		ep, etp  int
		alltoall bool
	}{{2, 2, true}, {2, 2, false}, {1, 2, true}} {
		t.Run(fmt.Sprintf("EP=%d/ETP=%d/alltoall=%v", c.ep, c.etp, c.alltoall), func(t *testing.T) {
			n := c.ep * c.etp
			want := make([]result, n)
			full := map[string][]int{} // whole expert shapes
			for r := range n {
				m, err := gpt.New(epConfig(), tensor.NewRNG(7))
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range m.Params() {
					full[p.Name] = p.Shape()
				}
				want[r] = step(t, m, batchOf(r))
			}
			pgs, err := inproc.NewWorld(n)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]result, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Add(1)
				go func(r int, pg comm.ProcessGroup) {
					defer wg.Done()
					e, q := r/c.etp, r%c.etp
					var epRanks, tpRanks, all []int
					for j := range c.ep {
						epRanks = append(epRanks, j*c.etp+q)
					}
					for k := range c.etp {
						tpRanks = append(tpRanks, e*c.etp+k)
					}
					for k := range n {
						all = append(all, k)
					}
					g := &Group{UseAllToAll: c.alltoall}
					for _, s := range []struct {
						dst   *comm.ProcessGroup
						ranks []int
					}{{&g.PG, epRanks}, {&g.TP, tpRanks}, {&g.TPEP, all}} {
						sub, err := pg.NewGroup(s.ranks)
						if err != nil {
							t.Error(err)
							return
						}
						*s.dst = sub
					}
					m, err := gpt.New(epConfig(), tensor.NewRNG(7))
					if err != nil {
						t.Error(err)
						return
					}
					if err := m.SliceExperts(g); err != nil {
						t.Error(err)
						return
					}
					got[r] = step(t, m, batchOf(r))
				}(r, pgs[r])
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			close := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(1, math.Abs(b)) }
			for r := range n {
				if !close(got[r].loss, want[r].loss) {
					t.Fatalf("rank %d: loss %v, one process %v", r, got[r].loss, want[r].loss)
				}
				for name, v := range want[r].aux {
					if !close(got[r].aux[name], v) {
						t.Fatalf("rank %d: %s %v, one process %v", r, name, got[r].aux[name], v)
					}
				}
				for name, g := range got[r].grads {
					if !strings.Contains(name, "local_experts") {
						w := want[r].grads[name]
						for i := range g {
							if !close(float64(g[i]), float64(w[i])) {
								t.Fatalf("rank %d: %s[%d] = %g, one process %g", r, name, i, g[i], w[i])
							}
						}
						continue
					}
					// the sum over every rank's batch, then this rank's slice
					sum := make([]float32, len(g)*c.etp)
					for q := range n {
						for i, v := range want[q].grads[name] {
							sum[i] += v
						}
					}
					style := tp.ColumnGLU
					if strings.Contains(name, "linear_fc2") {
						style = tp.Row
					}
					s, err := tp.Shard(tensor.FromFloat32(sum, full[name]...), style, r%c.etp, c.etp)
					if err != nil {
						t.Fatal(err)
					}
					for i, w := range s.Float32s() {
						if !close(float64(g[i]), float64(w)) {
							t.Fatalf("rank %d: %s[%d] = %g, want %g", r, name, i, g[i], w)
						}
					}
				}
			}
		})
	}
}
