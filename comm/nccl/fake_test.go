package nccl

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/comm/store"
	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/tensor"
)

// fakeDevice is a device over host memory whose communicators run NCCL's
// collectives with comm/inproc, synchronously: it checks every group's data
// movement (scratch blocks, padding, in-place offsets, which rank copies
// back) without a GPU. What it cannot check is NCCL itself and the stream.
type fakeDevice struct {
	world comm.ProcessGroup // this rank's inproc world
	ctx   context.Context   // the test's: ends when a rank fails

	mu     sync.Mutex
	blocks map[cuda.Ptr][]byte
	live   int
	// grouped sends and receives, between groupStart and groupEnd
	inGroup bool
	pending []fakeP2P
}

type fakeP2P struct {
	c  *fakeComm
	op comm.P2POp
}

const fakeBlock = 1 << 32 // addresses of block k are [k<<32, (k+1)<<32)

var fakeNext atomic.Uint64

func newFakeDevice(ctx context.Context, world comm.ProcessGroup) *fakeDevice {
	return &fakeDevice{world: world, ctx: ctx, blocks: map[cuda.Ptr][]byte{}}
}

// mem returns n bytes at p.
func (d *fakeDevice) mem(p cuda.Ptr, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.blocks[p&^(fakeBlock-1)]
	off := int64(p & (fakeBlock - 1))
	if !ok || off+n > int64(len(b)) {
		panic(fmt.Sprintf("fake device: %d bytes at %#x are outside every block", n, uintptr(p)))
	}
	return b[off : off+n]
}

func (d *fakeDevice) Alloc(n int64) (cuda.Ptr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("fake device: alloc of %d bytes", n)
	}
	p := cuda.Ptr((fakeNext.Add(1)) * fakeBlock)
	d.mu.Lock()
	defer d.mu.Unlock()
	b := make([]byte, n)
	for i := range b {
		b[i] = 0xA5 // not zero: nothing may rely on fresh scratch being clear
	}
	d.blocks[p] = b
	d.live++
	return p, nil
}

func (d *fakeDevice) Free(p cuda.Ptr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.blocks[p]; !ok {
		panic(fmt.Sprintf("fake device: free of %#x, not a block", uintptr(p)))
	}
	delete(d.blocks, p)
	d.live--
}

func (d *fakeDevice) CopyHtoD(dst cuda.Ptr, src unsafe.Pointer, n int64) error {
	copy(d.mem(dst, n), unsafe.Slice((*byte)(src), n))
	return nil
}

func (d *fakeDevice) CopyDtoH(dst unsafe.Pointer, src cuda.Ptr, n int64) error {
	copy(unsafe.Slice((*byte)(dst), n), d.mem(src, n))
	return nil
}

func (d *fakeDevice) Memset(dst cuda.Ptr, n int64) error {
	clear(d.mem(dst, n))
	return nil
}

func (d *fakeDevice) Synchronize() error { return nil }

func (d *fakeDevice) newComm(_ cuda.NCCLUniqueID, worldRanks []int, rank int) (communicator, error) {
	pg, err := d.world.NewGroup(worldRanks)
	if err != nil {
		return nil, err
	}
	if pg.Rank() != rank {
		return nil, fmt.Errorf("fake device: rank %d in %v, inproc says %d", rank, worldRanks, pg.Rank())
	}
	return &fakeComm{d: d, pg: pg}, nil
}

func (d *fakeDevice) groupStart() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inGroup {
		return fmt.Errorf("fake device: nested group")
	}
	d.inGroup = true
	return nil
}

func (d *fakeDevice) groupEnd() error {
	d.mu.Lock()
	ops := d.pending
	d.pending, d.inGroup = nil, false
	d.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	c := ops[0].c
	var list []comm.P2POp
	var selfSends, selfRecvs []comm.Buffer // NCCL moves these locally; inproc refuses them
	for _, o := range ops {
		if o.c != c {
			return fmt.Errorf("fake device: a group over two communicators")
		}
		switch {
		case o.op.Peer != c.pg.Rank():
			list = append(list, o.op)
		case o.op.Kind == comm.SendOp:
			selfSends = append(selfSends, o.op.Buf)
		default:
			selfRecvs = append(selfRecvs, o.op.Buf)
		}
	}
	if len(selfSends) != len(selfRecvs) {
		return fmt.Errorf("fake device: %d sends to self, %d receives", len(selfSends), len(selfRecvs))
	}
	for i, b := range selfSends {
		if len(b.Data) != len(selfRecvs[i].Data) {
			return fmt.Errorf("fake device: send to self of %d bytes, receive of %d", len(b.Data), len(selfRecvs[i].Data))
		}
		copy(selfRecvs[i].Data, b.Data)
	}
	if len(list) == 0 {
		return nil
	}
	return c.pg.(comm.BatchSendRecv).BatchSendRecv(d.ctx, list)
}

// fakeComm runs each NCCL call as the inproc collective on device bytes.
type fakeComm struct {
	d  *fakeDevice
	pg comm.ProcessGroup
}

func fakeDType(t cuda.NCCLType) tensor.DType {
	switch t {
	case cuda.NCCLFloat32:
		return tensor.Float32
	case cuda.NCCLBfloat16:
		return tensor.BFloat16
	case cuda.NCCLInt32:
		return tensor.Int32
	case cuda.NCCLInt64:
		return tensor.Int64
	}
	panic(fmt.Sprintf("fake device: NCCL type %d", t))
}

func fakeOp(op cuda.ReduceOp) comm.ReduceOp {
	switch op {
	case cuda.ReduceSum:
		return comm.Sum
	case cuda.ReduceMax:
		return comm.Max
	case cuda.ReduceMin:
		return comm.Min
	}
	panic(fmt.Sprintf("fake device: NCCL op %d (avg never reaches NCCL for host Buffers)", op))
}

func (c *fakeComm) buf(p cuda.Ptr, count int64, t cuda.NCCLType) comm.Buffer {
	dt := fakeDType(t)
	return comm.Buffer{DType: dt, Data: c.d.mem(p, count*int64(dt.Size()))}
}

func (c *fakeComm) AllReduce(send, recv cuda.Ptr, count int64, t cuda.NCCLType, op cuda.ReduceOp) error {
	out := c.buf(recv, count, t)
	copy(out.Data, c.buf(send, count, t).Data)
	return c.pg.AllReduce(c.d.ctx, out, fakeOp(op))
}

// overlap checks NCCL's rule for buffers of a block collective: the
// block buffer may overlap the whole buffer only as block Rank() of it
// (in place).
func (c *fakeComm) overlap(op string, whole, block cuda.Ptr, blockCount int64, t cuda.NCCLType) error {
	bytes := blockCount * int64(fakeDType(t).Size())
	end := whole + cuda.Ptr(bytes*int64(c.pg.Size()))
	if block+cuda.Ptr(bytes) > whole && block < end && block != whole+cuda.Ptr(bytes*int64(c.pg.Rank())) {
		return fmt.Errorf("fake device: %s: block %#x overlaps %#x..%#x but is not rank %d's block", op, uintptr(block), uintptr(whole), uintptr(end), c.pg.Rank())
	}
	return nil
}

func (c *fakeComm) ReduceScatter(send, recv cuda.Ptr, recvCount int64, t cuda.NCCLType, op cuda.ReduceOp) error {
	if err := c.overlap("ncclReduceScatter", send, recv, recvCount, t); err != nil {
		return err
	}
	in := c.buf(send, recvCount*int64(c.pg.Size()), t)
	return c.pg.ReduceScatter(c.d.ctx, c.buf(recv, recvCount, t), in, fakeOp(op), nil)
}

func (c *fakeComm) AllGather(send, recv cuda.Ptr, sendCount int64, t cuda.NCCLType) error {
	if err := c.overlap("ncclAllGather", recv, send, sendCount, t); err != nil {
		return err
	}
	out := c.buf(recv, sendCount*int64(c.pg.Size()), t)
	return c.pg.AllGather(c.d.ctx, out, c.buf(send, sendCount, t), nil)
}

func (c *fakeComm) Broadcast(send, recv cuda.Ptr, count int64, t cuda.NCCLType, root int) error {
	out := c.buf(recv, count, t)
	if c.pg.Rank() == root {
		copy(out.Data, c.buf(send, count, t).Data)
	}
	return c.pg.Broadcast(c.d.ctx, out, root)
}

func (c *fakeComm) p2p(kind comm.P2PKind, p cuda.Ptr, count int64, t cuda.NCCLType, peer int) error {
	c.d.mu.Lock()
	in := c.d.inGroup
	c.d.mu.Unlock()
	if !in {
		return fmt.Errorf("fake device: send or receive outside a group (the group always brackets them)")
	}
	b := c.buf(p, count, t)
	c.d.mu.Lock()
	c.d.pending = append(c.d.pending, fakeP2P{c, comm.P2POp{Kind: kind, Peer: peer, Buf: b}})
	c.d.mu.Unlock()
	return nil
}

func (c *fakeComm) Send(send cuda.Ptr, count int64, t cuda.NCCLType, peer int) error {
	return c.p2p(comm.SendOp, send, count, t, peer)
}

func (c *fakeComm) Recv(recv cuda.Ptr, count int64, t cuda.NCCLType, peer int) error {
	return c.p2p(comm.RecvOp, recv, count, t, peer)
}

func (c *fakeComm) Destroy() error { return nil }

// fakeJoin joins a world of pg's ranks on fake devices, the ids through a
// real store at addr.
func fakeJoin(ctx context.Context, pg comm.ProcessGroup, addr string) (*Group, *fakeDevice, error) {
	st, err := store.Dial(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	dev := newFakeDevice(ctx, pg)
	w := &world{cfg: Config{Rank: pg.Rank(), WorldSize: pg.Size(), Timeout: 30 * time.Second, Store: st},
		rank: pg.Rank(), size: pg.Size(), dev: dev, version: 22803, counts: map[string]int{},
		newID: func() (id cuda.NCCLUniqueID, err error) { _, err = rand.Read(id[:]); return id, err }}
	g, err := w.join(ctx)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return g, dev, nil
}

// The conformance suite on fake devices, 1 to 5 ranks: every host-Buffer
// collective's staging, padding and offsets, sub-groups made lazily, and
// no scratch block leaked.
func TestFakeDeviceConformance(t *testing.T) {
	srv, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			// A failing rank cancels the others, which would otherwise
			// wait for it inside an inproc collective.
			runCtx, cancel := context.WithCancel(t.Context())
			defer cancel()
			err := inproc.Run(runCtx, n, func(ctx context.Context, pg comm.ProcessGroup) (err error) {
				defer func() {
					if err != nil {
						cancel()
					}
				}()
				g, dev, err := fakeJoin(ctx, pg, srv.Addr())
				if err != nil {
					return err
				}
				defer g.Close()
				if err := commtest.Conformance(ctx, g); err != nil {
					return err
				}
				if err := commtest.ConcurrentGroups(ctx, g, 2); err != nil {
					return err
				}
				if err := g.Barrier(ctx); err != nil {
					return err
				}
				dev.mu.Lock()
				defer dev.mu.Unlock()
				if dev.live != 0 {
					return fmt.Errorf("rank %d: %d scratch blocks not freed", pg.Rank(), dev.live)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
