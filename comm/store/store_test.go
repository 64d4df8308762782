package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm/store"
)

func TestStore(t *testing.T) {
	s, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	const n = 5
	clients := make([]*store.Client, n)
	for i := range clients {
		if clients[i], err = store.Dial(ctx, s.Addr()); err != nil {
			t.Fatal(err)
		}
		defer clients[i].Close()
	}
	// Get waits for a later Set by another client.
	got := make(chan []byte, 1)
	go func() {
		v, err := clients[1].Get(ctx, "addr/0")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	if err := clients[0].Set(ctx, "addr/0", []byte("10.0.0.1:1234")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "10.0.0.1:1234" {
		t.Errorf("get: %q", v)
	}
	if ok, err := clients[2].Check(ctx, "nope"); ok || err != nil {
		t.Errorf("check missing key: %v %v", ok, err)
	}
	// Add is atomic; Barrier releases all n together.
	var wg sync.WaitGroup
	sums := make([]int64, n)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := clients[i].Add(ctx, "count", int64(i+1))
			if err != nil {
				t.Error(err)
			}
			sums[i] = v
			if err := clients[i].Barrier(ctx, "b", n); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if v, err := clients[0].Add(ctx, "count", 0); v != 15 || err != nil {
		t.Errorf("count = %d, %v; want 15", v, err)
	}
	seen := map[int64]bool{}
	for _, v := range sums {
		seen[v] = true
	}
	if len(seen) != n {
		t.Errorf("adds returned duplicate totals %v", sums)
	}
	if err := clients[0].Set(ctx, "text", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := clients[0].Add(ctx, "text", 1); err == nil {
		t.Error("add to a non-integer key: no error")
	}
}

func TestGetTimesOut(t *testing.T) {
	s, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := store.Dial(t.Context(), s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want DeadlineExceeded", err)
	}
}

func TestDialRetriesUntilServerUp(t *testing.T) {
	s, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = store.Dial(ctx, addr)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial with no server: %v", err)
	}
}

// A client that stops heartbeating is declared dead after its timeout, by
// the server's clock; the others learn it from their next heartbeat and from
// DeadKey; a client that leaves (timeout 0) is never declared.
func TestHeartbeat(t *testing.T) {
	s, err := store.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	var cs [3]*store.Client
	for i := range cs {
		if cs[i], err = store.Dial(ctx, s.Addr()); err != nil {
			t.Fatal(err)
		}
		defer cs[i].Close()
	}
	const timeout = 300 * time.Millisecond
	for i, id := range []string{"0", "1", "2"} {
		if dead, _, err := cs[i].Heartbeat(ctx, id, timeout); err != nil || dead != "" {
			t.Fatalf("first heartbeat of %s: dead %q, %v", id, dead, err)
		}
	}
	if _, _, err := cs[2].Heartbeat(ctx, "2", 0); err != nil { // 2 leaves cleanly
		t.Fatal(err)
	}
	// 0 keeps beating; 1 falls silent.
	start := time.Now()
	var dead string
	var after time.Duration
	for dead == "" && time.Since(start) < 5*time.Second {
		time.Sleep(50 * time.Millisecond)
		if dead, after, err = cs[0].Heartbeat(ctx, "0", timeout); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); dead != "1" || after != timeout || took < timeout || took > timeout+time.Second {
		t.Fatalf("declared %q (timeout %v) after %v; want 1 (%v) after about %v", dead, after, took, timeout, timeout)
	}
	v, err := cs[2].Get(ctx, store.DeadKey)
	if err != nil || string(v) != "1 300ms" {
		t.Fatalf("%s = %q, %v", store.DeadKey, v, err)
	}
	if _, _, err := store.ParseDead("no-timeout"); err == nil {
		t.Error("ParseDead accepted a record without a timeout")
	}
}
