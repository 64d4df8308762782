package train

import (
	"cmp"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Which rank writes which part of which tensor, and which parts a rank
// reads back, in the sharded checkpoint format (package ckpt, format 2).
//
// Every logical tensor is a whole parameter, or one optimizer buffer of one
// ("exp_avg/<param>"), of the parameter's whole (TP=1) shape. A rank holds a
// tensor-parallel slice of it: a block of rows (column-parallel layers and
// the vocabulary-parallel embedding and output layer), two (SwiGLU's fc1,
// [gate_r; up_r]), a block of columns (row-parallel layers), or all of it
// (replicated: norms, row-parallel biases, position embeddings). With the
// distributed optimizer a data-parallel rank holds a flat range of that
// slice's optimizer buffers. A rank writes what it holds, except that a
// replicated copy is written once: by tensor-parallel rank 0, and, across
// data-parallel replicas, by the one rank the tensor is dealt to (largest
// first, to the least loaded), so that every rank of a data-parallel group
// writes about as much. The tied embedding's copy on the last pipeline
// stage is not written: the first stage's is the tensor.

// localBlock is one block of a parameter's whole tensor that this rank
// holds, starting at element start of its local tensor.
type localBlock struct {
	start int
	ckpt.Block
}

// paramBlocks returns the whole shape of parameter name, whose local slice
// has shape, and the blocks of it the local slice holds.
func (ck *checkpointer) paramBlocks(name string, shape []int) ([]int, []localBlock) {
	return sliceBlocks(ck.stepper.plan(name), shape, ck.stepper.region.Rank(), ck.stepper.region.Size())
}

// sliceBlocks returns the whole shape of a tensor whose tensor-parallel
// slice of the given style, on rank of size ranks, has shape, and the
// blocks of it the slice holds.
func sliceBlocks(style tp.Style, shape []int, rank, size int) ([]int, []localBlock) {
	full := slices.Clone(shape)
	switch style {
	case tp.Column, tp.ColumnGLU:
		full[0] *= size
	case tp.Row:
		full[len(full)-1] *= size
	}
	if size == 1 || style == tp.Replicated { // whole on this rank: one block
		return full, []localBlock{{0, ckpt.Whole(full)}}
	}
	b := ckpt.Whole(shape)
	switch style {
	case tp.Column:
		b.Offset[0] = rank * shape[0]
	case tp.Row:
		b.Offset[len(shape)-1] = rank * shape[len(shape)-1]
	case tp.ColumnGLU:
		k := shape[0] / 2 // rows of each half on this rank
		half := slices.Clone(shape)
		half[0] = k
		gate, up := ckpt.Whole(half), ckpt.Whole(half)
		gate.Offset[0], up.Offset[0] = rank*k, full[0]/2+rank*k
		return full, []localBlock{{0, gate}, {numel(half), up}}
	}
	return full, []localBlock{{0, b}}
}

// restrict cuts blocks to the local elements [lo, hi); the returned blocks'
// start is relative to lo.
func restrict(blocks []localBlock, lo, hi int) []localBlock {
	var out []localBlock
	for _, lb := range blocks {
		n := lb.Len()
		a, b := max(lo, lb.start), min(hi, lb.start+n)
		if a >= b {
			continue
		}
		c := lb
		c.Lo, c.Hi = a-lb.start, b-lb.start
		c.start = a - lo
		out = append(out, c)
	}
	return out
}

// optimizerKey splits an optimizer buffer key, "<kind>/<param>" or, over
// the distributed optimizer's pieces, "<kind>/<param>[lo:hi]".
func optimizerKey(key string) (kind, param string, lo, hi int, sharded bool, err error) {
	kind, param, ok := strings.Cut(key, "/")
	if !ok {
		return "", "", 0, 0, false, fmt.Errorf("train: optimizer buffer %q has no kind prefix", key)
	}
	if i := strings.LastIndexByte(param, '['); i > 0 && strings.HasSuffix(param, "]") {
		a, b, ok := strings.Cut(param[i+1:len(param)-1], ":")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || lo < 0 || hi < lo {
			return "", "", 0, 0, false, fmt.Errorf("train: optimizer buffer %q: bad element range", key)
		}
		return kind, param[:i], lo, hi, true, nil
	}
	return kind, param, 0, -1, false, nil
}

// dpWriters deals the tensors replicated across this rank's data (×
// context) parallel group to its ranks, largest first to the least loaded:
// every rank of the group computes the same table, as they hold the same
// parameters.
func (ck *checkpointer) dpWriters(params []*tensor.Tensor, withOptim int) map[string]int {
	dp := ck.par.DPCP.Size()
	owner := map[string]int{}
	if dp == 1 {
		for _, p := range params {
			owner[p.Name] = 0
		}
		return owner
	}
	ps := slices.Clone(params)
	slices.SortFunc(ps, func(a, b *tensor.Tensor) int {
		return cmp.Or(cmp.Compare(b.Numel(), a.Numel()), cmp.Compare(a.Name, b.Name))
	})
	load := make([]int64, dp)
	for _, p := range ps {
		r := 0
		for i := range load {
			if load[i] < load[r] {
				r = i
			}
		}
		owner[p.Name] = r
		// A replicated optimizer state goes with its parameter.
		load[r] += int64(p.Numel()) * int64(1+withOptim)
	}
	return owner
}

// checkpointPieces returns the pieces of the model and optimizer state st
// (this rank's, as the optimizer keeps it) that this rank writes; their
// data alias the live tensors (newSnapshot points them at a copy).
func (ck *checkpointer) checkpointPieces(st *optim.State) ([]ckpt.Piece, error) {
	owned := ck.stepper.model.Params()
	if ck.stepper.pipelined() {
		owned = ownedParams(ck.stepper.stages)
	}
	tpRank, dpRank := ck.stepper.region.Rank(), ck.par.DPCP.Rank()
	replicatedBuffers := 0 // per parameter, dealt with it
	if st != nil && !ck.cfg.DDP.DistributedOptimizer {
		replicatedBuffers = len(stateKinds(*st))
	}
	// The routed experts of an MoE model differ between expert-parallel
	// ranks: each is written by expert-data-parallel rank 0 (Megatron's
	// expert replica id); the rest are dealt over the data-parallel group.
	dense, experts := ck.stepper.splitExperts(owned)
	writer := ck.dpWriters(dense, replicatedBuffers)
	expert := map[string]bool{}
	for _, p := range experts {
		expert[p.Name] = true
	}
	writes := func(name string, dpSharded bool) bool {
		firstInstance := ck.par.InterDistOpt == nil || ck.par.InterDistOpt.Rank() == 0
		if expert[name] {
			if dpSharded {
				return firstInstance // the other instances hold the same shards
			}
			return ck.par.ExpertDP.Rank() == 0
		}
		if tpRank != 0 && ck.stepper.replicated(name) {
			return false
		}
		w, ok := writer[name]
		if dpSharded {
			return ok && firstInstance
		}
		return ok && w == dpRank
	}
	var out []ckpt.Piece
	add := func(group, name string, shape []int, blocks []localBlock, v []float32) {
		for _, b := range blocks {
			out = append(out, ckpt.Piece{Group: group, Name: name, GlobalShape: shape, Block: b.Block,
				Data: v[b.start : b.start+b.Len()]})
		}
	}
	shapes := map[string][]int{}
	for _, p := range owned {
		shapes[p.Name] = p.Shape()
		if writes(p.Name, false) {
			full, blocks := ck.paramBlocks(p.Name, p.Shape())
			add(ckpt.GroupModel, p.Name, full, blocks, hostValues(p))
		}
	}
	if dpRank == 0 && tpRank == 0 { // buffers (the expert bias): replicated everywhere
		for _, b := range ck.stepper.buffers() {
			full, blocks := ck.paramBlocks(b.Name, b.Shape())
			add(ckpt.GroupModel, b.Name, full, blocks, b.Float32s())
		}
		// The FP8 delayed recipe's histories and scales, by weight: the
		// amax reduction group (TP × DP × CP) holds the same, so one
		// copy per pipeline stage's layers.
		state := ck.stepper.fp8().DelayedState()
		if state == nil {
			state = ck.fp8Carried
		}
		for _, name := range slices.Sorted(maps.Keys(state)) {
			v := state[name]
			out = append(out, ckpt.Piece{Group: groupFP8, Name: name, GlobalShape: []int{len(v)}, Block: ckpt.Whole([]int{len(v)}), Data: v})
		}
	}
	if st == nil {
		return out, nil
	}
	for _, key := range st.BufferNames() {
		buf := st.Buffers[key]
		kind, name, lo, hi, sharded, err := optimizerKey(key)
		if err != nil {
			return nil, err
		}
		shape, ok := shapes[name]
		if !ok {
			if e := ck.stepper.embeddingCopy(); e != nil && e.Name == name {
				continue // the tied embedding's copy: the first stage writes its state
			}
			return nil, fmt.Errorf("train: optimizer buffer %s names no parameter of this rank", key)
		}
		if !sharded {
			hi = len(buf)
		}
		if hi-lo != len(buf) || hi > numel(shape) {
			return nil, fmt.Errorf("train: optimizer buffer %s has %d values for its range [%d, %d) of %v", key, len(buf), lo, hi, shape)
		}
		if !writes(name, sharded) {
			continue
		}
		full, blocks := ck.paramBlocks(name, shape)
		add(ckpt.GroupOptimizer, kind+"/"+name, full, restrict(blocks, lo, hi), buf)
	}
	return out, nil
}

// snapshot is an asynchronous save's copy of this rank's shards into the
// snapshot buffer (checkpointer.snapshot, grown as needed and reused by the next
// save: at most one is in flight), in chunks of a megabyte that any
// goroutine may take: the background writer's thread takes them first, at
// the lowest priority, so the copy runs while training leaves a core idle;
// the next optimizer step, which must not change the parameters before
// they are copied, takes whatever is left on the training threads (at
// normal priority: nothing the training waits for is left to a thread the
// OS may starve).
type snapshot struct {
	chunks  []snapChunk
	next    atomic.Int64 // the next chunk to take
	left    atomic.Int64 // chunks not yet copied
	byStep  atomic.Int64 // chunks the optimizer step copied
	done    chan struct{}
	started time.Time
	took    time.Duration // from started until the last chunk was copied
}

type snapChunk struct{ dst, src []float32 }

// snapChunkFloats is the size of a chunk: a megabyte.
const snapChunkFloats = 1 << 18

// newSnapshot prepares the copy of the pieces' data into the snapshot
// buffer and points the pieces at their copies (not yet made: the writer
// must wait for done).
func (ck *checkpointer) newSnapshot(pieces []ckpt.Piece) *snapshot {
	n := 0
	for _, p := range pieces {
		n += len(p.Data)
	}
	if cap(ck.snapshot) < n {
		ck.snapshot = ckpt.AlignedFloat32s(n) // aligned and back to back: written with O_DIRECT
	}
	s := &snapshot{done: make(chan struct{}), started: time.Now()}
	buf := ck.snapshot[:n]
	for i := range pieces {
		src, k := pieces[i].Data, len(pieces[i].Data)
		dst := buf[:k:k]
		for j := 0; j < k; j += snapChunkFloats {
			e := min(k, j+snapChunkFloats)
			s.chunks = append(s.chunks, snapChunk{dst[j:e], src[j:e]})
		}
		pieces[i].Data, buf = dst, buf[k:]
	}
	s.left.Store(int64(len(s.chunks)))
	if len(s.chunks) == 0 {
		close(s.done)
	}
	return s
}

// take copies the next chunk not yet taken, if any.
func (s *snapshot) take() bool {
	i := s.next.Add(1) - 1
	if i >= int64(len(s.chunks)) {
		return false
	}
	c := s.chunks[i]
	copy(c.dst, c.src)
	if s.left.Add(-1) == 0 {
		s.took = time.Since(s.started)
		close(s.done)
	}
	return true
}

// copyInBackground is the writer thread's part of the copy: chunks until
// none is left to take, yielding the processor in between (where the
// writer has no processor of its own, see addWriterProc); then it waits
// for the chunks others took.
func (s *snapshot) copyInBackground() {
	for s.take() {
		runtime.Gosched()
	}
	<-s.done
}

// stepShare is the fraction of the copy the optimizer step made.
func (s *snapshot) stepShare() float64 {
	if len(s.chunks) == 0 {
		return 0
	}
	return float64(s.byStep.Load()) / float64(len(s.chunks))
}

// finish copies what is left on the training threads and waits until the
// copy is complete.
func (s *snapshot) finish() {
	select {
	case <-s.done:
		return
	default:
	}
	// A host-side copy of I/O buffers, not arithmetic: as many goroutines
	// as the kernels use (the caller being one) drain the chunk queue.
	drain := func() {
		for s.take() {
			s.byStep.Add(1)
		}
	}
	var wg sync.WaitGroup
	for range tensor.CPUThreads() - 1 {
		wg.Go(drain)
	}
	drain()
	wg.Wait()
	<-s.done
}

// allocateSnapshot sets aside, at start, the buffer --async-save copies
// this rank's shards into, and touches every page of it: the first save
// then costs a copy, not a copy plus the page faults of a fresh gigabyte.
// It is the memory overhead of asynchronous saving, reported here.
func (ck *checkpointer) allocateSnapshot() error {
	if err := ck.stepper.syncParams(); err != nil { // FSDP: the pieces are of whole parameters
		return err
	}
	st := ck.stepper.opt.State()
	var ps *optim.State
	if !ck.cfg.NoSaveOptim {
		ps = &st
	}
	pieces, err := ck.checkpointPieces(ps)
	if err != nil {
		return err
	}
	n := 0
	for _, p := range pieces {
		n += len(p.Data)
	}
	ck.snapshot = ckpt.AlignedFloat32s(n) // aligned: written with O_DIRECT
	for i := 0; i < n; i += 1024 {
		ck.snapshot[i] = 0 // fault the page in
	}
	ck.printf("--async-save: %.1f MB set aside for a copy of this rank's checkpoint shards", float64(4*n)/1e6)
	return nil
}

// stateKinds are the buffer kinds of an optimizer state ("exp_avg", ...).
func stateKinds(st optim.State) []string {
	seen := map[string]bool{}
	for k := range st.Buffers {
		kind, _, _ := strings.Cut(k, "/")
		seen[kind] = true
	}
	kinds := make([]string, 0, len(seen))
	for k := range seen {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	return kinds
}

// readParams fills this rank's parameters (its stages' under pipelining,
// the tied embedding's copy included) from the checkpoint, reading only the
// blocks it holds.
//
// The model's buffers (an MoE router's expert bias) are read as
// parameters are.
func (ck *checkpointer) readParams(r *ckpt.Reader) error {
	for _, p := range append(ck.stepper.localParams(), ck.stepper.buffers()...) {
		full, blocks := ck.paramBlocks(p.Name, p.Shape())
		if err := staged(p, func(v []float32) error {
			for _, b := range blocks {
				if err := r.Read(ckpt.GroupModel, p.Name, full, b.Block, v[b.start:b.start+b.Len()]); err != nil {
					return fmt.Errorf("train: --load: %w", err)
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// readOptimizerState fills st, this rank's optimizer state as the optimizer
// keeps it (its keys and lengths), from the checkpoint.
func (ck *checkpointer) readOptimizerState(r *ckpt.Reader, st *optim.State) error {
	shapes := map[string][]int{}
	for _, p := range ck.stepper.localParams() {
		shapes[p.Name] = p.Shape()
	}
	for _, key := range st.BufferNames() {
		buf := st.Buffers[key]
		kind, name, lo, hi, sharded, err := optimizerKey(key)
		if err != nil {
			return err
		}
		shape, ok := shapes[name]
		if !ok {
			return fmt.Errorf("train: optimizer buffer %s names no parameter of this rank", key)
		}
		if !sharded {
			lo, hi = 0, len(buf)
		}
		full, blocks := ck.paramBlocks(name, shape)
		for _, b := range restrict(blocks, lo, hi) {
			if err := r.Read(ckpt.GroupOptimizer, kind+"/"+name, full, b.Block, buf[b.start:b.start+b.Len()]); err != nil {
				return fmt.Errorf("train: --load: %w", err)
			}
		}
	}
	return nil
}

// expectTensors checks the checkpoint's model (and, with optimizer, its
// optimizer) tensors against this run's model: names, whole shapes and
// dtypes, every mismatch listed. Unexpected tensors are errors unless
// strictness allows them (Megatron's --dist-ckpt-strictness).
func (ck *checkpointer) expectTensors(r *ckpt.Reader, optimizer *optim.State) error {
	unexpectedOK, logUnexpected := strictness(ck.cfg.DistCkptStrictness)
	if c := ck.cfg.Model; c.MLA.Enabled && !c.QKLayerNorm && hasMLALatentNorms(r) {
		// whatever the strictness: dropping the norms would change the model
		return fmt.Errorf("train: the checkpoint's multi-latent attention has latent norms (q_layernorm/kv_layernorm), which this run's model has only with --qk-layernorm: add --qk-layernorm")
	}
	want := map[string]ckpt.Spec{}
	for _, p := range ck.stepper.model.Params() {
		want[p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: ck.stepper.fullShape(p.Name, p.Shape())}
	}
	others := ck.stepper.otherExperts()
	for name, shape := range others {
		want[name] = ckpt.Spec{DType: safetensors.F32, Shape: shape}
	}
	for _, b := range ck.stepper.buffers() {
		want[b.Name] = ckpt.Spec{DType: safetensors.F32, Shape: b.Shape()}
	}
	err := r.Expect(ckpt.GroupModel, want, unexpectedOK)
	if optimizer != nil && len(optimizer.Buffers) > 0 && err == nil {
		wantOpt := map[string]ckpt.Spec{}
		for _, kind := range stateKinds(*optimizer) {
			for _, p := range ck.stepper.model.Params() {
				shape := ck.stepper.fullShape(p.Name, p.Shape())
				if r.Version < 2 {
					shape = []int{numel(shape)} // format 1 stores optimizer buffers flat
				}
				wantOpt[kind+"/"+p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: shape}
			}
			for name, shape := range others {
				if r.Version < 2 {
					shape = []int{numel(shape)}
				}
				wantOpt[kind+"/"+name] = ckpt.Spec{DType: safetensors.F32, Shape: shape}
			}
		}
		err = r.Expect(ckpt.GroupOptimizer, wantOpt, unexpectedOK)
	}
	if err != nil {
		return fmt.Errorf("train: --load: the checkpoint does not match the model:\n%w", err)
	}
	if logUnexpected {
		for _, name := range slices.Sorted(maps.Keys(r.Tensors(ckpt.GroupModel))) {
			if _, ok := want[name]; !ok {
				ck.printf("WARNING: --load: checkpoint tensor %s/%s is not used by the model", ckpt.GroupModel, name)
			}
		}
	}
	return nil
}

// strictness maps --dist-ckpt-strictness to whether tensors the model does
// not use are accepted, and whether they are logged. Missing tensors and
// shape or dtype mismatches are errors whatever the value: gotron never
// trains on a partly loaded model.
func strictness(s string) (unexpectedOK, logUnexpected bool) {
	switch s {
	case "raise_unexpected", "raise_all":
		return false, false
	case "log_unexpected", "log_all":
		return true, true
	}
	return true, false // assume_ok_unexpected (Megatron's default), ignore_all
}

// StrictnessValues are the accepted --dist-ckpt-strictness values.
var StrictnessValues = []string{"assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all", "ignore_all"}

// groupFP8 is the checkpoint group of the FP8 delayed recipe's state:
// per linear layer, by its weight's name, gpt.FP8.DelayedState's vector
// (amax histories and scales of its input, weight and output gradient).
// Transformer Engine keeps the same in each module's _extra_state.
const groupFP8 = "fp8"

// readFP8State gives a delayed-FP8 run the checkpoint's amax histories and
// scales for this rank's linear layers, so a resumed run quantizes as the
// uninterrupted one would. A checkpoint without them (saved before they
// were kept, or by a run without the delayed recipe) starts them afresh,
// and says so. Histories of another length are refused naming the flag.
// Reshard's run, without FP8, keeps this rank's part as it is read and
// writes it into the checkpoint it saves (Config.carryFP8).
func (ck *checkpointer) readFP8State(root string, r *ckpt.Reader) error {
	f := ck.stepper.fp8()
	delayed := f.DelayedState() != nil
	switch {
	case !delayed && !(ck.cfg.carryFP8 && r.Has(groupFP8)):
		return nil
	case !r.Has(groupFP8):
		ck.printf("--fp8-recipe delayed: the checkpoint %s keeps no amax histories: they start afresh (scale 1)", root)
		return nil
	}
	saved := map[string][]float32{}
	have := r.Tensors(groupFP8)
	for _, p := range ck.stepper.localParams() {
		if _, ok := have[p.Name]; !ok {
			continue
		}
		v, _, err := r.ReadWhole(groupFP8, p.Name)
		if err != nil {
			return fmt.Errorf("train: --load: %w", err)
		}
		saved[p.Name] = v
	}
	if !delayed {
		ck.fp8Carried = saved
		return nil
	}
	if err := f.RestoreDelayed(saved); err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	return nil
}
