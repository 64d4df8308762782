package tcp_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gotron/gotron/comm/tcp"
)

// TestStoppedPeerHeartbeat stops (SIGSTOP) one worker of three whose
// collective timeout is 10 minutes: the others must find it through its
// missing heartbeats, within about the 1 s heartbeat timeout, naming its
// rank and pid. Rank 0 serves the store, so its stop is noticed by the
// store not answering. Before heartbeats the survivors waited for the
// collective timeout (issue 31, finding 3).
func TestStoppedPeerHeartbeat(t *testing.T) {
	const n = 3
	for _, victim := range []int{1, 0} {
		t.Run(fmt.Sprintf("victim=%d", victim), func(t *testing.T) {
			procs := spawn(t, n, "loop", "TIMEOUT=10m", "HEARTBEAT=1s")
			for r, p := range procs {
				if l := <-p.lines; !strings.HasPrefix(l, "READY") {
					t.Fatalf("rank %d: %q, want READY", r, l)
				}
			}
			start := time.Now()
			procs[victim].cmd.Process.Signal(syscall.SIGSTOP)
			defer procs[victim].cmd.Process.Signal(syscall.SIGCONT)
			for r, p := range procs {
				if r == victim {
					continue
				}
				l := p.lastWithin(t, 30*time.Second)
				want := fmt.Sprintf("FAILED blamed=%d op=all_reduce lost=true timeout=false", victim)
				why := fmt.Sprintf("rank %d (host %s, pid %d): no heartbeat for 1s", victim, hostname(t), procs[victim].cmd.Process.Pid)
				if !strings.HasPrefix(l, want) || !strings.Contains(l, why) {
					t.Errorf("rank %d: %q, want prefix %q and %q", r, l, want, why)
				}
			}
			if d := time.Since(start); d > 8*time.Second {
				t.Errorf("survivors took %v to fail with a 1s heartbeat timeout", d)
			}
		})
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRendezvousFailsFast starts worlds with one bad rank: every rank,
// not only the one that finds the problem, must fail within seconds (the
// join timeout is a minute) with a message naming it. Before these checks
// the others waited for their join timeout (issue 31, finding 4).
func TestRendezvousFailsFast(t *testing.T) {
	type rank struct {
		rank, size int
		flags      string
	}
	for _, c := range []struct {
		name  string
		ranks []rank
		want  string
	}{
		{"world size", []rank{{0, 3, ""}, {1, 3, ""}, {2, 4, ""}}, "world sizes differ: rank 2 (host %s, pid %d) has world size 4, rank 0 (host %[1]s, pid %[2]d) has 3"},
		{"second rank 1", []rank{{0, 3, ""}, {1, 3, ""}, {1, 3, ""}}, "rank id 1 was claimed twice"},
		{"second rank 0", []rank{{0, 3, ""}, {0, 3, ""}, {1, 3, ""}}, "rank id 0 was claimed twice|could not serve the rendezvous store"},
		{"rank id too big", []rank{{0, 2, ""}, {2, 2, ""}}, "was started with rank id 2 and world size 2: rank ids run from 0 to 1"},
		{"flags", []rank{{0, 2, "a1"}, {1, 2, "b2"}}, `flags differ: rank 1 (host %s, pid %d) has flags hash "b2", rank 0 (host %[1]s, pid %[2]d) has "a1"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := c.want
			if strings.Contains(want, "%") {
				want = fmt.Sprintf(want, hostname(t), os.Getpid())
			}
			port := freePort(t)
			errs := make([]error, len(c.ranks))
			var wg sync.WaitGroup
			start := time.Now()
			for i, r := range c.ranks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// The ranks start together, in no set order: a rank
					// that comes before rank 0 serves the store waits for it.
					g, err := tcp.Join(t.Context(), tcp.Config{Rank: r.rank, WorldSize: r.size, MasterPort: port, FlagsHash: r.flags,
						Timeout: time.Minute, JoinTimeout: time.Minute})
					if err == nil {
						g.Close()
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("the ranks took %v to fail", d)
			}
			for i, err := range errs {
				if err == nil || !containsAny(err.Error(), strings.Split(want, "|")) {
					t.Errorf("rank %d (entry %d): %v\nwant an error containing %q", c.ranks[i].rank, i, err, want)
				}
			}
		})
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
