package comm_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

func simOf(vals ...float32) *tensor.Tensor {
	return tensor.FromFloat32(vals, len(vals)).ToDevice(tensor.Sim)
}

func hostOf(t *tensor.Tensor) []float32 { return tensor.ToHost(t).Float32s() }

// TestSimDeviceCollectives: every DeviceCollectives method of a SimDevice
// over inproc works on sim tensors in place (in-place all-gather and
// reduce-scatter blocks included) without one host copy, a batch whose
// ranks all list their sends first completes, sub-groups are SimDevices
// sharing the count, and CPU, strided or float16 tensors are refused.
func TestSimDeviceCollectives(t *testing.T) {
	const n = 3
	sims := make([]*comm.SimDevice, n)
	// every rank's tensors, made before and read after the collectives so
	// that only the collectives run between the two counts
	type rankData struct{ sum, rsIn, rsOut, agIn, agOut, agInPlace, bc, toNext, toPrev, fromPrev, fromNext, s2, r2 *tensor.Tensor }
	data := make([]rankData, n)
	for r := range n {
		f := float32(r)
		data[r] = rankData{
			sum: simOf(f, 2*f, 1), rsIn: simOf(f, f+1, f+2, f+3, f+4, f+5), rsOut: simOf(0, 0),
			agIn: simOf(f, -f), agOut: simOf(make([]float32, 2*n)...),
			bc: simOf(f+10, f+20), toNext: simOf(100 + f), toPrev: simOf(200+f, 201+f),
			fromPrev: simOf(0), fromNext: simOf(0, 0), s2: simOf(7 + f), r2: simOf(0),
		}
	}
	// in-place all-gather: rank r's block r of agInPlace holds (r, r+0.5)
	for r := range n {
		v := make([]float32, 2*n)
		v[2*r], v[2*r+1] = float32(r), float32(r)+0.5
		data[r].agInPlace = simOf(v...)
	}
	before := tensor.SimTransfers()
	err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
		s := comm.NewSimDevice(pg)
		sims[pg.Rank()] = s
		d, me := &data[pg.Rank()], pg.Rank()
		next, prev := (me+1)%n, (me+n-1)%n
		for _, f := range []func() error{
			func() error { return s.AllReduceTensor(ctx, d.sum, comm.Sum) },
			func() error { return s.ReduceScatterTensor(ctx, d.rsOut, d.rsIn, comm.Sum) },
			func() error { return s.AllGatherTensor(ctx, d.agOut, d.agIn) },
			func() error {
				block := (*tensor.Tape)(nil).Narrow(d.agInPlace, 0, 2*me, 2)
				return s.AllGatherTensor(ctx, d.agInPlace, block)
			},
			func() error { return s.BroadcastTensor(ctx, d.bc, 1) },
			func() error {
				return s.BatchSendRecvTensors(ctx, []comm.TensorP2P{
					{Kind: comm.SendOp, Peer: next, T: d.toNext}, {Kind: comm.SendOp, Peer: prev, T: d.toPrev},
					{Kind: comm.RecvOp, Peer: prev, T: d.fromPrev}, {Kind: comm.RecvOp, Peer: next, T: d.fromNext},
				})
			},
			func() error {
				if me%2 == 0 {
					if err := s.SendTensor(ctx, d.s2, next); err != nil {
						return err
					}
					return s.RecvTensor(ctx, d.r2, prev)
				}
				if err := s.RecvTensor(ctx, d.r2, prev); err != nil {
					return err
				}
				return s.SendTensor(ctx, d.s2, next)
			},
		} {
			if err := f(); err != nil {
				return err
			}
		}
		sub, err := s.NewGroup([]int{0, 1})
		if err == nil {
			sd, ok := sub.(*comm.SimDevice)
			if !ok {
				return fmt.Errorf("rank %d: sub-group %T, want *comm.SimDevice", me, sub)
			}
			if err := sd.AllReduceTensor(ctx, d.s2, comm.Max); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := tensor.SimTransfers().Sub(before); d.ToHost+d.FromHost != 0 {
		t.Errorf("the device collectives made %d host copies", d.ToHost+d.FromHost)
	}
	if c := sims[0].Calls(); c != 9 {
		t.Errorf("rank 0 counted %d device collectives, want 9 (8 and the sub-group's)", c)
	}
	for r := range n {
		d := data[r]
		next, prev := (r+1)%n, (r+n-1)%n
		for _, c := range []struct {
			what      string
			got, want []float32
		}{
			{"all_reduce", hostOf(d.sum), []float32{3, 6, 3}},
			{"reduce_scatter", hostOf(d.rsOut), []float32{float32(3 + 6*r), float32(6 + 6*r)}},
			{"all_gather", hostOf(d.agOut), []float32{0, 0, 1, -1, 2, -2}},
			{"all_gather in place", hostOf(d.agInPlace), []float32{0, 0.5, 1, 1.5, 2, 2.5}},
			{"broadcast", hostOf(d.bc), []float32{11, 21}},
			{"batched recv from prev", hostOf(d.fromPrev), []float32{100 + float32(prev)}},
			{"batched recv from next", hostOf(d.fromNext), []float32{200 + float32(next), 201 + float32(next)}},
			{"recv", hostOf(d.r2), []float32{7 + float32(prev)}},
		} {
			if !slices.Equal(c.got, c.want) {
				t.Errorf("rank %d %s: %v, want %v", r, c.what, c.got, c.want)
			}
		}
	}
	s := sims[0]
	strided := (*tensor.Tape)(nil).Transpose(tensor.ZerosOn(tensor.Sim, 2, 3), 0, 1)
	for _, x := range []*tensor.Tensor{nil, tensor.New(tensor.Float32, 2), strided, tensor.NewOn(tensor.Sim, tensor.Float16, 2)} {
		if s.DeviceTensor(x) {
			t.Errorf("DeviceTensor accepted %v", x)
		}
		if _, ok := comm.DeviceOf(s, simOf(1), x); ok {
			t.Errorf("DeviceOf accepted %v", x)
		}
	}
	err = s.AllReduceTensor(t.Context(), tensor.New(tensor.Float32, 2), comm.Sum)
	if err == nil || !strings.Contains(err.Error(), "not a contiguous sim tensor") {
		t.Errorf("all_reduce of a CPU tensor: %v", err)
	}
}

// plainGroup hides the wrapped group's BatchSendRecv.
type plainGroup struct{ comm.ProcessGroup }

// Over a group without BatchSendRecv, a SimDevice accepts no device tensor
// (its batches could not run their ops together), and its host
// BatchSendRecv runs the ops one at a time in list order.
func TestSimDeviceWithoutBatchSendRecv(t *testing.T) {
	got := make([][]float32, 2)
	err := inproc.Run(t.Context(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		s := comm.NewSimDevice(plainGroup{pg})
		if _, ok := comm.DeviceOf(s, simOf(1)); ok {
			return fmt.Errorf("rank %d: DeviceOf accepted a sim tensor over a group without BatchSendRecv", pg.Rank())
		}
		me, peer := pg.Rank(), 1-pg.Rank()
		f := float32(10 * me)
		a, b := make([]float32, 2), make([]float32, 1)
		ops := []comm.P2POp{
			{Kind: comm.SendOp, Peer: peer, Buf: comm.Float32s([]float32{f, f + 1})}, {Kind: comm.SendOp, Peer: peer, Buf: comm.Float32s([]float32{f + 2})},
			{Kind: comm.RecvOp, Peer: peer, Buf: comm.Float32s(a)}, {Kind: comm.RecvOp, Peer: peer, Buf: comm.Float32s(b)},
		}
		if me == 1 { // receive first: the ops run in list order
			ops = append(ops[2:], ops[:2]...)
		}
		if err := s.BatchSendRecv(ctx, ops); err != nil {
			return err
		}
		got[me] = append(a, b...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		f := float32(10 * (1 - r))
		if want := []float32{f, f + 1, f + 2}; !slices.Equal(got[r], want) {
			t.Errorf("rank %d received %v, want %v", r, got[r], want)
		}
	}
}
