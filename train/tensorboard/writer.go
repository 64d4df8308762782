package tensorboard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ErrClosed is returned by a Writer's methods after Close.
var ErrClosed = errors.New("tensorboard: writer is closed")

// autoFlushBytes bounds the buffer: AddScalar writes the buffered records to
// the file once they reach this size.
const autoFlushBytes = 1 << 20

// Option is a rarely needed setting of New.
type Option func(*options)

type options struct {
	now      func() time.Time
	hostname string
}

// WithClock sets the clock giving each event's wall_time and the file name's
// Unix time; the default is time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithHostname sets the host name in the file name; the default is
// os.Hostname().
func WithHostname(name string) Option { return func(o *options) { o.hostname = name } }

// Writer appends scalar events to one event file in a directory, as
// torch.utils.tensorboard.SummaryWriter(log_dir=dir).add_scalar does.
//
// Writes are buffered: AddScalar encodes a whole record into memory; Flush
// writes every buffered record to the file with one write, after which
// TensorBoard can read them; Close flushes, syncs the file to disk and
// closes it. AddScalar also flushes by itself once 1 MiB is buffered.
// Records not yet flushed are lost if the process dies; a file cut short
// mid-record (by a crash during a write) loses only its last record, which
// TensorBoard skips. After a write error every method returns that error.
//
// A Writer is safe for concurrent use by multiple goroutines.
type Writer struct {
	path string
	now  func() time.Time

	mu     sync.Mutex // protects the fields below
	f      *os.File
	buf    []byte // encoded records not yet written
	err    error  // first write error, returned from then on
	closed bool
}

// New creates dir (and its parents) if needed and, in it, a new event file
// named events.out.tfevents.<unix time, 10 digits>.<hostname>.<pid> (with
// .1, .2, ... appended if that name is taken), and writes its file_version
// record.
func New(dir string, opts ...Option) (*Writer, error) {
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.hostname == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "localhost"
		}
		o.hostname = h
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tensorboard: create directory %s: %w", dir, err)
	}
	t := o.now()
	host := strings.NewReplacer("/", "_", string(filepath.Separator), "_").Replace(o.hostname)
	base := filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%010d.%s.%d", t.Unix(), host, os.Getpid()))
	w := &Writer{now: o.now}
	for i := 0; ; i++ {
		w.path = base
		if i > 0 {
			w.path = fmt.Sprintf("%s.%d", base, i)
		}
		f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			w.f = f
			break
		}
		if !errors.Is(err, fs.ErrExist) || i == 1000 {
			return nil, fmt.Errorf("tensorboard: create event file in %s: %w", dir, err)
		}
	}
	w.buf = appendRecord(w.buf, appendFileVersionEvent(nil, wallTime(t)))
	if err := w.Flush(); err != nil {
		w.f.Close()
		return nil, err
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

// AddScalar buffers one scalar event: value (stored as a float32
// simple_value, as TensorBoard does) under tag at step. Megatron's steps are
// iterations, or consumed samples for the " vs samples" tags.
func (w *Writer) AddScalar(tag string, value float64, step int64) error {
	if tag == "" {
		return fmt.Errorf("tensorboard: %s: empty tag", w.path)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	ev := appendScalarEvent(nil, wallTime(w.now()), step, tag, float32(value))
	w.buf = appendRecord(w.buf, ev)
	if len(w.buf) >= autoFlushBytes {
		return w.flushLocked()
	}
	return nil
}

// Flush writes the buffered records to the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	return w.flushLocked()
}

// Close flushes the buffered records, syncs the file to disk and closes it.
// Closing a closed Writer returns nil.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	err := w.err
	if err == nil {
		err = w.flushLocked()
	}
	if err == nil {
		if serr := w.f.Sync(); serr != nil {
			err = fmt.Errorf("tensorboard: sync %s: %w", w.path, serr)
		}
	}
	if cerr := w.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("tensorboard: close %s: %w", w.path, cerr)
	}
	return err
}

// usable reports why the Writer cannot take more work, if it cannot.
func (w *Writer) usable() error {
	if w.closed {
		return fmt.Errorf("%w: %s", ErrClosed, w.path)
	}
	return w.err
}

func (w *Writer) flushLocked() error {
	if len(w.buf) == 0 {
		return nil
	}
	if _, err := w.f.Write(w.buf); err != nil {
		w.err = fmt.Errorf("tensorboard: write %s: %w", w.path, err)
		return w.err
	}
	w.buf = w.buf[:0]
	return nil
}

// wallTime is t in seconds since the Unix epoch, as Python's time.time().
func wallTime(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}
