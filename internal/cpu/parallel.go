package cpu

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// threads is the number of goroutines kernels split work over. It is process
// state by nature (like GOMAXPROCS): read from GOTRON_NUM_THREADS at start-up,
// changed only through SetThreads.
var threads atomic.Int32

func init() {
	n := runtime.GOMAXPROCS(0)
	if s := os.Getenv("GOTRON_NUM_THREADS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			n = v
		}
	}
	threads.Store(int32(n))
}

// Threads returns the number of goroutines kernels use.
func Threads() int { return int(threads.Load()) }

// SetThreads sets the number of goroutines kernels use (n < 1 means 1) and
// returns the previous value.
func SetThreads(n int) int {
	if n < 1 {
		n = 1
	}
	return int(threads.Swap(int32(n)))
}

// Parallel splits [0, n) into at most Threads() contiguous chunks of at least
// grain items and calls fn on each, concurrently; it returns when all are
// done. Chunk c is [c·n/chunks, (c+1)·n/chunks). With one chunk it runs fn on
// the calling goroutine.
//
// The chunks run on the persistent workers the GEMM also uses and on the
// caller, which takes chunks like any worker: a call never waits for a worker
// that is busy elsewhere, so concurrent calls from many goroutines and calls
// nested inside fn cannot deadlock (the caller then simply runs more chunks
// itself). fn must not wait for another chunk of the same call. Parallel
// allocates nothing in steady state (a closure passed as fn is the caller's
// allocation; store a method value once to avoid it).
func Parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := min(Threads(), (n+grain-1)/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	j := parJobs.get()
	j.fn, j.n, j.chunks = fn, n, int64(chunks)
	j.next.Store(0)
	workers.run(j, chunks)
	j.fn = nil // do not pin the caller's closure
	parJobs.put(j)
}

// parJob is one Parallel call: chunks are handed out by a counter, so any
// goroutine that joins takes whatever chunks are left.
type parJob struct {
	cr     crew
	fn     func(lo, hi int)
	n      int
	chunks int64
	next   atomic.Int64
}

func (j *parJob) crew() *crew { return &j.cr }

// runPart runs chunks until none are left; every part does the same.
func (j *parJob) runPart(int) {
	for {
		c := j.next.Add(1) - 1
		if c >= j.chunks {
			return
		}
		n := int64(j.n)
		j.fn(int(c*n/j.chunks), int((c+1)*n/j.chunks))
	}
}

// parJobFree is a free list of Parallel jobs. Like jobFree it is process
// state by nature (a cache): entries are never dropped, so steady-state
// calls allocate nothing even across garbage collections (a sync.Pool is
// emptied by the collector).
type parJobFree struct {
	mu   sync.Mutex
	jobs []*parJob
}

var parJobs parJobFree

func (f *parJobFree) get() *parJob {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.jobs); n > 0 {
		j := f.jobs[n-1]
		f.jobs = f.jobs[:n-1]
		return j
	}
	return new(parJob)
}

func (f *parJobFree) put(j *parJob) {
	f.mu.Lock()
	f.jobs = append(f.jobs, j)
	f.mu.Unlock()
}

// poolJob is work cut into parts that pool workers can help with. Part 0
// runs on the caller and must be able to finish the whole job alone: a
// part handed to a worker may start late or never.
type poolJob interface {
	runPart(p int)
	crew() *crew
}

// crew tracks the workers taking part in one run of a job so the caller
// waits only for those that actually started. Its state word packs the run's
// generation (high 32 bits), a closed bit and the count of active workers.
// A task left in the queue from an earlier run carries an old generation and
// is dropped, so jobs can be recycled while stale tasks are still queued.
type crew struct {
	state atomic.Uint64
	done  chan struct{} // the last worker to leave a closed run sends here
}

const (
	crewClosed = 1 << 31
	crewActive = crewClosed - 1 // mask of the active count
)

// open starts a new run and returns its generation. The previous run, if
// any, must be closed.
func (c *crew) open() uint32 {
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	gen := uint32(c.state.Load()>>32) + 1
	c.state.Store(uint64(gen) << 32)
	return gen
}

// join admits a worker to run gen unless that run is closed or over.
func (c *crew) join(gen uint32) bool {
	for {
		s := c.state.Load()
		if uint32(s>>32) != gen || s&crewClosed != 0 {
			return false
		}
		if c.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// leave records that a worker admitted by join has finished.
func (c *crew) leave() {
	s := c.state.Add(^uint64(0))
	if s&crewClosed != 0 && s&crewActive == 0 {
		c.done <- struct{}{}
	}
}

// close admits no more workers and waits for the active ones to leave.
func (c *crew) close() {
	s := c.state.Add(crewClosed)
	if s&crewActive == 0 {
		return
	}
	spin(func() bool { return c.state.Load()&crewActive == 0 })
	<-c.done // sent by the last leaver, even if the spin saw it go
}

// A goroutine that waits for kernel work (a worker for its next task, a
// caller for its workers) busy-waits up to spinWait before it parks. Kernels
// come back to back — a decode step is ~50 matrix products with a little
// work between — and waking a parked thread costs tens of microseconds, far
// more in a virtual machine (the idle vCPU halts and is woken through the
// hypervisor): with a few microseconds of spinning, a single-stream decode
// step of GPT-2 124M spent a third of its time waking workers. While it
// spins, a waiter yields its processor every spinYield, so goroutines that
// are ready to run (HTTP handlers, the caller's own work) wait at most that
// long for one. OpenMP runtimes spin for far longer (GNU's default is ~300k
// polls, Intel's KMP_BLOCKTIME 200 ms).
const (
	spinWait  = 2 * time.Millisecond
	spinYield = 50 * time.Microsecond
)

// spin polls ready until it reports true or spinWait has passed, and
// reports which.
func spin(ready func() bool) bool {
	start := time.Now()
	yielded := start
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%64 != 0 {
			continue
		}
		now := time.Now()
		if now.Sub(start) > spinWait {
			return false
		}
		if now.Sub(yielded) > spinYield {
			runtime.Gosched()
			yielded = now
		}
	}
}

// poolTask asks a worker to run one part of one run of a job.
type poolTask struct {
	job  poolJob
	gen  uint32
	part int
}

// pool is the set of persistent worker goroutines that Parallel and the GEMM
// share (process state, like Threads): started on demand, parked on a task
// queue, never stopped. When the queue is full (many concurrent callers) a
// part is simply not handed out, and the caller runs it.
type pool struct {
	mu      sync.Mutex
	started atomic.Int32
	tasks   chan poolTask
}

var workers pool

// ensure starts workers until there are at least n.
func (p *pool) ensure(n int) {
	if int(p.started.Load()) >= n {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tasks == nil {
		p.tasks = make(chan poolTask, 64)
	}
	for int(p.started.Load()) < n {
		go poolWorker(p.tasks)
		p.started.Add(1)
	}
}

// poolWorker runs tasks forever, spinning a while before it parks.
func poolWorker(tasks <-chan poolTask) {
	for {
		var t poolTask
		got := spin(func() bool {
			select {
			case t = <-tasks:
				return true
			default:
				return false
			}
		})
		if !got {
			t = <-tasks
		}
		if c := t.job.crew(); c.join(t.gen) {
			t.job.runPart(t.part)
			c.leave()
		}
	}
}

// run runs parts [0, parts) of j: parts 1.. are offered to workers, part 0
// runs on the caller, then run waits for the workers that joined.
func (p *pool) run(j poolJob, parts int) {
	c := j.crew()
	gen := c.open()
	p.ensure(parts - 1)
offer:
	for part := 1; part < parts; part++ {
		select {
		case p.tasks <- poolTask{j, gen, part}:
		default:
			break offer
		}
	}
	j.runPart(0)
	c.close()
}
