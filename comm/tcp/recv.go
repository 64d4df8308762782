package tcp

import (
	"io"
	"unsafe"

	"github.com/gotron/gotron/comm"
)

// Receiving into a reduction. A ring reduce-scatter step combines what the
// previous rank sends with this rank's own segment. The reader does it as
// the payload arrives: from a shared-memory ring it reduces straight out of
// the ring into the destination, so every received byte is read once and
// the destination read and written once, with no scratch copy in between
// (the copy-then-reduce it replaces wrote and re-read each byte once more).

// bounceBytes is the aligned staging area for ring bytes that cannot be
// reduced in place: an element split by the ring's wrap, or a ring position
// left misaligned by an earlier frame of odd length.
const bounceBytes = 64 << 10

// postReduce registers a receive whose payload is combined into dst
// (dst = dst op payload) instead of copied over it.
func (pc *peerConn) postReduce(tag, seq uint32, dst comm.Buffer, op comm.ReduceOp) *req {
	return pc.postReq(tag, seq, dst.Data, dst.DType, op, true)
}

// fill reads r's payload of len(r.dst) bytes from the socket or, when
// viaShm, from the pair's ring, and copies or reduces it into r.dst.
func (pc *peerConn) fill(viaShm bool, r *req) error {
	switch {
	case !r.reduce && viaShm:
		_, err := io.ReadFull(pc.shm, r.dst)
		return err
	case !r.reduce:
		_, err := io.ReadFull(pc.c, r.dst)
		return err
	case viaShm:
		return pc.reduceFromShm(comm.Buffer{DType: r.dt, Data: r.dst}, r.red)
	}
	buf := pc.w.pool.get(len(r.dst))
	defer pc.w.pool.put(buf)
	if _, err := io.ReadFull(pc.c, buf); err != nil {
		return err
	}
	comm.Accumulate(comm.Buffer{DType: r.dt, Data: r.dst}, comm.Buffer{DType: r.dt, Data: buf}, r.red)
	return nil
}

// reduceFromShm combines the next len(dst.Data) bytes of the ring into dst.
// Whole aligned elements are reduced where they lie; the rest goes through
// the bounce buffer, carrying a split element over to the next piece.
func (pc *peerConn) reduceFromShm(dst comm.Buffer, op comm.ReduceOp) error {
	l, es := pc.shm, dst.DType.Size()
	rem := len(dst.Data) // payload bytes still in the ring
	pos := 0             // bytes of dst combined so far
	nc := 0              // bytes staged at the start of the bounce buffer
	for rem > 0 {
		p, err := l.next(min(rem, shmPiece))
		if err != nil {
			return err
		}
		if m := len(p) / es * es; nc == 0 && m > 0 && uintptr(unsafe.Pointer(&p[0]))%uintptr(es) == 0 {
			comm.Accumulate(dst.Slice(pos/es, (pos+m)/es), comm.Buffer{DType: dst.DType, Data: p[:m]}, op)
			l.release(m)
			rem, pos = rem-m, pos+m
			continue
		}
		if pc.bounce == nil {
			pc.bounce = make([]uint64, bounceBytes/8)
		}
		b := unsafe.Slice((*byte)(unsafe.Pointer(&pc.bounce[0])), bounceBytes)
		k := copy(b[nc:], p)
		l.release(k)
		rem, nc = rem-k, nc+k
		m := nc / es * es
		comm.Accumulate(dst.Slice(pos/es, (pos+m)/es), comm.Buffer{DType: dst.DType, Data: b[:m]}, op)
		pos += m
		nc = copy(b, b[m:nc])
	}
	return nil
}
