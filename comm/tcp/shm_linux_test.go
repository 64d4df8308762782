//go:build linux

package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// linkPair maps one file from both sides, as Join does, over a real
// loopback connection (polled for the peer's death).
func linkPair(t *testing.T, ringBytes int) (dialer, acceptor *shmLink, dc, ac *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dc, ac = c1.(*net.TCPConn), c2.(*net.TCPConn)
	dialer, path := createShm(ringBytes)
	if dialer == nil {
		t.Fatal("createShm failed")
	}
	acceptor = openShm(path, ringBytes)
	if acceptor == nil {
		t.Fatal("openShm failed")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after both sides mapped it (%v)", path, err)
	}
	dialer.conn, acceptor.conn = dc, ac
	t.Cleanup(func() { dc.Close(); ac.Close(); dialer.unmap(); acceptor.unmap() })
	return dialer, acceptor, dc, ac
}

// TestShmRingWrap streams messages of odd sizes through rings of odd sizes
// (smaller and larger than the messages) both ways at once, so the
// positions wrap at every offset; every byte must arrive in order.
func TestShmRingWrap(t *testing.T) {
	for _, size := range []int{1, 7, 4099, 65537} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			a, b, _, _ := linkPair(t, size)
			rng := rand.New(rand.NewPCG(1, uint64(size)))
			var msgs [][]byte
			for total := 0; total < 3<<20 && len(msgs) < 300; {
				m := make([]byte, 1+rng.IntN(3*size+100))
				for i := range m {
					m[i] = byte(rng.Uint32())
				}
				msgs = append(msgs, m)
				total += len(m)
			}
			deadline := time.Now().Add(time.Minute)
			errc := make(chan error, 4)
			for _, pair := range [][2]*shmLink{{a, b}, {b, a}} {
				tx, rx := pair[0], pair[1]
				go func() {
					for _, m := range msgs {
						k := tx.tryWrite(m)
						if err := tx.write(context.Background(), m[k:], deadline); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				go func() {
					for i, m := range msgs {
						got := make([]byte, len(m))
						if _, err := io.ReadFull(rx, got); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(got, m) {
							errc <- errors.New("message " + strconv.Itoa(i) + " corrupted")
							return
						}
					}
					errc <- nil
				}()
			}
			for range 4 {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			if h, tl := a.tx.head.Load(), a.tx.tail.Load(); h != tl || h == 0 {
				t.Errorf("after the stream head %d, tail %d: want equal and non-zero", h, tl)
			}
		})
	}
}

// TestShmWaits: every way a blocked ring wait must end.
func TestShmWaits(t *testing.T) {
	far := time.Now().Add(time.Hour)
	t.Run("read after local close", func(t *testing.T) {
		_, b, _, _ := linkPair(t, 64)
		done := make(chan error, 1)
		go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
		b.close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("got %v, want net.ErrClosed", err)
		}
	})
	t.Run("read when the peer's socket closes", func(t *testing.T) {
		_, b, dc, _ := linkPair(t, 64)
		done := make(chan error, 1)
		go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
		dc.Close()
		if err := <-done; !errors.Is(err, errShmAbandoned) {
			t.Errorf("got %v, want errShmAbandoned", err)
		}
	})
	t.Run("read when the socket carries data instead", func(t *testing.T) {
		_, b, dc, _ := linkPair(t, 64)
		done := make(chan error, 1)
		go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
		dc.Write([]byte{1})
		if err := <-done; !errors.Is(err, errShmAbandoned) {
			t.Errorf("got %v, want errShmAbandoned", err)
		}
	})
	t.Run("data published before the socket's bytes wins", func(t *testing.T) {
		a, b, dc, _ := linkPair(t, 64)
		a.tryWrite([]byte("abc"))
		dc.Write([]byte{1})
		got := make([]byte, 3)
		if _, err := io.ReadFull(b, got); err != nil || string(got) != "abc" {
			t.Errorf("got %q, %v", got, err)
		}
	})
	t.Run("write to a full ring times out", func(t *testing.T) {
		a, _, _, _ := linkPair(t, 64)
		err := a.write(context.Background(), make([]byte, 100), time.Now().Add(50*time.Millisecond))
		if !errors.Is(err, os.ErrDeadlineExceeded) || !isTimeout(err) {
			t.Errorf("got %v, want a timeout", err)
		}
	})
	t.Run("write to a full ring ends with ctx", func(t *testing.T) {
		a, _, _, _ := linkPair(t, 64)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.write(ctx, make([]byte, 100), far) }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})
	t.Run("write to a full ring of a dead peer", func(t *testing.T) {
		a, _, _, ac := linkPair(t, 64)
		done := make(chan error, 1)
		go func() { done <- a.write(context.Background(), make([]byte, 100), far) }()
		ac.Close()
		if err := <-done; !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("got %v, want io.ErrClosedPipe", err)
		}
	})
	t.Run("write after local close", func(t *testing.T) {
		a, _, _, _ := linkPair(t, 64)
		done := make(chan error, 1)
		go func() { done <- a.write(context.Background(), make([]byte, 100), far) }()
		a.close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("got %v, want net.ErrClosed", err)
		}
	})
}

// TestOpenShmRefusesOtherSizes: ranks configured with different ring sizes
// fall back to sockets instead of misreading the file.
func TestOpenShmRefusesOtherSizes(t *testing.T) {
	l, path := createShm(4096)
	if l == nil {
		t.Fatal("createShm failed")
	}
	defer l.unmap()
	defer os.Remove(path)
	if m := openShm(path, 8192); m != nil {
		m.unmap()
		t.Error("openShm accepted a file of another ring size")
	}
	if m := openShm(filepath.Join(t.TempDir(), "missing"), 4096); m != nil {
		t.Error("openShm accepted a missing file")
	}
}
