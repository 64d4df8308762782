package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLineBytes bounds how much of one line is buffered; a longer line is
// written in pieces of this size, each with its prefix.
const maxLineBytes = 64 << 10

// LockedWriter serialises writes to W; several PrefixWriters share one so
// that lines from different ranks never interleave.
type LockedWriter struct {
	mu sync.Mutex // protects W
	W  io.Writer
}

// Write writes p to W under the lock.
func (l *LockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.W.Write(p)
}

// PrefixWriter writes each complete line to Out with a prefix, such as
// "[rank3]: ", in one Write call. It buffers a partial line until its newline
// arrives or Flush is called. It is safe for concurrent use.
type PrefixWriter struct {
	mu     sync.Mutex // protects buf
	out    io.Writer
	prefix []byte
	buf    []byte
}

// NewPrefixWriter returns a PrefixWriter writing to out (usually a shared
// *LockedWriter).
func NewPrefixWriter(out io.Writer, prefix string) *PrefixWriter {
	return &PrefixWriter{out: out, prefix: []byte(prefix)}
}

// Write buffers p and writes every completed line. It always reports len(p)
// unless the underlying writer fails.
func (w *PrefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < maxLineBytes {
			break
		}
		n := i + 1
		if i < 0 || n > maxLineBytes {
			n = maxLineBytes
		}
		if err := w.emit(w.buf[:n]); err != nil {
			return len(p), err
		}
		w.buf = w.buf[n:]
	}
	if len(w.buf) == 0 {
		w.buf = nil
	}
	return len(p), nil
}

// Flush writes a pending partial line, ending it with a newline.
func (w *PrefixWriter) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	err := w.emit(w.buf)
	w.buf = nil
	return err
}

func (w *PrefixWriter) emit(line []byte) error {
	out := make([]byte, 0, len(w.prefix)+len(line)+1)
	out = append(append(out, w.prefix...), line...)
	if out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	_, err := w.out.Write(out)
	return err
}
