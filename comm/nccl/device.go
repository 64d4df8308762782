package nccl

import (
	"runtime"
	"unsafe"

	"github.com/gotron/gotron/internal/cuda"
)

// device is what a group needs of its GPU: scratch memory, host copies and
// communicators. cudaDevice is the real one; the tests run every
// collective's data movement on a fake over host memory and comm/inproc.
type device interface {
	Alloc(n int64) (cuda.Ptr, error)
	Free(p cuda.Ptr)
	CopyHtoD(dst cuda.Ptr, src unsafe.Pointer, n int64) error
	CopyDtoH(dst unsafe.Pointer, src cuda.Ptr, n int64) error
	Memset(dst cuda.Ptr, n int64) error
	Synchronize() error
	// newComm joins rank of the communicator id whose members are the
	// world ranks listed (ncclCommInitRank needs only their number).
	newComm(id cuda.NCCLUniqueID, worldRanks []int, rank int) (communicator, error)
	// groupStart and groupEnd bracket grouped NCCL calls.
	groupStart() error
	groupEnd() error
}

// communicator is one rank's NCCL communicator (*cuda.Comm).
type communicator interface {
	AllReduce(send, recv cuda.Ptr, count int64, t cuda.NCCLType, op cuda.ReduceOp) error
	ReduceScatter(send, recv cuda.Ptr, recvCount int64, t cuda.NCCLType, op cuda.ReduceOp) error
	AllGather(send, recv cuda.Ptr, sendCount int64, t cuda.NCCLType) error
	Broadcast(send, recv cuda.Ptr, count int64, t cuda.NCCLType, root int) error
	Send(send cuda.Ptr, count int64, t cuda.NCCLType, peer int) error
	Recv(recv cuda.Ptr, count int64, t cuda.NCCLType, peer int) error
	Destroy() error
}

var _ communicator = (*cuda.Comm)(nil)

// cudaDevice is a GPU driven through internal/cuda.
type cudaDevice struct{ *cuda.Device }

func (d cudaDevice) newComm(id cuda.NCCLUniqueID, worldRanks []int, rank int) (communicator, error) {
	return d.NewComm(id, len(worldRanks), rank)
}

func (cudaDevice) groupStart() error { return cuda.NCCLGroupStart() }
func (cudaDevice) groupEnd() error   { return cuda.NCCLGroupEnd() }

// grouped runs f between groupStart and groupEnd on one OS thread (NCCL's
// group state is per thread).
func grouped(d device, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.groupStart(); err != nil {
		return err
	}
	err := f()
	if endErr := d.groupEnd(); err == nil {
		err = endErr
	}
	return err
}
