// Package commtest is the conformance suite every comm backend runs: each
// collective × dtype × reduce op on uneven sizes, checked on every rank
// against a serial reference computed from the same deterministic inputs.
//
// Inputs are small integers (-5..5), so every sum over up to 48 ranks is
// exact in every dtype (bfloat16 included) whatever the reduction order or
// algorithm; a backend passes only if it moves and combines every element
// correctly. Call Conformance on every rank of a group (goroutines for
// inproc, processes for tcp): it returns the first wrong element it saw.
//
// SimDevices and Refusing give the parallel plans' tests their groups on
// the simulated device: with comm.SimDevice's in-place collectives, or
// with none accepted, so that the plans must stage through the host.
package commtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// DTypes lists the dtypes the suite covers.
var DTypes = []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64}

// Ops lists the reduce ops the suite covers.
var Ops = []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max, comm.Min}

// Value is rank's input element i for a case seed: an integer in [-5, 5].
func Value(seed, rank, i int) int64 {
	v := (seed*31 + rank*7 + i*3 + (i*i)%13) % 11
	return int64(v) - 5
}

// Fill returns a buffer of n elements with Value(seed, rank, off+i).
func Fill(dt tensor.DType, n, seed, rank, off int) comm.Buffer {
	b := comm.MakeBuffer(dt, n)
	for i := range n {
		Set(b, i, float64(Value(seed, rank, off+i)))
	}
	return b
}

// Set stores v (converted, bfloat16 rounded to nearest even) at element i.
func Set(b comm.Buffer, i int, v float64) {
	switch b.DType {
	case tensor.Float32:
		b.Float32()[i] = float32(v)
	case tensor.BFloat16:
		b.BFloat16()[i] = tensor.Float32ToBFloat16(float32(v))
	case tensor.Int32:
		b.Int32()[i] = int32(v)
	case tensor.Int64:
		b.Int64()[i] = int64(v)
	}
}

// Get returns element i as float64.
func Get(b comm.Buffer, i int) float64 {
	switch b.DType {
	case tensor.Float32:
		return float64(b.Float32()[i])
	case tensor.BFloat16:
		return float64(tensor.BFloat16ToFloat32(b.BFloat16()[i]))
	case tensor.Int32:
		return float64(b.Int32()[i])
	case tensor.Int64:
		return float64(b.Int64()[i])
	}
	return 0
}

// ReduceRef is the serial reference: op over Value(seed, r, i) for r in
// ranks, as the dtype would store it.
func ReduceRef(dt tensor.DType, op comm.ReduceOp, seed int, ranks []int, i int) float64 {
	acc := Value(seed, ranks[0], i)
	for _, r := range ranks[1:] {
		v := Value(seed, r, i)
		switch op {
		case comm.Max:
			acc = max(acc, v)
		case comm.Min:
			acc = min(acc, v)
		default:
			acc += v
		}
	}
	if op != comm.Avg {
		return float64(acc)
	}
	n := int64(len(ranks))
	switch dt {
	case tensor.Int32, tensor.Int64:
		return float64(acc / n)
	case tensor.BFloat16:
		return float64(tensor.BFloat16ToFloat32(tensor.Float32ToBFloat16(float32(acc) / float32(n))))
	}
	return float64(float32(acc) / float32(n))
}

// Sizes returns the buffer lengths the suite uses for a group of n ranks:
// empty, tiny, not a multiple of n, and a few thousand elements (several
// chunks for chunked backends).
func Sizes(n int) []int { return []int{0, 1, n + 1, 7*n + 3, 5000 + n} }

// UnevenCounts returns per-rank counts that differ between ranks (one
// rank gets zero when n > 2) and add up to roughly scale·n.
func UnevenCounts(n, scale int) []int {
	c := make([]int, n)
	for r := range c {
		c[r] = scale*(r%3) + r + 1
	}
	if n > 2 {
		c[1] = 0
	}
	return c
}

type checker struct {
	rank int
	what string
}

func (c checker) compare(got comm.Buffer, want func(i int) float64) error {
	for i := range got.Len() {
		if g, w := Get(got, i), want(i); g != w {
			return fmt.Errorf("rank %d: %s: element %d of %d = %v, want %v", c.rank, c.what, i, got.Len(), g, w)
		}
	}
	return nil
}

// Conformance runs the whole suite on pg; every rank of pg must call it at
// the same time.
func Conformance(ctx context.Context, pg comm.ProcessGroup) error {
	n, me := pg.Size(), pg.Rank()
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	seed := 0
	for _, dt := range DTypes {
		for _, size := range Sizes(n) {
			for _, op := range Ops {
				seed++
				// all_reduce
				buf := Fill(dt, size, seed, me, 0)
				ck := checker{me, fmt.Sprintf("all_reduce %s %s n=%d", dt, op, size)}
				if err := pg.AllReduce(ctx, buf, op); err != nil {
					return fmt.Errorf("%s: %w", ck.what, err)
				}
				if err := ck.compare(buf, func(i int) float64 { return ReduceRef(dt, op, seed, all, i) }); err != nil {
					return err
				}
				// reduce to a rotating root
				root := seed % n
				buf = Fill(dt, size, seed, me, 0)
				ck.what = fmt.Sprintf("reduce %s %s n=%d root=%d", dt, op, size, root)
				if err := pg.Reduce(ctx, buf, op, root); err != nil {
					return fmt.Errorf("%s: %w", ck.what, err)
				}
				want := func(i int) float64 { return float64(Value(seed, me, i)) }
				if me == root {
					want = func(i int) float64 { return ReduceRef(dt, op, seed, all, i) }
				}
				if err := ck.compare(buf, want); err != nil {
					return err
				}
			}
			// reduce_scatter, even and uneven
			for _, op := range Ops {
				for _, uneven := range []bool{false, true} {
					seed++
					counts := []int(nil)
					total := size * n
					if uneven {
						counts = UnevenCounts(n, size)
						total = 0
						for _, c := range counts {
							total += c
						}
					}
					cs, _ := comm.ResolveCounts(counts, total, n, "counts")
					off := comm.Offsets(cs)
					in := Fill(dt, total, seed, me, 0)
					out := comm.MakeBuffer(dt, cs[me])
					ck := checker{me, fmt.Sprintf("reduce_scatter %s %s counts=%v", dt, op, cs)}
					if err := pg.ReduceScatter(ctx, out, in, op, counts); err != nil {
						return fmt.Errorf("%s: %w", ck.what, err)
					}
					if err := ck.compare(out, func(i int) float64 { return ReduceRef(dt, op, seed, all, off[me]+i) }); err != nil {
						return err
					}
					// in place: out is this rank's block of in (Megatron's
					// distributed optimizer reduce-scatters into its shard)
					in = Fill(dt, total, seed, me, 0)
					ck.what += " in place"
					if err := pg.ReduceScatter(ctx, in.Slice(off[me], off[me+1]), in, op, counts); err != nil {
						return fmt.Errorf("%s: %w", ck.what, err)
					}
					if err := ck.compare(in.Slice(off[me], off[me+1]), func(i int) float64 { return ReduceRef(dt, op, seed, all, off[me]+i) }); err != nil {
						return err
					}
					// all_gather of blocks, then in place
					seed++
					in = Fill(dt, cs[me], seed, me, 0)
					out = comm.MakeBuffer(dt, total)
					ck.what = fmt.Sprintf("all_gather %s counts=%v", dt, cs)
					if err := pg.AllGather(ctx, out, in, counts); err != nil {
						return fmt.Errorf("%s: %w", ck.what, err)
					}
					owner := func(i int) (int, int) {
						r := 0
						for off[r+1] <= i {
							r++
						}
						return r, i - off[r]
					}
					gathered := func(i int) float64 { r, k := owner(i); return float64(Value(seed, r, k)) }
					if err := ck.compare(out, gathered); err != nil {
						return err
					}
					clear(out.Data)
					copy(out.Slice(off[me], off[me+1]).Data, in.Data)
					ck.what += " in place"
					if err := pg.AllGather(ctx, out, out.Slice(off[me], off[me+1]), counts); err != nil {
						return fmt.Errorf("%s: %w", ck.what, err)
					}
					if err := ck.compare(out, gathered); err != nil {
						return err
					}
				}
			}
			// broadcast from every root
			for root := range n {
				seed++
				buf := Fill(dt, size, seed, me, 0)
				ck := checker{me, fmt.Sprintf("broadcast %s n=%d root=%d", dt, size, root)}
				if err := pg.Broadcast(ctx, buf, root); err != nil {
					return fmt.Errorf("%s: %w", ck.what, err)
				}
				if err := ck.compare(buf, func(i int) float64 { return float64(Value(seed, root, i)) }); err != nil {
					return err
				}
			}
			// all_to_all with uneven counts: rank r sends sc(r, j) to j
			seed++
			sc := func(r, j int) int { return (r+2*j+size)%3 + size%4 }
			send, recv := make([]int, n), make([]int, n)
			for j := range n {
				send[j], recv[j] = sc(me, j), sc(j, me)
			}
			soff, roff := comm.Offsets(send), comm.Offsets(recv)
			in := Fill(dt, soff[n], seed, me, 0)
			out := comm.MakeBuffer(dt, roff[n])
			ck := checker{me, fmt.Sprintf("all_to_all %s send=%v recv=%v", dt, send, recv)}
			if err := pg.AllToAll(ctx, out, in, send, recv); err != nil {
				return fmt.Errorf("%s: %w", ck.what, err)
			}
			if err := ck.compare(out, func(i int) float64 {
				j := 0
				for roff[j+1] <= i {
					j++
				}
				// rank j's offset of its block for me
				o := 0
				for k := range me {
					o += sc(j, k)
				}
				return float64(Value(seed, j, o+i-roff[j]))
			}); err != nil {
				return err
			}
		}
		if err := sendRecv(ctx, pg, dt, seed); err != nil {
			return err
		}
		if err := pg.Barrier(ctx); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
	}
	return subGroups(ctx, pg)
}

// sendRecv passes a message around the ring in both directions, with plain
// Send/Recv (even ranks send first) and, if offered, BatchSendRecv.
func sendRecv(ctx context.Context, pg comm.ProcessGroup, dt tensor.DType, seed int) error {
	n, me := pg.Size(), pg.Rank()
	if n == 1 {
		return nil
	}
	next, prev := (me+1)%n, (me+n-1)%n
	size := 37 + n
	out := Fill(dt, size, seed, me, 0)
	in := comm.MakeBuffer(dt, size)
	var err error
	if me%2 == 0 {
		if err = pg.Send(ctx, out, next); err == nil {
			err = pg.Recv(ctx, in, prev)
		}
	} else {
		if err = pg.Recv(ctx, in, prev); err == nil {
			err = pg.Send(ctx, out, next)
		}
	}
	if err != nil {
		return fmt.Errorf("send/recv ring %s: %w", dt, err)
	}
	ck := checker{me, fmt.Sprintf("send/recv ring %s", dt)}
	if err := ck.compare(in, func(i int) float64 { return float64(Value(seed, prev, i)) }); err != nil {
		return err
	}
	b, ok := pg.(comm.BatchSendRecv)
	if !ok {
		return nil
	}
	// Both directions at once, two messages each way, receives listed first.
	ins := []comm.Buffer{comm.MakeBuffer(dt, size), comm.MakeBuffer(dt, 3), comm.MakeBuffer(dt, size), comm.MakeBuffer(dt, 3)}
	ops := []comm.P2POp{
		{Kind: comm.RecvOp, Peer: prev, Buf: ins[0]}, {Kind: comm.RecvOp, Peer: prev, Buf: ins[1]},
		{Kind: comm.RecvOp, Peer: next, Buf: ins[2]}, {Kind: comm.RecvOp, Peer: next, Buf: ins[3]},
		{Kind: comm.SendOp, Peer: next, Buf: Fill(dt, size, seed, me, 0)}, {Kind: comm.SendOp, Peer: next, Buf: Fill(dt, 3, seed+1, me, 0)},
		{Kind: comm.SendOp, Peer: prev, Buf: Fill(dt, size, seed, me, 0)}, {Kind: comm.SendOp, Peer: prev, Buf: Fill(dt, 3, seed+1, me, 0)},
	}
	if n == 2 { // prev == next: both directions are the same peer; keep one.
		ops = []comm.P2POp{ops[0], ops[1], ops[4], ops[5]}
		ins = ins[:2]
	}
	if err := b.BatchSendRecv(ctx, ops); err != nil {
		return fmt.Errorf("batch send/recv %s: %w", dt, err)
	}
	srcs := []int{prev, prev, next, next}
	seeds := []int{seed, seed + 1, seed, seed + 1}
	for k, in := range ins {
		ck := checker{me, fmt.Sprintf("batch send/recv %s message %d", dt, k)}
		if err := ck.compare(in, func(i int) float64 { return float64(Value(seeds[k], srcs[k], i)) }); err != nil {
			return err
		}
	}
	return nil
}

// subGroups checks NewGroup: evens and odds each all-reduce at once, then
// the whole world reversed (group rank 0 = world rank n-1) broadcasts from
// its rank 0, and a group made twice from one list stays two groups.
func subGroups(ctx context.Context, pg comm.ProcessGroup) error {
	n, me := pg.Size(), pg.Rank()
	var mine []int
	for r := me % 2; r < n; r += 2 {
		mine = append(mine, r)
	}
	g, err := pg.NewGroup(mine)
	if err != nil {
		return fmt.Errorf("new_group %v: %w", mine, err)
	}
	if g.Size() != len(mine) || mine[g.Rank()] != me {
		return fmt.Errorf("rank %d: new_group %v: got rank %d of %d", me, mine, g.Rank(), g.Size())
	}
	const seed = 9001
	buf := Fill(tensor.Float32, 1001, seed, me, 0)
	if err := g.AllReduce(ctx, buf, comm.Sum); err != nil {
		return fmt.Errorf("all_reduce on group %v: %w", mine, err)
	}
	ck := checker{me, fmt.Sprintf("all_reduce on group %v", mine)}
	if err := ck.compare(buf, func(i int) float64 { return ReduceRef(tensor.Float32, comm.Sum, seed, mine, i) }); err != nil {
		return err
	}
	rev := make([]int, n)
	for i := range rev {
		rev[i] = n - 1 - i
	}
	r1, err := pg.NewGroup(rev)
	if err != nil {
		return fmt.Errorf("new_group %v: %w", rev, err)
	}
	r2, err := pg.NewGroup(rev)
	if err != nil {
		return fmt.Errorf("new_group %v (second): %w", rev, err)
	}
	if r1.Rank() != n-1-me {
		return fmt.Errorf("rank %d: reversed group rank %d, want %d", me, r1.Rank(), n-1-me)
	}
	b1, b2 := Fill(tensor.Int64, 77, seed+1, me, 0), Fill(tensor.Int64, 77, seed+2, me, 0)
	if err := r1.Broadcast(ctx, b1, 0); err != nil {
		return fmt.Errorf("broadcast on reversed group: %w", err)
	}
	if err := r2.AllReduce(ctx, b2, comm.Max); err != nil {
		return fmt.Errorf("all_reduce on second reversed group: %w", err)
	}
	ck.what = "broadcast on reversed group"
	if err := ck.compare(b1, func(i int) float64 { return float64(Value(seed+1, n-1, i)) }); err != nil {
		return err
	}
	ck.what = "all_reduce max on second reversed group"
	if err := ck.compare(b2, func(i int) float64 { return ReduceRef(tensor.Int64, comm.Max, seed+2, rev, i) }); err != nil {
		return err
	}
	if _, err := pg.NewGroup([]int{(me + 1) % n}); n > 1 && !isNotMember(err) {
		return fmt.Errorf("rank %d: new_group without it: got %v, want ErrNotMember", me, err)
	}
	return nil
}

func isNotMember(err error) bool {
	var re *comm.RankError
	return errors.As(err, &re) && errors.Is(re.Err, comm.ErrNotMember)
}

// ConcurrentGroups runs three groups at once from three goroutines per rank
// (the world, the world reversed, and pairs of neighbours), each doing
// rounds of all-reduce of a small and a large buffer, and checks every
// result. It shows groups sharing a backend's connections do not steal or
// block each other's messages.
func ConcurrentGroups(ctx context.Context, pg comm.ProcessGroup, rounds int) error {
	n, me := pg.Size(), pg.Rank()
	rev := make([]int, n)
	for i := range rev {
		rev[i] = n - 1 - i
	}
	pair := []int{me / 2 * 2}
	if me/2*2+1 < n {
		pair = append(pair, me/2*2+1)
	}
	world := make([]int, n)
	for i := range world {
		world[i] = i
	}
	gr, err := pg.NewGroup(rev)
	if err != nil {
		return err
	}
	gp, err := pg.NewGroup(pair)
	if err != nil {
		return err
	}
	type job struct {
		g       comm.ProcessGroup
		members []int // world ranks in group order
		seed    int
	}
	jobs := []job{{pg, world, 100}, {gr, rev, 200}, {gp, pair, 300}}
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		go func() {
			for round := range rounds {
				for _, size := range []int{17, 40000} {
					seed := j.seed + round*2 + size%2
					buf := Fill(tensor.Float32, size, seed, me, 0)
					if err := j.g.AllReduce(ctx, buf, comm.Sum); err != nil {
						errs <- fmt.Errorf("group %v round %d: %w", j.members, round, err)
						return
					}
					ck := checker{me, fmt.Sprintf("concurrent all_reduce on group %v round %d size %d", j.members, round, size)}
					if err := ck.compare(buf, func(i int) float64 { return ReduceRef(tensor.Float32, comm.Sum, seed, j.members, i) }); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range jobs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
