//go:build !linux

package tcp

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"time"
)

// shmLink is never made outside Linux: every pair uses its socket.
type shmLink struct {
	conn   *net.TCPConn
	closed atomic.Bool
	broken bool
}

var errNoShm = errors.New("shared memory is only supported on Linux")

func createShm(int) (*shmLink, string)                            { return nil, "" }
func openShm(string, int) *shmLink                                { return nil }
func (l *shmLink) unmap()                                         {}
func (l *shmLink) close()                                         { l.closed.Store(true) }
func (l *shmLink) Read([]byte) (int, error)                       { return 0, errNoShm }
func (l *shmLink) next(int) ([]byte, error)                       { return nil, errNoShm }
func (l *shmLink) release(int)                                    {}
func (l *shmLink) tryWrite([]byte) int                            { return 0 }
func (l *shmLink) write(context.Context, []byte, time.Time) error { return errNoShm }

func createShmFile(int) ([]byte, string)                   { return nil, "" }
func openShmFile(string, int) []byte                       { return nil }
func unmapShm([]byte)                                      {}
func futexSleep(addr *uint32, val uint32, d time.Duration) { time.Sleep(d) }
func futexWakeAll(*uint32)                                 {}

func osYield() { runtime.Gosched() }
