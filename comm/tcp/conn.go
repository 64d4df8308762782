package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Frame header (little-endian): tag u32, seq u32, payload length u64 (bit
// 63 set: the payload is in the pair's shared-memory ring, see shm.go).
// tag = group tag<<1 | 1 for point-to-point traffic; ctrlTag carries an
// abort notice (blamed rank i32, kind u8: 0 lost, 1 timeout) or, with kind
// waitNotice, word that the sender is alive and waiting on that rank. seq
// numbers the group's collectives (or, for point-to-point, the messages
// from sender to receiver), so a frame meant for another operation is
// caught as a mismatch instead of being read as data.
const (
	headerLen   = 16
	ctrlTag     = 0xFFFFFFFF
	maxGroupTag = 0x3FFFFFFF
	helloMagic  = 0x4E525447 // "GTRN"
	helloVer    = 2          // 2: a shared-memory offer follows the hello
	smallWrite  = 64 << 10   // frames up to this are copied into one write
	maxFrame    = 1 << 36    // larger frame lengths mean a corrupt stream
	waitNotice  = 2          // control frame kind: not a failure, see world.wait
	// heartbeatNotice is the control frame kind of a failure found by
	// missed heartbeats (rendezvous.go).
	heartbeatNotice = 3
)

func writeHello(c net.Conn, size, rank int) error {
	var b [16]byte
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint32(b[4:], helloVer)
	binary.LittleEndian.PutUint32(b[8:], uint32(size))
	binary.LittleEndian.PutUint32(b[12:], uint32(rank))
	_, err := c.Write(b[:])
	return err
}

func readHello(c net.Conn) (size, rank int, err error) {
	var b [16]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, 0, err
	}
	if binary.LittleEndian.Uint32(b[0:]) != helloMagic || binary.LittleEndian.Uint32(b[4:]) != helloVer {
		return 0, 0, errors.New("not a gotron tcp peer (bad magic or version)")
	}
	return int(binary.LittleEndian.Uint32(b[8:])), int(binary.LittleEndian.Uint32(b[12:])), nil
}

// bufPool recycles byte buffers by power-of-two size class, for frames that
// arrive before their receive is posted.
type bufPool struct {
	mu   sync.Mutex
	free [64][][]byte
}

func (p *bufPool) get(n int) []byte {
	if n == 0 {
		return nil
	}
	cls := bits.Len(uint(n - 1))
	p.mu.Lock()
	if l := p.free[cls]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[cls] = l[:len(l)-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<cls)
}

func (p *bufPool) put(b []byte) {
	if cap(b) == 0 {
		return
	}
	cls := bits.Len(uint(cap(b) - 1))
	p.mu.Lock()
	p.free[cls] = append(p.free[cls], b[:0])
	p.mu.Unlock()
}

// frame is a frame that arrived before its receive was posted.
type frame struct {
	buf []byte // from the pool
	seq uint32
}

// req is a posted receive.
type req struct {
	pc  *peerConn
	tag uint32
	seq uint32
	dst []byte
	dt  tensor.DType  // with reduce: dst's element type
	red comm.ReduceOp // with reduce: how the payload combines into dst
	// reduce: the payload is combined into dst (dst = dst red payload),
	// not copied over it.
	reduce bool
	taken  bool       // the reader is filling dst (under pc.mu)
	done   chan error // buffered 1; exactly one value per use
}

var reqPool = sync.Pool{New: func() any { return &req{done: make(chan error, 1)} }}

// peerConn is the connection to one peer.
type peerConn struct {
	w    *world
	peer int
	c    *net.TCPConn

	wmu  sync.Mutex // serialises frame writes; protects wbuf
	wbuf []byte

	readerDone chan struct{} // closed when readLoop returns
	started    bool          // readLoop was started (set before it runs)

	shm      *shmLink // shared memory with a same-host peer, or nil
	bounce   []uint64 // reader only: staging for reduceFromShm, made on first use
	shmGone  bool     // shm is unmapped (under wmu)
	shmSent  atomic.Uint64
	sockSent atomic.Uint64

	// waitingAt is when the peer last said that its own timeout ran out
	// waiting on another rank (unix nanoseconds; 0: never).
	waitingAt atomic.Int64

	mu         sync.Mutex // protects the fields below
	posted     map[uint32][]*req
	unexpected map[uint32][]frame
	err        error // set when the reader stopped
}

func newPeerConn(w *world, peer int, c *net.TCPConn, link *shmLink) *peerConn {
	c.SetNoDelay(true)
	if link != nil {
		link.conn = c
	}
	return &peerConn{w: w, peer: peer, c: c, shm: link, readerDone: make(chan struct{}), posted: map[uint32][]*req{}, unexpected: map[uint32][]frame{}}
}

// closeConn closes the connection and wakes anyone waiting on its shared
// memory.
func (pc *peerConn) closeConn() {
	if pc.shm != nil {
		pc.shm.close()
	}
	pc.c.Close()
}

func (pc *peerConn) readLoop() {
	defer close(pc.readerDone)
	var hdr [headerLen]byte
	var err error
	// orphan is a receive whose shared-memory payload the peer abandoned:
	// it is answered after the next socket frame, which is usually the
	// peer's abort notice naming the real culprit.
	var orphan *req
	for {
		if _, err = io.ReadFull(pc.c, hdr[:]); err != nil {
			break
		}
		tag := binary.LittleEndian.Uint32(hdr[0:])
		seq := binary.LittleEndian.Uint32(hdr[4:])
		n := binary.LittleEndian.Uint64(hdr[8:])
		var src io.Reader = pc.c
		viaShm := false
		if n&shmFlag != 0 && tag != ctrlTag {
			n &^= shmFlag
			if pc.shm == nil || pc.shm.broken {
				err = errors.New("shared-memory frame on a connection without a usable ring")
				break
			}
			src, viaShm = pc.shm, true
		}
		if tag == ctrlTag {
			var b [5]byte
			if n != 5 {
				err = fmt.Errorf("bad control frame of %d bytes", n)
				break
			}
			if _, err = io.ReadFull(pc.c, b[:]); err != nil {
				break
			}
			blame := int(int32(binary.LittleEndian.Uint32(b[:])))
			if b[4] == waitNotice {
				pc.waitingAt.Store(time.Now().UnixNano())
				continue
			}
			cause := comm.ErrPeerLost
			if b[4] == 1 {
				cause = comm.ErrTimeout
			}
			if b[4] == heartbeatNotice {
				pc.w.fail(blame, fmt.Errorf("%w: %s: %w for %v (reported by rank %d)", cause, pc.w.who(blame), errNoHeartbeat,
					pc.w.cfg.HeartbeatTimeout, pc.peer), true)
			} else {
				pc.w.fail(blame, fmt.Errorf("%w (reported by rank %d)", cause, pc.peer), true)
			}
			if orphan != nil {
				orphan.done <- fmt.Errorf("%w: rank %d abandoned a message", cause, pc.peer)
				orphan = nil
			}
			continue
		}
		if orphan != nil { // a data frame after an abandoned one: stream lost
			err = errShmAbandoned
			break
		}
		if n > maxFrame {
			err = fmt.Errorf("frame of %d bytes exceeds %d: stream corrupt", n, uint64(maxFrame))
			break
		}
		pc.mu.Lock()
		if q := pc.posted[tag]; len(q) > 0 {
			r := q[0]
			pc.posted[tag] = q[1:]
			r.taken = true
			pc.mu.Unlock()
			if uint64(len(r.dst)) != n || seq != r.seq {
				_, err = io.CopyN(io.Discard, src, int64(n))
				if err == errShmAbandoned {
					pc.shm.broken, orphan, err = true, r, nil
					continue
				}
				r.done <- mismatch(pc.peer, n, seq, len(r.dst), r.seq)
				if err != nil {
					break
				}
				continue
			}
			if err = pc.fill(viaShm, r); err != nil {
				if err == errShmAbandoned {
					pc.shm.broken, orphan, err = true, r, nil
					continue
				}
				r.done <- fmt.Errorf("%w: rank %d: %v", comm.ErrPeerLost, pc.peer, err)
				break
			}
			r.done <- nil
			continue
		}
		pc.mu.Unlock()
		buf := pc.w.pool.get(int(n))
		if _, err = io.ReadFull(src, buf); err != nil {
			pc.w.pool.put(buf)
			if err == errShmAbandoned {
				pc.shm.broken, err = true, nil
				continue
			}
			break
		}
		pc.mu.Lock()
		if q := pc.posted[tag]; len(q) > 0 { // posted while we read
			r := q[0]
			pc.posted[tag] = q[1:]
			pc.mu.Unlock()
			r.done <- deliver(r, frame{buf, seq})
			pc.w.pool.put(buf)
			continue
		}
		pc.unexpected[tag] = append(pc.unexpected[tag], frame{buf, seq})
		pc.mu.Unlock()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = errors.New("connection closed")
	}
	pc.mu.Lock()
	pc.err = fmt.Errorf("%w: connection to rank %d: %v", comm.ErrPeerLost, pc.peer, err)
	if orphan != nil {
		orphan.done <- pc.err
	}
	for tag, q := range pc.posted {
		for _, r := range q {
			r.taken = true
			r.done <- pc.err
		}
		delete(pc.posted, tag)
	}
	pc.mu.Unlock()
}

func deliver(r *req, f frame) error {
	if len(r.dst) != len(f.buf) || r.seq != f.seq {
		return mismatch(r.pc.peer, uint64(len(f.buf)), f.seq, len(r.dst), r.seq)
	}
	if r.reduce {
		comm.Accumulate(comm.Buffer{DType: r.dt, Data: r.dst}, comm.Buffer{DType: r.dt, Data: f.buf}, r.red)
		return nil
	}
	copy(r.dst, f.buf)
	return nil
}

func mismatch(peer int, n uint64, seq uint32, want int, wantSeq uint32) error {
	return fmt.Errorf("%w: rank %d sent %d bytes as message #%d, this rank expects %d bytes as #%d "+
		"(ranks called operations in different orders or with different sizes)", comm.ErrMismatch, peer, n, seq, want, wantSeq)
}

// post registers a receive of the next frame tagged tag into dst. If it is
// already here it is delivered at once (the req's done holds the result).
func (pc *peerConn) post(tag, seq uint32, dst []byte) *req {
	return pc.postReq(tag, seq, dst, 0, 0, false)
}

func (pc *peerConn) postReq(tag, seq uint32, dst []byte, dt tensor.DType, red comm.ReduceOp, reduce bool) *req {
	r := reqPool.Get().(*req)
	r.pc, r.tag, r.seq, r.dst, r.taken = pc, tag, seq, dst, false
	r.dt, r.red, r.reduce = dt, red, reduce
	pc.mu.Lock()
	if q := pc.unexpected[tag]; len(q) > 0 {
		f := q[0]
		q[0] = frame{}
		pc.unexpected[tag] = q[1:]
		pc.mu.Unlock()
		r.taken = true
		r.done <- deliver(r, f)
		pc.w.pool.put(f.buf)
		return r
	}
	if pc.err != nil {
		pc.mu.Unlock()
		r.taken = true
		r.done <- pc.err
		return r
	}
	pc.posted[tag] = append(pc.posted[tag], r)
	pc.mu.Unlock()
	return r
}

// wait waits for r; on failure it blames r's peer (or whoever the world
// already blames), cancels r and returns a RankError for op.
func (w *world) wait(ctx context.Context, r *req, op string, timer *time.Timer) error {
	select {
	case err := <-r.done:
		return w.finish(r, err, op, timer)
	case <-w.broken:
	case <-ctx.Done():
		w.fail(w.rank, fmt.Errorf("%w: rank %d abandoned %s: %v", comm.ErrPeerLost, w.rank, op, ctx.Err()), true)
		w.cancel(r)
		return &comm.RankError{Rank: w.rank, Op: op, Err: ctx.Err()}
	case <-timer.C:
		// The peer we wait on may itself be waiting on the real culprit and
		// about to say so: give its report a moment before blaming it. It
		// may have started waiting only just before we did, so its report
		// can come after our grace; but then it said it was waiting when
		// its own timeout ran out, and we wait for its report as long again.
		// Our own word goes out now, for whoever waits on us.
		silentSince := time.Now().Add(-w.cfg.Timeout).UnixNano()
		w.noteWaiting(r.pc.peer)
		grace := time.NewTimer(min(abortWait, w.cfg.Timeout/2))
		defer grace.Stop()
		for extended := false; ; {
			select {
			case err := <-r.done: // late, but here
				return w.finish(r, err, op, timer)
			case <-w.broken:
			case <-grace.C:
				if !extended && r.pc.waitingAt.Load() > silentSince {
					extended = true
					grace.Reset(w.cfg.Timeout + abortWait)
					continue
				}
				w.fail(r.pc.peer, fmt.Errorf("%w: no data from rank %d within %v", comm.ErrTimeout, r.pc.peer, w.cfg.Timeout), true)
			}
			break
		}
	}
	w.cancel(r)
	return w.failure(op)
}

// finish turns a completed receive into wait's result.
func (w *world) finish(r *req, err error, op string, timer *time.Timer) error {
	peer := r.pc.peer
	reqPool.Put(r)
	switch {
	case err == nil:
		timer.Reset(w.cfg.Timeout) // progress: the timeout bounds silence, not the whole operation
		return nil
	case errors.Is(err, comm.ErrMismatch):
		return &comm.RankError{Rank: peer, Op: op, Err: err}
	}
	w.fail(peer, err, true)
	return w.failure(op)
}

// cancel withdraws a posted receive; if the reader is filling it, the
// connection is closed so the reader stops touching dst, and cancel waits.
func (w *world) cancel(r *req) {
	pc := r.pc
	pc.mu.Lock()
	q := pc.posted[r.tag]
	for i, x := range q {
		if x == r {
			pc.posted[r.tag] = append(q[:i:i], q[i+1:]...)
			pc.mu.Unlock()
			return // never handed to the reader; dropped, not pooled
		}
	}
	pc.mu.Unlock()
	// Taken by the reader (or already answered).
	select {
	case <-r.done:
		return
	default:
	}
	pc.closeConn()
	<-r.done
}

// send writes one frame. A write blocked longer than the timeout (the
// peer stopped reading) or a broken connection fails the world.
func (pc *peerConn) send(ctx context.Context, tag, seq uint32, data []byte, op string) error {
	w := pc.w
	if err := w.failure(op); err != nil {
		return err
	}
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	deadline := time.Now().Add(w.cfg.Timeout)
	var hdr [headerLen]byte
	binary.LittleEndian.PutUint32(hdr[0:], tag)
	binary.LittleEndian.PutUint32(hdr[4:], seq)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(len(data)))
	var err error
	viaShm := pc.shm != nil && !pc.shmGone && len(data) >= shmMinBytes
	switch {
	case viaShm:
		// What fits goes into the ring before the header, so the reader
		// rarely has to wait for it; the rest follows as room appears.
		binary.LittleEndian.PutUint64(hdr[8:], uint64(len(data))|shmFlag)
		k := pc.shm.tryWrite(data)
		if err = pc.write(ctx, hdr[:], deadline); err == nil && k < len(data) {
			err = pc.shm.write(ctx, data[k:], deadline)
		}
	case len(data) <= smallWrite:
		pc.wbuf = append(append(pc.wbuf[:0], hdr[:]...), data...)
		err = pc.write(ctx, pc.wbuf, deadline)
	default:
		if err = pc.write(ctx, hdr[:], deadline); err == nil {
			err = pc.write(ctx, data, deadline)
		}
	}
	if err == nil {
		if viaShm {
			pc.shmSent.Add(uint64(len(data)))
		} else {
			pc.sockSent.Add(uint64(len(data)))
		}
		return nil
	}
	switch {
	case ctx.Err() != nil:
		w.fail(w.rank, fmt.Errorf("%w: rank %d abandoned %s: %v", comm.ErrPeerLost, w.rank, op, ctx.Err()), true)
		return &comm.RankError{Rank: w.rank, Op: op, Err: ctx.Err()}
	case isTimeout(err):
		w.fail(pc.peer, fmt.Errorf("%w: rank %d stopped reading for %v", comm.ErrTimeout, pc.peer, w.cfg.Timeout), true)
	default:
		// The peer may have exited after telling us why: let its reader
		// take in whatever it sent before blaming it.
		t := time.NewTimer(abortWait)
		select {
		case <-pc.readerDone:
		case <-t.C:
		}
		t.Stop()
		w.fail(pc.peer, fmt.Errorf("%w: send to rank %d: %v", comm.ErrPeerLost, pc.peer, err), true)
	}
	return w.failure(op)
}

// writePoll is how often a blocked socket write looks at its context.
const writePoll = 50 * time.Millisecond

// write writes all of b to the socket by deadline. It wakes every
// writePoll to look at ctx instead of arming a context callback, which
// would allocate on every frame.
func (pc *peerConn) write(ctx context.Context, b []byte, deadline time.Time) error {
	for {
		d := deadline
		if ctx.Done() != nil {
			d = time.Now().Add(writePoll)
			if d.After(deadline) {
				d = deadline
			}
		}
		pc.c.SetWriteDeadline(d)
		n, err := pc.c.Write(b)
		if err == nil || !isTimeout(err) || !d.Before(deadline) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		b = b[n:]
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// noteWaiting tells every peer but the one we wait on that our timeout ran
// out waiting on rank peer, each in the background: a writer blocked on a
// stalled connection may hold its lock, and this is only a hint.
func (w *world) noteWaiting(peer int) {
	for _, pc := range w.conns {
		if pc != nil && pc.peer != peer {
			go pc.sendAbort(peer, waitNotice)
		}
	}
}

// sendAbort tells the peer the world failed, blaming blame (or, with kind
// waitNotice, that we are waiting on blame).
func (pc *peerConn) sendAbort(blame int, kind byte) {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	var b [headerLen + 5]byte
	binary.LittleEndian.PutUint32(b[0:], ctrlTag)
	binary.LittleEndian.PutUint64(b[8:], 5)
	binary.LittleEndian.PutUint32(b[16:], uint32(int32(blame)))
	b[20] = kind
	pc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	pc.c.Write(b[:])
}
