//go:build linux

package tcp

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// TestReduceFromShm streams payloads of every dtype through rings whose
// sizes are not multiples of any element, with odd-length byte frames in
// between, so elements are split by the wrap and ring positions are
// misaligned as well as aligned. Reducing straight out of the ring must
// give exactly what Accumulate gives on a copy of the payload, and the
// byte frames must arrive intact.
func TestReduceFromShm(t *testing.T) {
	dts := []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64}
	ops := []comm.ReduceOp{comm.Sum, comm.Max, comm.Min, comm.Avg}
	for _, size := range []int{7, 4099, 1 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			a, b, _, _ := linkPair(t, size)
			rng := rand.New(rand.NewPCG(2, uint64(size)))
			type msg struct {
				raw     []byte      // a plain frame: copied, not reduced
				payload comm.Buffer // else reduced into dst
				dst     comm.Buffer
				op      comm.ReduceOp
			}
			var msgs []msg
			for range 60 {
				if rng.IntN(3) == 0 {
					m := make([]byte, 1+rng.IntN(3000))
					for i := range m {
						m[i] = byte(rng.Uint32())
					}
					msgs = append(msgs, msg{raw: m})
					continue
				}
				dt := dts[rng.IntN(len(dts))]
				n := 1 + rng.IntN(min(70000, 400*size)/dt.Size())
				m := msg{payload: randBuffer(rng, dt, n), dst: randBuffer(rng, dt, n), op: ops[rng.IntN(len(ops))]}
				msgs = append(msgs, m)
			}
			deadline := time.Now().Add(time.Minute)
			errc := make(chan error, 1)
			go func() {
				for _, m := range msgs {
					data := m.raw
					if data == nil {
						data = m.payload.Data
					}
					k := a.tryWrite(data)
					if err := a.write(context.Background(), data[k:], deadline); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			// On failure, stop the writer before linkPair's cleanup unmaps
			// the ring under it.
			writerDone := false
			t.Cleanup(func() {
				if !writerDone {
					a.close()
					<-errc
				}
			})
			pc := &peerConn{shm: b}
			for i, m := range msgs {
				if m.raw != nil {
					got := make([]byte, len(m.raw))
					if _, err := io.ReadFull(b, got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, m.raw) {
						t.Fatalf("message %d (raw, %d bytes) corrupted", i, len(m.raw))
					}
					continue
				}
				want := comm.MakeBuffer(m.dst.DType, m.dst.Len())
				copy(want.Data, m.dst.Data)
				comm.Accumulate(want, m.payload, m.op)
				if err := pc.reduceFromShm(m.dst, m.op); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(m.dst.Data, want.Data) {
					t.Fatalf("message %d (%d %s, %v): reduced out of the ring differs from Accumulate", i, m.dst.Len(), m.dst.DType, m.op)
				}
			}
			writerDone = true
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if pc.bounce == nil && size < 4096 {
				t.Errorf("a %d-byte ring never used the bounce buffer", size)
			}
		})
	}
}

// randBuffer returns n random elements of dt (small integers as floats, so
// sums are exact in any order and the comparison is about placement).
func randBuffer(rng *rand.Rand, dt tensor.DType, n int) comm.Buffer {
	b := comm.MakeBuffer(dt, n)
	switch dt {
	case tensor.Float32:
		for i := range b.Float32() {
			b.Float32()[i] = float32(rng.IntN(2001) - 1000)
		}
	case tensor.BFloat16:
		for i := range b.BFloat16() {
			b.BFloat16()[i] = tensor.Float32ToBFloat16(float32(rng.IntN(2001)-1000) / 7)
		}
	case tensor.Int32:
		for i := range b.Int32() {
			b.Int32()[i] = int32(rng.Uint32())
		}
	case tensor.Int64:
		for i := range b.Int64() {
			b.Int64()[i] = int64(rng.Uint64())
		}
	}
	return b
}
