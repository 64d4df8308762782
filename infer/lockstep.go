package infer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/gotron/gotron/comm"
)

// Tensor-parallel serving: every rank of a tensor-parallel group holds its
// shard of the model (gpt.Parallelize) and its own Engine over it, whose
// KV pool caches that rank's heads. The engines step together: the leader
// (rank 0) takes the requests and, before each step, broadcasts what it did
// to its engine since the last one (requests added, sequences cancelled);
// the followers (Follow) do the same to theirs and step too. An Engine is
// deterministic, so every rank schedules the same batch, and the logits it
// samples from are the same bytes on every rank (the model all-gathers the
// vocabulary-parallel logits), so every rank draws the same tokens. Each
// step's message also carries a digest of the leader's previous events,
// which a follower checks against its own: ranks that drifted apart stop
// with an error instead of computing nonsense. The followers never see a
// request's source: the leader's broadcast is the only input, so ranks
// cannot run different prompts.

// Message kinds of the leader's header.
const (
	msgHello int64 = iota // the leader's engine configuration
	msgStep               // ops to apply, then one step
	msgClose              // the leader is done: Follow returns
	msgIdle               // the leader is alive with nothing to run
)

// lockstepOp is one call the leader made on its engine: an Add or a Cancel.
type lockstepOp struct {
	Add    *Request
	Cancel SeqID
}

// Lockstep is the leader's side: an Engine whose Add, Cancel and Step are
// mirrored on the other ranks of group (each running Follow). Its
// collectives run under the context given to NewLockstep. Not safe for
// concurrent use; after a failed Step every call returns that error.
type Lockstep struct {
	eng    *Engine
	pg     comm.ProcessGroup
	ctx    context.Context
	ops    []lockstepOp
	digest uint64 // of the last step's events
	err    error  // sticky: the ranks are no longer in step
	closed bool
}

// NewLockstep makes e, on rank 0 of pg, the leader of pg's engines: it
// checks that every rank's engine has the same configuration (a rank whose
// differs is named in the error), runs the engines' warm-up step together
// (NewEngine leaves it to here for a sharded model: it communicates) and
// returns the leader's handle. ctx governs every collective of the
// Lockstep.
func NewLockstep(ctx context.Context, e *Engine, pg comm.ProcessGroup) (*Lockstep, error) {
	if pg.Rank() != 0 {
		return nil, fmt.Errorf("infer: lockstep leader on rank %d: the leader is rank 0 (the others Follow)", pg.Rank())
	}
	l := &Lockstep{eng: e, pg: pg, ctx: ctx}
	if err := l.send(msgHello, []byte(e.fingerprint())); err != nil {
		return nil, err
	}
	if err := agree(ctx, pg, true); err != nil {
		return nil, err
	}
	if err := e.warmUp(); err != nil {
		return nil, fmt.Errorf("infer: %s warm-up step: %w", e.parallelism(), err)
	}
	return l, nil
}

// Engine returns the leader's engine (for Config, MaxTokens, Validate and
// Stats; Add, Cancel and Step go through the Lockstep).
func (l *Lockstep) Engine() *Engine { return l.eng }

// Add is Engine.Add, sent to the followers with the next step.
func (l *Lockstep) Add(r Request) (SeqID, error) {
	if l.err != nil {
		return 0, l.err
	}
	id, err := l.eng.Add(r)
	if err != nil {
		return 0, err
	}
	r.Prompt = append([]int32(nil), r.Prompt...) // the caller may reuse it before the step
	l.ops = append(l.ops, lockstepOp{Add: &r})
	return id, nil
}

// Cancel is Engine.Cancel, sent to the followers with the next step.
func (l *Lockstep) Cancel(id SeqID) bool {
	ok := l.eng.Cancel(id)
	if ok && l.err == nil {
		l.ops = append(l.ops, lockstepOp{Cancel: id})
	}
	return ok
}

// HasWork is Engine.HasWork.
func (l *Lockstep) HasWork() bool { return l.eng.HasWork() }

// Stats is Engine.Stats.
func (l *Lockstep) Stats() Stats { return l.eng.Stats() }

// Step sends the calls since the last step to the followers and runs the
// step on every rank: Engine.Step's events, the same on every rank. An
// error (a rank lost, a failed collective) ends the lockstep: the group's
// engines can no longer be trusted to agree.
func (l *Lockstep) Step() ([]Event, error) {
	if l.err != nil {
		return nil, l.err
	}
	if l.closed {
		return nil, errors.New("infer: lockstep step after Close")
	}
	var buf bytes.Buffer
	if len(l.ops) > 0 {
		if err := gob.NewEncoder(&buf).Encode(l.ops); err != nil {
			l.err = fmt.Errorf("infer: lockstep: encode the step's requests: %w", err)
			return nil, l.err
		}
	}
	l.ops = l.ops[:0]
	if err := l.send(msgStep, buf.Bytes()); err != nil {
		l.err = err
		return nil, err
	}
	evs, err := l.eng.Step()
	if err != nil {
		l.err = fmt.Errorf("infer: %s step: %w", l.eng.parallelism(), err)
		return evs, l.err
	}
	l.digest = eventsDigest(evs)
	return evs, nil
}

// KeepAlive tells the followers that the idle leader is alive, so that
// their wait for its next step does not time out (NewLockstepRunner sends
// one every LockstepKeepAlive while idle). Calls since the last step are
// held for the next.
func (l *Lockstep) KeepAlive() error {
	if l.err != nil {
		return l.err
	}
	if l.closed {
		return errors.New("infer: lockstep keep-alive after Close")
	}
	if err := l.send(msgIdle, nil); err != nil {
		l.err = err
		return err
	}
	return nil
}

// Close tells the followers that the leader is done (Follow returns nil).
// After a failed step it sends nothing: the followers end with the
// failure of their own step or find the leader gone.
func (l *Lockstep) Close() error {
	if l.closed || l.err != nil {
		return l.err
	}
	l.closed = true
	return l.send(msgClose, nil)
}

// send broadcasts the header (kind, payload bytes, digest of the last
// step's events) and, when there is one, the payload.
func (l *Lockstep) send(kind int64, payload []byte) error {
	hdr := []int64{kind, int64(len(payload)), int64(l.digest)}
	if err := l.pg.Broadcast(l.ctx, comm.Int64s(hdr), 0); err != nil {
		return fmt.Errorf("infer: %s leader: broadcast to the group: %w", l.eng.parallelism(), err)
	}
	if len(payload) == 0 {
		return nil
	}
	words := packWords(payload)
	if err := l.pg.Broadcast(l.ctx, comm.Int32s(words), 0); err != nil {
		return fmt.Errorf("infer: %s leader: broadcast to the group: %w", l.eng.parallelism(), err)
	}
	return nil
}

// maxLockstepPayload bounds a message's payload a follower accepts (a
// header is checked before its length is used).
const maxLockstepPayload = 1 << 30

// Follow runs e, on a rank of pg other than 0, as the leader's Lockstep
// says: it applies the leader's calls and steps until the leader closes
// (nil), ctx ends, or the ranks fail or drift apart (an error naming the
// rank and what happened). Call it for each of the leader's Lockstep.
func Follow(ctx context.Context, e *Engine, pg comm.ProcessGroup) error {
	me, what := pg.Rank(), e.parallelism()
	if me == 0 {
		return errors.New("infer: Follow on rank 0: rank 0 leads (NewLockstep)")
	}
	var digest uint64
	for step := int64(0); ; {
		kind, payload, leaderDigest, err := receive(ctx, pg)
		if err != nil {
			return fmt.Errorf("infer: %s rank %d: %w", what, me, err)
		}
		if kind != msgHello && step > 0 && leaderDigest != digest {
			return fmt.Errorf("infer: %s rank %d: step %d drew other tokens than rank 0 (the ranks' engines diverged)", what, me, step)
		}
		switch kind {
		case msgHello:
			mine := e.fingerprint()
			same := mine == string(payload)
			err := agree(ctx, pg, same)
			if !same {
				return fmt.Errorf("infer: %s rank %d: engine %s, rank 0's %s (give every rank the same arguments)", what, me, mine, payload)
			}
			if err != nil {
				return fmt.Errorf("infer: %s rank %d: %w", what, me, err)
			}
			if err := e.warmUp(); err != nil {
				return fmt.Errorf("infer: %s rank %d: warm-up step: %w", what, me, err)
			}
		case msgClose:
			return nil
		case msgIdle:
		case msgStep:
			var ops []lockstepOp
			if len(payload) > 0 {
				if err := gob.NewDecoder(bytes.NewReader(payload)).Decode(&ops); err != nil {
					return fmt.Errorf("infer: %s rank %d: decode rank 0's requests: %w", what, me, err)
				}
			}
			for _, op := range ops {
				if op.Add == nil {
					e.Cancel(op.Cancel)
					continue
				}
				if _, err := e.Add(*op.Add); err != nil {
					return fmt.Errorf("infer: %s rank %d: a request rank 0 accepted: %w", what, me, err)
				}
			}
			evs, err := e.Step()
			if err != nil {
				return fmt.Errorf("infer: %s rank %d: step %d: %w", what, me, step, err)
			}
			digest = eventsDigest(evs)
			step++
		default:
			return fmt.Errorf("infer: %s rank %d: message kind %d from rank 0: want %d..%d", what, me, kind, msgHello, msgIdle)
		}
	}
}

// receive takes the leader's next header and payload.
func receive(ctx context.Context, pg comm.ProcessGroup) (kind int64, payload []byte, digest uint64, err error) {
	hdr := make([]int64, 3)
	if err := pg.Broadcast(ctx, comm.Int64s(hdr), 0); err != nil {
		return 0, nil, 0, fmt.Errorf("receive from rank 0: %w", err)
	}
	n := hdr[1]
	if n < 0 || n > maxLockstepPayload {
		return 0, nil, 0, fmt.Errorf("message of %d bytes from rank 0: want 0..%d", n, maxLockstepPayload)
	}
	if n == 0 {
		return hdr[0], nil, uint64(hdr[2]), nil
	}
	words := make([]int32, (n+3)/4)
	if err := pg.Broadcast(ctx, comm.Int32s(words), 0); err != nil {
		return 0, nil, 0, fmt.Errorf("receive from rank 0: %w", err)
	}
	return hdr[0], unpackWords(words, int(n)), uint64(hdr[2]), nil
}

// agree all-reduces whether each rank's engine matches the leader's: the
// leader learns which rank refused (the lowest), the others that some did.
func agree(ctx context.Context, pg comm.ProcessGroup, same bool) error {
	flag := []int64{math.MaxInt64}
	if !same {
		flag[0] = int64(pg.Rank())
	}
	if err := pg.AllReduce(ctx, comm.Int64s(flag), comm.Min); err != nil {
		return fmt.Errorf("compare the ranks' engines: %w", err)
	}
	if r := flag[0]; r != math.MaxInt64 {
		return fmt.Errorf("rank %d's engine configuration or model differs from rank 0's (give every rank the same arguments)", r)
	}
	return nil
}

// fingerprint describes what must be equal on every rank for the engines
// to step alike: the configuration (not the Decoder) and the model's shape.
func (e *Engine) fingerprint() string {
	c := e.cfg
	mc := &e.m.Config
	stages := 1
	if e.pipe != nil {
		stages = e.pipe.Group.Size()
	}
	// The pool's blocks, which the scheduler counts, must agree too. A
	// pipeline stage sizes its pool by its own layers (a default budget
	// is its own), and the stages take the fewest blocks of any
	// (agreeBlocks): its bytes are not compared.
	kv := fmt.Sprintf("%d bytes", c.KVCacheBytes)
	if e.pipe != nil {
		kv = "stage's own"
	}
	return fmt.Sprintf("{kv %s (%d blocks), %d-token blocks, %d tokens/step, %d seqs, prefix caching %t, vocab %d, weights %v, bf16 %t, tokenizer %t; model %d layers (%d stages), hidden %d, %d heads, %d groups (%d here), vocab %d, %d positions}",
		kv, e.pool.numBlocks, c.BlockTokens, c.MaxNumBatchedTokens, c.MaxNumSeqs, !c.DisablePrefixCaching, c.VocabSize, c.Weights, c.BF16, c.Decoder != nil,
		mc.NumLayers, stages, mc.HiddenSize, mc.NumAttentionHeads, mc.NumQueryGroups, e.m.QueryGroupsHere(), mc.VocabSize, mc.MaxPositionEmbeddings)
}

// parallelism names how the engines' model is split, for errors.
func (e *Engine) parallelism() string {
	switch {
	case e.pipe == nil:
		return "tensor-parallel"
	case e.m.Sharding != nil:
		return "tensor- and pipeline-parallel"
	}
	return "pipeline-parallel"
}

// eventsDigest hashes what every rank must agree on in a step's events.
func eventsDigest(evs []Event) uint64 {
	h := fnv.New64a()
	var b [8 * 3]byte
	for _, ev := range evs {
		put := func(i int, v int64) {
			for j := range 8 {
				b[8*i+j] = byte(uint64(v) >> (8 * j))
			}
		}
		put(0, int64(ev.Seq))
		put(1, int64(ev.Token))
		put(2, int64(len(ev.Finish)))
		h.Write(b[:])
	}
	return h.Sum64()
}

// packWords carries bytes in int32 words, the smallest element the
// collectives move (little-endian, the tail zero-padded).
func packWords(b []byte) []int32 {
	padded := make([]byte, (len(b)+3)/4*4)
	copy(padded, b)
	w := make([]int32, len(padded)/4)
	for i := range w {
		w[i] = int32(binary.LittleEndian.Uint32(padded[4*i:]))
	}
	return w
}

// unpackWords is packWords' inverse for n bytes.
func unpackWords(w []int32, n int) []byte {
	b := make([]byte, 4*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b[:n]
}
