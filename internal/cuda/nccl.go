package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// NCCLType is an ncclDataType_t.
type NCCLType int32

const (
	NCCLInt8     NCCLType = 0
	NCCLUint8    NCCLType = 1
	NCCLInt32    NCCLType = 2
	NCCLUint32   NCCLType = 3
	NCCLInt64    NCCLType = 4
	NCCLUint64   NCCLType = 5
	NCCLFloat16  NCCLType = 6
	NCCLFloat32  NCCLType = 7
	NCCLFloat64  NCCLType = 8
	NCCLBfloat16 NCCLType = 9
)

// ReduceOp is an ncclRedOp_t.
type ReduceOp int32

const (
	ReduceSum  ReduceOp = 0
	ReduceProd ReduceOp = 1
	ReduceMax  ReduceOp = 2
	ReduceMin  ReduceOp = 3
	ReduceAvg  ReduceOp = 4 // NCCL >= 2.10
)

// NCCLUniqueID identifies a communicator: one rank creates it
// (NewNCCLUniqueID) and hands the 128 bytes to every other rank.
type NCCLUniqueID [128]byte

// ncclAPI is libnccl's functions. The collectives take no Go pointers and
// are called by address (purego.SyscallN); ncclCommInitRank too, because it
// takes the 128-byte id by value, which the SysV ABI passes on the stack.
type ncclAPI struct {
	path string

	ncclGetVersion     func(v *int32) int32
	ncclGetUniqueId    func(id *NCCLUniqueID) int32
	ncclGetErrorString func(code int32) *byte
	ncclCommDestroy    func(comm uintptr) int32

	ncclCommInitRank  uintptr // (comm*, nranks, id by value, rank)
	ncclAllReduce     uintptr // (send, recv, count, type, op, comm, stream)
	ncclReduceScatter uintptr // (send, recv, recvcount, type, op, comm, stream)
	ncclAllGather     uintptr // (send, recv, sendcount, type, comm, stream)
	ncclBroadcast     uintptr // (send, recv, count, type, root, comm, stream)
	ncclSend          uintptr // (send, count, type, peer, comm, stream)
	ncclRecv          uintptr // (recv, count, type, peer, comm, stream)
	ncclGroupStart    uintptr // ()
	ncclGroupEnd      uintptr // ()
}

var ncclLib lazy[ncclAPI]

func loadNCCL() (*ncclAPI, error) {
	return ncclLib.get(func() (*ncclAPI, error) {
		lib, path, err := ncclSearch().open()
		if err != nil {
			return nil, err
		}
		s := &symbols{lib: lib, path: path}
		n := &ncclAPI{path: path}
		s.fn(&n.ncclGetVersion, "ncclGetVersion")
		s.fn(&n.ncclGetUniqueId, "ncclGetUniqueId")
		s.fn(&n.ncclGetErrorString, "ncclGetErrorString")
		s.fn(&n.ncclCommDestroy, "ncclCommDestroy")
		n.ncclCommInitRank = s.addr("ncclCommInitRank")
		n.ncclAllReduce = s.addr("ncclAllReduce")
		n.ncclReduceScatter = s.addr("ncclReduceScatter")
		n.ncclAllGather = s.addr("ncclAllGather")
		n.ncclBroadcast = s.addr("ncclBroadcast")
		n.ncclSend = s.addr("ncclSend")
		n.ncclRecv = s.addr("ncclRecv")
		n.ncclGroupStart = s.addr("ncclGroupStart")
		n.ncclGroupEnd = s.addr("ncclGroupEnd")
		if err := s.err(); err != nil {
			return nil, err
		}
		return n, nil
	})
}

func (n *ncclAPI) check(op string, code int32) error {
	if code == 0 {
		return nil
	}
	return &Error{Op: op, Code: int(code), Name: goString(n.ncclGetErrorString(code))}
}

// NCCLVersion loads NCCL and returns its version code (e.g. 22803 for 2.28.3)
// and the library's path.
func NCCLVersion() (int, string, error) {
	n, err := loadNCCL()
	if err != nil {
		return 0, "", err
	}
	var v int32
	if err := n.check("ncclGetVersion", n.ncclGetVersion(&v)); err != nil {
		return 0, n.path, err
	}
	return int(v), n.path, nil
}

// NewNCCLUniqueID creates the id of a new communicator (ncclGetUniqueId).
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	n, err := loadNCCL()
	if err != nil {
		return id, err
	}
	err = n.check("ncclGetUniqueId", n.ncclGetUniqueId(&id))
	return id, err
}

// NCCLGroupStart and NCCLGroupEnd bracket collectives that NCCL should
// issue together (several ranks driven from one process, or send/recv
// pairs).
func NCCLGroupStart() error {
	n, err := loadNCCL()
	if err != nil {
		return err
	}
	return n.check("ncclGroupStart", call(n.ncclGroupStart))
}

// NCCLGroupEnd ends a group begun by NCCLGroupStart.
func NCCLGroupEnd() error {
	n, err := loadNCCL()
	if err != nil {
		return err
	}
	return n.check("ncclGroupEnd", call(n.ncclGroupEnd))
}

// Comm is an NCCL communicator of one rank, issuing on its Device's stream.
type Comm struct {
	d          *Device
	api        *ncclAPI
	comm       uintptr
	rank, size int
}

// NewComm joins rank (0 <= rank < nranks) of the communicator id
// (ncclCommInitRank). It blocks until all ranks have joined, so with several
// ranks in one process call it inside NCCLGroupStart/End or from one
// goroutine per rank.
func (d *Device) NewComm(id NCCLUniqueID, nranks, rank int) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("cuda: NCCL rank %d of %d: want 0 <= rank < ranks", rank, nranks)
	}
	n, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	c := &Comm{d: d, api: n, rank: rank, size: nranks}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	// ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId id, int rank):
	// the integer arguments take the first registers in order (rdi, rsi, rdx)
	// and the 128-byte struct goes on the stack, after the six register slots.
	args := make([]uintptr, 6+len(id)/8)
	args[0] = uintptr(unsafe.Pointer(&c.comm))
	args[1] = uintptr(nranks)
	args[2] = uintptr(rank)
	for i := range len(id) / 8 {
		args[6+i] = uintptr(*(*uint64)(unsafe.Pointer(&id[8*i])))
	}
	r, _, _ := purego.SyscallN(n.ncclCommInitRank, args...)
	if err := n.check("ncclCommInitRank", int32(r)); err != nil {
		return nil, fmt.Errorf("rank %d of %d on %v: %w", rank, nranks, d, err)
	}
	return c, nil
}

// Rank and Size are this rank's number and the communicator's size.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Destroy frees the communicator (ncclCommDestroy).
func (c *Comm) Destroy() error {
	if err := c.d.enter(); err != nil {
		return err
	}
	defer c.d.leave()
	return c.api.check("ncclCommDestroy", c.api.ncclCommDestroy(c.comm))
}

// collective enqueues one NCCL call on the Device's stream.
func (c *Comm) collective(op string, fn uintptr, args ...uintptr) error {
	d := c.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	r, _, _ := purego.SyscallN(fn, args...)
	d.mu.Unlock()
	if err := c.api.check(op, int32(r)); err != nil {
		return fmt.Errorf("rank %d of %d: %w", c.rank, c.size, err)
	}
	return nil
}

// AllReduce reduces count elements of send over all ranks into recv on
// every rank (send == recv is in place).
func (c *Comm) AllReduce(send, recv Ptr, count int64, t NCCLType, op ReduceOp) error {
	return c.collective("ncclAllReduce", c.api.ncclAllReduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(t), uintptr(op), c.comm, c.d.stream)
}

// ReduceScatter reduces Size()·recvCount elements of send over all ranks
// and leaves block Rank() of the result (recvCount elements) in recv.
func (c *Comm) ReduceScatter(send, recv Ptr, recvCount int64, t NCCLType, op ReduceOp) error {
	return c.collective("ncclReduceScatter", c.api.ncclReduceScatter, uintptr(send), uintptr(recv), uintptr(recvCount), uintptr(t), uintptr(op), c.comm, c.d.stream)
}

// AllGather concatenates every rank's sendCount elements, in rank order,
// into recv (Size()·sendCount elements) on every rank.
func (c *Comm) AllGather(send, recv Ptr, sendCount int64, t NCCLType) error {
	return c.collective("ncclAllGather", c.api.ncclAllGather, uintptr(send), uintptr(recv), uintptr(sendCount), uintptr(t), c.comm, c.d.stream)
}

// Broadcast copies count elements of root's send into recv on every rank.
func (c *Comm) Broadcast(send, recv Ptr, count int64, t NCCLType, root int) error {
	return c.collective("ncclBroadcast", c.api.ncclBroadcast, uintptr(send), uintptr(recv), uintptr(count), uintptr(t), uintptr(root), c.comm, c.d.stream)
}

// Send sends count elements to rank peer, which must call Recv.
func (c *Comm) Send(send Ptr, count int64, t NCCLType, peer int) error {
	return c.collective("ncclSend", c.api.ncclSend, uintptr(send), uintptr(count), uintptr(t), uintptr(peer), c.comm, c.d.stream)
}

// Recv receives count elements from rank peer into recv.
func (c *Comm) Recv(recv Ptr, count int64, t NCCLType, peer int) error {
	return c.collective("ncclRecv", c.api.ncclRecv, uintptr(recv), uintptr(count), uintptr(t), uintptr(peer), c.comm, c.d.stream)
}
