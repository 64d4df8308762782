package tcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/store"
)

// Rendezvous checks. Every rank claims its rank id (an atomic counter per
// id: a second claimant sees 2), publishes a record of itself and compares
// it with rank 0's. Whoever finds a problem writes it under joinErrorKey;
// every rank watches that key while it joins and stops with the message, so
// a bad rank costs seconds instead of every other rank's join timeout.
const (
	joinErrorKey = "gotron/join-error"
	claimPrefix  = "gotron/claim/"
	recordPrefix = "gotron/rank/"
)

// reportWait bounds how long a rank that cannot join waits to tell the
// others why (the store may not be up yet, or not be gotron's).
const reportWait = 10 * time.Second

// foreignWait bounds how long a rank 0 that could not listen on the store's
// port talks to whatever holds it, which may not be a gotron store.
const foreignWait = 2 * time.Second

// rankRecord is what a rank tells the others about itself at the rendezvous.
type rankRecord struct {
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
	FlagsHash string `json:"flags_hash,omitempty"`
	Host      string `json:"host"`
	PID       int    `json:"pid"`
}

func thisRank(cfg Config) rankRecord {
	host, err := os.Hostname()
	if err != nil {
		host = "?"
	}
	return rankRecord{Rank: cfg.Rank, WorldSize: cfg.WorldSize, FlagsHash: cfg.FlagsHash, Host: host, PID: os.Getpid()}
}

// String names the rank for error messages: "rank 3 (host h, pid 42)".
func (r rankRecord) String() string {
	return fmt.Sprintf("rank %d (host %s, pid %d)", r.Rank, r.Host, r.PID)
}

func getRecord(ctx context.Context, st *store.Client, rank int) (rankRecord, error) {
	v, err := st.Get(ctx, recordPrefix+strconv.Itoa(rank))
	if err != nil {
		return rankRecord{}, err
	}
	var r rankRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return rankRecord{}, fmt.Errorf("record of rank %d %q: %v", rank, v, err)
	}
	return r, nil
}

// post tells every rank of the job about a problem that stops the
// rendezvous, and returns it as this rank's error.
func post(ctx context.Context, st *store.Client, msg string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportWait)
	defer cancel()
	if ok, _ := st.Check(ctx, joinErrorKey); !ok { // the first report stands
		st.Set(ctx, joinErrorKey, []byte(msg))
	}
	return postedError(msg)
}

// postedError is a problem this rank found and posted for every rank.
type postedError string

func (e postedError) Error() string { return string(e) }

// checkIn claims this rank's id, publishes its record and compares it with
// rank 0's. listenErr is rank 0's failure to serve the store, if any.
func (w *world) checkIn(ctx context.Context, st *store.Client, master string, listenErr error) error {
	me := w.me
	n, err := st.Add(ctx, claimPrefix+strconv.Itoa(w.rank), 1)
	if err != nil {
		if listenErr != nil {
			return listenErr // what holds the port is no gotron store
		}
		return err
	}
	if n > 1 {
		first := "another process"
		rctx, cancel := context.WithTimeout(ctx, reportWait)
		if r, err := getRecord(rctx, st, w.rank); err == nil {
			first = fmt.Sprintf("host %s, pid %d", r.Host, r.PID)
		}
		cancel()
		return post(ctx, st, fmt.Sprintf("rank id %d was claimed twice: by %s and by host %s, pid %d; every rank needs its own id below the world size %d",
			w.rank, first, me.Host, me.PID, w.size))
	}
	rec, err := json.Marshal(me)
	if err != nil {
		return err
	}
	if err := st.Set(ctx, recordPrefix+strconv.Itoa(w.rank), rec); err != nil {
		if listenErr != nil {
			return listenErr
		}
		return err
	}
	if listenErr != nil {
		return post(ctx, st, fmt.Sprintf("%v could not serve the rendezvous store at %s: %v (is another rank 0 running?)", me, master, listenErr))
	}
	if w.rank == 0 {
		return nil
	}
	r0, err := getRecord(ctx, st, 0)
	if err != nil {
		return err
	}
	switch {
	case r0.WorldSize != me.WorldSize:
		return post(ctx, st, fmt.Sprintf("world sizes differ: %v has world size %d, %v has %d; start every rank with the same WORLD_SIZE",
			me, me.WorldSize, r0, r0.WorldSize))
	case r0.FlagsHash != me.FlagsHash:
		return post(ctx, st, fmt.Sprintf("flags differ: %v has flags hash %q, %v has %q; start every rank with the same flags",
			me, me.FlagsHash, r0, r0.FlagsHash))
	}
	return nil
}

// reportBadRank tells a job whose rank id cfg.Rank is outside the world
// (why says so) about it, so that its other ranks stop waiting for a
// complete world. It gives up after reportWait.
func reportBadRank(ctx context.Context, cfg Config, why error) error {
	me := thisRank(cfg)
	msg := fmt.Sprintf("%v was started with rank id %d and world size %d: rank ids run from 0 to %d (%v)",
		me, cfg.Rank, cfg.WorldSize, cfg.WorldSize-1, why)
	ctx, cancel := context.WithTimeout(ctx, reportWait)
	defer cancel()
	st, err := store.Dial(ctx, net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort)))
	if err != nil {
		return errors.New(msg)
	}
	defer st.Close()
	post(ctx, st, msg)
	st.Add(ctx, seenKey, 1)
	return errors.New(msg)
}

// seenKey counts the ranks that learned of a failed rendezvous.
const seenKey = "gotron/join-error-seen"

// lingerWait bounds how long rank 0 keeps serving the store after a failed
// rendezvous, for ranks that have not yet heard why.
const lingerWait = 5 * time.Second

// acknowledgeJoinError counts this rank among those that know why the
// rendezvous failed. Rank 0, whose exit takes the store away, keeps
// serving it until every rank knows or lingerWait passes: a rank that
// connects late still learns the reason instead of waiting for its join
// timeout on a refused connection. It returns the posted problem ("" when
// none was posted or the store cannot be reached).
func (w *world) acknowledgeJoinError(master string) (posted string) {
	ctx, cancel := context.WithTimeout(context.Background(), lingerWait)
	defer cancel()
	st, err := store.Dial(ctx, master) // ours may be out of step after an aborted request
	if err != nil {
		return ""
	}
	defer st.Close()
	cctx, ccancel := context.WithTimeout(ctx, foreignWait) // a store answers at once
	ok, _ := st.Check(cctx, joinErrorKey)
	var v []byte
	if ok {
		v, _ = st.Get(cctx, joinErrorKey)
	}
	ccancel()
	if !ok {
		return "" // not a problem every rank shares (a timeout, a network error), or no gotron store
	}
	posted = string(v)
	n, err := st.Add(ctx, seenKey, 1)
	for err == nil && n < int64(w.size) && w.srv != nil {
		select {
		case <-ctx.Done():
			return posted
		case <-time.After(50 * time.Millisecond):
		}
		n, err = st.Add(ctx, seenKey, 0)
	}
	return posted
}

// errNoHeartbeat marks a failure found by missed heartbeats.
var errNoHeartbeat = errors.New("no heartbeat")

// who names world rank r with its host and pid when known.
func (w *world) who(r int) string {
	if r >= 0 && r < len(w.peers) {
		return w.peers[r].String()
	}
	return fmt.Sprintf("rank %d", r)
}

// startHeartbeat starts telling rank 0's store that this rank is alive.
func (w *world) startHeartbeat() {
	if w.size == 1 || w.cfg.HeartbeatTimeout <= 0 {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	w.hbStop, w.hbDone = stop, make(chan struct{})
	go w.heartbeat(ctx)
}

// stopHeartbeat ends the heartbeats and tells the store this rank leaves,
// so that its silence from now on is not taken for a death.
func (w *world) stopHeartbeat() {
	if w.hbStop == nil {
		return
	}
	w.hbStop()
	<-w.hbDone
	w.hbStop = nil
	ctx, cancel := context.WithTimeout(context.Background(), abortWait)
	defer cancel()
	w.st.Heartbeat(ctx, strconv.Itoa(w.rank), 0)
}

// heartbeat runs until ctx ends, the store declares a rank dead, rank 0's
// store stops answering (rank 0 is frozen) or goes away (rank 0 exited;
// its peers see that on their own connections).
func (w *world) heartbeat(ctx context.Context) {
	defer close(w.hbDone)
	id := strconv.Itoa(w.rank)
	timeout := w.cfg.HeartbeatTimeout
	tick := time.NewTicker(w.cfg.HeartbeatInterval)
	defer tick.Stop()
	lastOK := time.Now()
	for {
		bctx, cancel := context.WithDeadline(ctx, lastOK.Add(timeout))
		dead, after, err := w.st.Heartbeat(bctx, id, timeout)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && dead != "":
			w.declareDead(dead, after)
			return
		case err == nil:
			lastOK = time.Now()
		case errors.Is(err, context.DeadlineExceeded):
			w.declareDead("0", timeout)
			return
		default:
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// declareDead fails the world blaming the rank whose heartbeat the store
// (or, for rank 0, this rank) missed for after, and closes the connection to
// it, so that a send blocked on its full socket ends now.
func (w *world) declareDead(id string, after time.Duration) {
	rank, err := strconv.Atoi(id)
	if err != nil || rank < 0 || rank >= w.size {
		w.fail(w.rank, fmt.Errorf("%w: the store declared %q dead, which is no rank of this world", comm.ErrPeerLost, id), true)
		return
	}
	w.fail(rank, fmt.Errorf("%w: %s: %w for %v", comm.ErrPeerLost, w.who(rank), errNoHeartbeat, after), true)
	if pc := w.conns[rank]; pc != nil {
		pc.closeConn()
	}
}
