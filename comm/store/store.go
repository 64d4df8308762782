// Package store is a small TCP key-value store for rendezvous, with the
// contract of torch.distributed's TCPStore: rank 0 serves it at
// MASTER_ADDR:MASTER_PORT, every rank connects as a client, and they
// exchange addresses with Set, Get (which waits for the key), Add (an atomic
// counter), Wait and Barrier.
//
// Wire format (all integers big-endian): a request is op (1 byte), key
// length (u32), key, value length (u32), value; a reply is status (1 byte:
// 0 ok, 1 error) , value length (u32), value. Add's value is an int64.
//
// Heartbeats: a client that calls Heartbeat(id, timeout) promises to call it
// again within timeout. The server keeps the last time it heard from each id
// on its own clock (so clocks of other hosts do not matter); the first id
// silent for longer than its timeout is declared dead: the server sets
// DeadKey to "id timeout" and every later heartbeat reply carries it, so
// every live client learns within one heartbeat interval.
package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	opSet byte = iota + 1
	opGet
	opAdd
	opCheck
	opHeartbeat
)

// DeadKey is the key the server sets, to "<id> <timeout>", when it declares
// the first heartbeating client dead.
const DeadKey = "store/heartbeat/dead"

const maxField = 64 << 20 // largest key or value accepted

// Server serves a store on a TCP listener. It is safe for concurrent use.
type Server struct {
	ln net.Listener

	mu      sync.Mutex // protects the fields below
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every update
	conns   map[net.Conn]bool
	closed  bool
	done    chan struct{}
	wg      sync.WaitGroup
	beats   map[string]beat // last heartbeat by id
	dead    string          // DeadKey's value once an id was declared dead
	watch   bool            // the heartbeat monitor is running
}

// beat is what the server knows of one heartbeating id.
type beat struct {
	last    time.Time
	timeout time.Duration
}

// Listen starts a store server on addr ("host:port"; port 0 picks one).
func Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln, data: map[string][]byte{}, changed: make(chan struct{}), conns: map[net.Conn]bool{},
		done: make(chan struct{}), beats: map[string]beat{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and drops every client connection.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

func readField(r io.Reader, hdr []byte) ([]byte, error) {
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n > maxField {
		return nil, fmt.Errorf("field of %d bytes exceeds %d", n, maxField)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

func (s *Server) handle(c net.Conn) {
	var hdr [4]byte
	for {
		var op [1]byte
		if _, err := io.ReadFull(c, op[:]); err != nil {
			return
		}
		key, err := readField(c, hdr[:])
		if err != nil {
			return
		}
		val, err := readField(c, hdr[:])
		if err != nil {
			return
		}
		status, reply := s.apply(op[0], string(key), val, c)
		if status == 2 { // server closing or client gone
			return
		}
		msg := make([]byte, 5+len(reply))
		msg[0] = status
		binary.BigEndian.PutUint32(msg[1:5], uint32(len(reply)))
		copy(msg[5:], reply)
		if _, err := c.Write(msg); err != nil {
			return
		}
	}
}

// apply runs one request; status 0 ok, 1 error (reply is the message), 2 abort.
func (s *Server) apply(op byte, key string, val []byte, c net.Conn) (byte, []byte) {
	switch op {
	case opSet:
		s.mu.Lock()
		s.data[key] = val
		s.notifyLocked()
		s.mu.Unlock()
		return 0, nil
	case opAdd:
		if len(val) != 8 {
			return 1, []byte("add: value must be 8 bytes")
		}
		s.mu.Lock()
		cur := int64(0)
		if old, ok := s.data[key]; ok {
			v, err := strconv.ParseInt(string(old), 10, 64)
			if err != nil {
				s.mu.Unlock()
				return 1, []byte(fmt.Sprintf("add: key %q holds %q, not an integer", key, old))
			}
			cur = v
		}
		cur += int64(binary.BigEndian.Uint64(val))
		s.data[key] = []byte(strconv.FormatInt(cur, 10))
		s.notifyLocked()
		s.mu.Unlock()
		var out [8]byte
		binary.BigEndian.PutUint64(out[:], uint64(cur))
		return 0, out[:]
	case opCheck:
		s.mu.Lock()
		_, ok := s.data[key]
		s.mu.Unlock()
		if ok {
			return 0, []byte{1}
		}
		return 0, []byte{0}
	case opHeartbeat:
		if len(val) != 8 {
			return 1, []byte("heartbeat: value must be 8 bytes")
		}
		timeout := time.Duration(binary.BigEndian.Uint64(val))
		s.mu.Lock()
		defer s.mu.Unlock()
		if timeout <= 0 {
			delete(s.beats, key) // the client leaves: silence is no longer death
		} else {
			s.beats[key] = beat{last: time.Now(), timeout: timeout}
			if !s.watch && !s.closed {
				s.watch = true
				s.wg.Add(1)
				go s.monitor()
			}
		}
		return 0, []byte(s.dead)
	case opGet:
		for {
			s.mu.Lock()
			v, ok := s.data[key]
			ch := s.changed
			s.mu.Unlock()
			if ok {
				return 0, v
			}
			select {
			case <-ch:
			case <-s.done:
				return 2, nil
			}
		}
	}
	return 1, []byte(fmt.Sprintf("unknown op %d", op))
}

// monitorTick is how often the server looks for silent heartbeaters.
const monitorTick = 100 * time.Millisecond

// monitor declares the first id whose heartbeat is overdue dead.
func (s *Server) monitor() {
	defer s.wg.Done()
	t := time.NewTicker(monitorTick)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			s.mu.Lock()
			if s.dead == "" {
				s.declareLocked(now)
			}
			done := s.dead != ""
			s.mu.Unlock()
			if done {
				return
			}
		}
	}
}

// declareLocked sets DeadKey for the most overdue silent id, if any.
func (s *Server) declareLocked(now time.Time) {
	var worst string
	var over time.Duration
	for id, b := range s.beats {
		if late := now.Sub(b.last) - b.timeout; late > 0 && (worst == "" || late > over) {
			worst, over = id, late
		}
	}
	if worst == "" {
		return
	}
	s.dead = worst + " " + s.beats[worst].timeout.String()
	s.data[DeadKey] = []byte(s.dead)
	s.notifyLocked()
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Client is a connection to a store. Its methods may be called from several
// goroutines; requests are serialised.
type Client struct {
	addr string

	mu     sync.Mutex // serialises requests on c; protects broken
	c      net.Conn
	broken error // set when a request failed midway
}

// Dial connects to the store at addr, retrying refused connections (the
// server may not be up yet) until ctx ends.
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	backoff := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return &Client{addr: addr, c: c}, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("store: connect to %s: %w (last error: %v)", addr, context.Cause(ctx), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("store: connect to %s: %w (last error: %v)", addr, context.Cause(ctx), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// LocalAddr is the client side of the connection (the address other hosts
// can reach this one on, as seen by the store).
func (c *Client) LocalAddr() net.Addr { return c.c.LocalAddr() }

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

func (c *Client) do(ctx context.Context, op byte, key string, val []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.c.SetDeadline(dl)
	} else {
		c.c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { c.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	msg := make([]byte, 9+len(key)+len(val))
	msg[0] = op
	binary.BigEndian.PutUint32(msg[1:], uint32(len(key)))
	copy(msg[5:], key)
	binary.BigEndian.PutUint32(msg[5+len(key):], uint32(len(val)))
	copy(msg[9+len(key):], val)
	if c.broken != nil {
		return nil, fmt.Errorf("store %s: key %q: connection unusable after an earlier error: %w", c.addr, key, c.broken)
	}
	wrap := func(err error) error {
		var ne net.Error
		_, hasDeadline := ctx.Deadline()
		switch {
		case ctx.Err() != nil:
			err = context.Cause(ctx)
		case hasDeadline && errors.As(err, &ne) && ne.Timeout():
			err = context.DeadlineExceeded
		}
		c.broken = err // a reply may still be in flight: the stream is out of step
		return fmt.Errorf("store %s: key %q: %w", c.addr, key, err)
	}
	if _, err := c.c.Write(msg); err != nil {
		return nil, wrap(err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c.c, st[:]); err != nil {
		return nil, wrap(err)
	}
	var hdr [4]byte
	reply, err := readField(c.c, hdr[:])
	if err != nil {
		return nil, wrap(err)
	}
	if st[0] != 0 {
		return nil, wrap(errors.New(string(reply)))
	}
	return reply, nil
}

// Set stores value under key, waking every Get waiting for it.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	_, err := c.do(ctx, opSet, key, value)
	return err
}

// Get returns key's value, waiting until some client sets it or ctx ends.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	return c.do(ctx, opGet, key, nil)
}

// Add adds delta to the integer stored (as decimal text) under key, which
// starts at 0, and returns the new value.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(delta))
	r, err := c.do(ctx, opAdd, key, b[:])
	if err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(r)), nil
}

// Check reports whether key is set, without waiting.
func (c *Client) Check(ctx context.Context, key string) (bool, error) {
	r, err := c.do(ctx, opCheck, key, nil)
	return err == nil && len(r) == 1 && r[0] == 1, err
}

// Heartbeat tells the server that id is alive and will call again within
// timeout (zero: id leaves and is no longer watched). It returns the id
// the server has declared dead and its timeout, or "" and 0 while none is.
func (c *Client) Heartbeat(ctx context.Context, id string, timeout time.Duration) (deadID string, deadAfter time.Duration, err error) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(max(timeout, 0)))
	r, err := c.do(ctx, opHeartbeat, id, b[:])
	if err != nil || len(r) == 0 {
		return "", 0, err
	}
	return ParseDead(string(r))
}

// ParseDead splits DeadKey's value into the dead id and its timeout.
func ParseDead(v string) (id string, timeout time.Duration, err error) {
	i := strings.LastIndexByte(v, ' ')
	if i < 0 {
		return "", 0, fmt.Errorf("store: dead-heartbeat record %q: want \"<id> <timeout>\"", v)
	}
	d, err := time.ParseDuration(v[i+1:])
	if err != nil {
		return "", 0, fmt.Errorf("store: dead-heartbeat record %q: %v", v, err)
	}
	return v[:i], d, nil
}

// Wait returns when every key is set, or ctx ends.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if _, err := c.Get(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

// Barrier returns when n clients have called Barrier with the same name:
// each adds 1 to the counter "name"; the n-th sets "name/done".
func (c *Client) Barrier(ctx context.Context, name string, n int) error {
	v, err := c.Add(ctx, name, 1)
	if err != nil {
		return err
	}
	if v == int64(n) {
		if err := c.Set(ctx, name+"/done", []byte{1}); err != nil {
			return err
		}
	}
	return c.Wait(ctx, name+"/done")
}
