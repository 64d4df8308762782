//go:build linux

package tcp

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File layout: two 4 KiB header pages (direction 0: dialer → acceptor,
// direction 1: acceptor → dialer), then the two data areas of ShmBytes
// each. A header page holds, each on its own cache line:
//
//	head      u64 at 0    bytes ever written (producer)
//	prodWait  u32 at 64   1 while the producer sleeps on tail
//	tail      u64 at 128  bytes ever read (consumer)
//	consWait  u32 at 192  1 while the consumer sleeps on head
//
// head and tail only grow; the byte at position p lives at data[p % size].
// Sleepers wait with FUTEX_WAIT on the low 32 bits of the counter they
// wait for (it changes with every advance, which is smaller than 4 GiB).
const (
	shmPage     = 4096
	offHead     = 0
	offProdWait = 64
	offTail     = 128
	offConsWait = 192
)

// Waiting: spin shmSpin times, then sleep on the futex for at most shmPoll
// and look at the socket, the local close flag, ctx and the deadline.
const shmSpin = 200

// shmPrefix starts the names of shared-memory files, followed by the
// creating process's pid.
const shmPrefix = "gotron-tcp-"

const (
	futexWait = 0
	futexWake = 1
)

// ring is one direction of a link.
type ring struct {
	head, tail         *atomic.Uint64
	prodWait, consWait *atomic.Uint32
	data               []byte
	size               uint64
}

func newRing(hdr, data []byte) ring {
	p := unsafe.Pointer(&hdr[0])
	return ring{
		head:     (*atomic.Uint64)(unsafe.Add(p, offHead)),
		prodWait: (*atomic.Uint32)(unsafe.Add(p, offProdWait)),
		tail:     (*atomic.Uint64)(unsafe.Add(p, offTail)),
		consWait: (*atomic.Uint32)(unsafe.Add(p, offConsWait)),
		data:     data,
		size:     uint64(len(data)),
	}
}

func low32(c *atomic.Uint64) *uint32 { return (*uint32)(unsafe.Pointer(c)) }

func futexSleep(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWakeAll(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, 1<<30, 0, 0, 0)
}

// shmLink is a pair's shared mapping: tx is written by this rank, rx read.
type shmLink struct {
	mem    []byte
	tx, rx ring
	conn   *net.TCPConn // the pair's socket, polled for the peer's death
	closed atomic.Bool  // set locally by closeConn
	broken bool         // rx lost its place (abandoned frame); reader only
}

func newShmLink(mem []byte, ringBytes int, dialer bool) *shmLink {
	d0 := mem[2*shmPage : 2*shmPage+ringBytes]
	d1 := mem[2*shmPage+ringBytes:]
	r0, r1 := newRing(mem[:shmPage], d0), newRing(mem[shmPage:2*shmPage], d1)
	l := &shmLink{mem: mem, tx: r0, rx: r1}
	if !dialer {
		l.tx, l.rx = r1, r0
	}
	return l
}

func shmDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && unix.Access("/dev/shm", unix.W_OK) == nil {
		return "/dev/shm"
	}
	return os.TempDir()
}

// createShm makes and maps a zeroed file for a link (the dialer's side).
// It returns nil on any failure (the pair then uses sockets).
func createShm(ringBytes int) (*shmLink, string) {
	if ringBytes == 0 {
		ringBytes = DefaultShmBytes
	}
	mem, path := createShmFile(2*shmPage + 2*ringBytes)
	if mem == nil {
		return nil, ""
	}
	return newShmLink(mem, ringBytes, true), path
}

// createShmFile makes a zeroed shared-memory file of size bytes and maps
// it, reserving its memory so that a full tmpfs fails here and not with
// SIGBUS later. It returns nil on any failure.
func createShmFile(size int) ([]byte, string) {
	for _, dir := range []string{shmDir(), os.TempDir()} {
		f, err := os.CreateTemp(dir, shmPrefix+strconv.Itoa(os.Getpid())+"-*.shm")
		if err != nil {
			continue
		}
		err = unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
		var mem []byte
		if err == nil {
			mem, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		}
		f.Close()
		if err != nil {
			os.Remove(f.Name())
			continue
		}
		return mem, f.Name()
	}
	return nil, ""
}

// openShmFile maps another process's file of size bytes, or returns nil if
// it cannot (missing, another size, mapping refused). It does not unlink it.
func openShmFile(path string, size int) []byte {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != int64(size) {
		return nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	return mem
}

// unmapShm releases a mapping made by createShmFile or openShmFile.
func unmapShm(mem []byte) { unix.Munmap(mem) }

// openShm maps the dialer's file (the acceptor's side) and unlinks it, so
// nothing is left behind whatever happens to either process. It returns nil
// if the file cannot be used.
func openShm(path string, ringBytes int) *shmLink {
	if ringBytes == 0 {
		ringBytes = DefaultShmBytes
	}
	mem := openShmFile(path, 2*shmPage+2*ringBytes)
	os.Remove(path)
	if mem == nil {
		return nil // gone, or the peer uses another ring size
	}
	return newShmLink(mem, ringBytes, false)
}

// unmap releases the mapping; nothing may touch the rings afterwards.
func (l *shmLink) unmap() {
	if l.mem != nil {
		unix.Munmap(l.mem)
		l.mem = nil
	}
}

// close makes every wait on the link return net.ErrClosed.
func (l *shmLink) close() {
	l.closed.Store(true)
	futexWakeAll(low32(l.rx.head))
	futexWakeAll(low32(l.tx.tail))
}

// peerGone polls the socket without reading: dead means the peer closed or
// the connection failed (or this side closed it), readable that data
// waits.
func (l *shmLink) peerGone() (dead, readable bool) {
	raw, err := l.conn.SyscallConn()
	if err != nil {
		return true, false
	}
	var rev int16
	cerr := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			rev = fds[0].Revents
		}
	})
	if cerr != nil {
		return true, false
	}
	return rev&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0, rev&unix.POLLIN != 0
}

// Read reads at least one byte of the current frame's payload from rx. It
// returns net.ErrClosed after close, and errShmAbandoned if the ring stays
// empty while the socket shows data or the peer's end (the peer publishes a
// frame's payload before it writes anything else to the socket).
func (l *shmLink) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	q, err := l.next(len(p))
	if err != nil {
		return 0, err
	}
	n := copy(p, q)
	l.release(n)
	return n, nil
}

// next waits until rx holds unread bytes and returns a view of them without
// consuming them: at most limit (> 0) bytes, contiguous in the ring. The
// view stays valid until release; its errors are Read's.
func (l *shmLink) next(limit int) ([]byte, error) {
	r := &l.rx
	t := r.tail.Load()
	for spin := 0; ; spin++ {
		if h := r.head.Load(); h != t {
			off := t % r.size
			return r.data[off:min(r.size, off+(h-t), off+uint64(limit))], nil
		}
		if l.closed.Load() {
			return nil, net.ErrClosed
		}
		if spin < shmSpin {
			continue
		}
		r.consWait.Store(1)
		if r.head.Load() == t {
			futexSleep(low32(r.head), uint32(t), shmPoll)
		}
		r.consWait.Store(0)
		if r.head.Load() != t || l.closed.Load() {
			continue
		}
		if dead, readable := l.peerGone(); dead || readable {
			if r.head.Load() != t {
				continue
			}
			if l.closed.Load() {
				return nil, net.ErrClosed
			}
			return nil, errShmAbandoned
		}
	}
}

// release consumes the first n bytes of the view next returned, handing
// their room back to the producer.
func (l *shmLink) release(n int) {
	r := &l.rx
	r.tail.Store(r.tail.Load() + uint64(n))
	if r.prodWait.Load() != 0 {
		futexWakeAll(low32(r.tail))
	}
}

// tryWrite copies as much of data into tx as fits now, without waiting.
func (l *shmLink) tryWrite(data []byte) int {
	r := &l.tx
	done := 0
	for done < len(data) {
		h, t := r.head.Load(), r.tail.Load()
		free := r.size - (h - t)
		if free == 0 {
			break
		}
		off := h % r.size
		n := copy(r.data[off:min(r.size, off+free, off+shmPiece)], data[done:])
		r.head.Store(h + uint64(n))
		done += n
	}
	if done > 0 && r.consWait.Load() != 0 {
		futexWakeAll(low32(r.head))
	}
	return done
}

// write copies all of data into tx, waiting for room. It fails with ctx's
// error, os.ErrDeadlineExceeded after deadline, net.ErrClosed after close,
// or io.ErrClosedPipe when the peer's socket is gone.
func (l *shmLink) write(ctx context.Context, data []byte, deadline time.Time) error {
	r := &l.tx
	for spin := 0; len(data) > 0; {
		if n := l.tryWrite(data); n > 0 {
			data, spin = data[n:], 0
			continue
		}
		if l.closed.Load() {
			return net.ErrClosed
		}
		if spin++; spin < shmSpin {
			continue
		}
		t := r.tail.Load()
		r.prodWait.Store(1)
		if r.head.Load()-r.tail.Load() == r.size {
			futexSleep(low32(r.tail), uint32(t), shmPoll)
		}
		r.prodWait.Store(0)
		if r.head.Load()-r.tail.Load() < r.size {
			continue
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case l.closed.Load():
			return net.ErrClosed
		case !time.Now().Before(deadline):
			return os.ErrDeadlineExceeded
		}
		if dead, _ := l.peerGone(); dead {
			return io.ErrClosedPipe
		}
	}
	return nil
}

// osYield gives the CPU to another runnable thread or process, if any.
func osYield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
