package infer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// EngineConfig configures an Engine. Every field's zero value is usable.
type EngineConfig struct {
	// KVCacheBytes sizes the paged KV pool, allocated once (--kv-cache-bytes).
	// 0 means the smaller of 1 GiB and what MaxNumSeqs sequences of the
	// model's full context need. A model with gated delta net layers also
	// keeps MaxNumSeqs sequences' recurrent states (gpt.GDNState), a fixed
	// size per sequence, allocated at start: they come out of KVCacheBytes
	// first, and the default adds them to the pool's.
	KVCacheBytes int64
	// BlockTokens is the number of positions per KV block (--block-size);
	// 0 means 16.
	BlockTokens int
	// MaxNumBatchedTokens bounds the tokens of one step, decode tokens and
	// prefill chunks together (--max-num-batched-tokens); 0 means 512.
	MaxNumBatchedTokens int
	// MaxNumSeqs bounds the sequences running at once (--max-num-seqs); 0
	// means 256.
	MaxNumSeqs int
	// DisablePrefixCaching turns off the reuse of full prompt blocks
	// (prefix caching is on by default). NewEngine sets it for a model with
	// gated delta net layers: their state after a prefix is not cached, so
	// every prompt is computed whole.
	DisablePrefixCaching bool
	// VocabSize is the tokenizer's vocabulary: sampling never draws from
	// the padded tail of the model's. 0 means the model's vocabulary.
	VocabSize int
	// Decoder turns ids into text for stop strings and Event.Text; nil
	// means events carry no text and requests may not set Stop.
	Decoder Decoder
	// Weights is the layout decode steps read the linear weights in
	// (--decode-weights); the zero value packs them (WeightsPacked).
	Weights WeightLayout
	// BF16 says the model's weights are bfloat16 values (rounded by
	// gpt.Model.RoundToBF16, --bf16): packed weights are then stored in
	// bfloat16, half the bytes a decode step streams, exactly.
	BF16 bool
}

// validate fills defaults for m and rejects bad values, naming the flag.
func (c *EngineConfig) validate(m *gpt.Model) error {
	mc := &m.Config
	switch {
	case c.KVCacheBytes < 0:
		return fmt.Errorf("infer: --kv-cache-bytes=%d: want >= 0", c.KVCacheBytes)
	case c.BlockTokens < 0:
		return fmt.Errorf("infer: --block-size=%d: want >= 0", c.BlockTokens)
	case c.MaxNumBatchedTokens < 0:
		return fmt.Errorf("infer: --max-num-batched-tokens=%d: want >= 0", c.MaxNumBatchedTokens)
	case c.MaxNumSeqs < 0:
		return fmt.Errorf("infer: --max-num-seqs=%d: want >= 0", c.MaxNumSeqs)
	case c.Weights < WeightsPacked || c.Weights > WeightsModel:
		return fmt.Errorf("infer: weight layout %d: want WeightsPacked or WeightsModel", c.Weights)
	case c.VocabSize < 0 || c.VocabSize > mc.VocabSize:
		return fmt.Errorf("infer: vocabulary of %d: want 1..%d (the model's)", c.VocabSize, mc.VocabSize)
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = 512
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = 256
	}
	if c.VocabSize == 0 {
		c.VocabSize = mc.VocabSize
	}
	states, ok := c.stateBytes(m)
	if !ok {
		return fmt.Errorf("infer: --max-num-seqs=%d sequences' gated delta net states (%d bytes each) overflow", c.MaxNumSeqs, m.GDNStateBytes())
	}
	if c.KVCacheBytes == 0 {
		full := int64(c.MaxNumSeqs) * int64(mc.MaxPositionEmbeddings+c.BlockTokens) * c.bytesPerToken(m)
		c.KVCacheBytes = min(full, 1<<30) + states
	}
	if c.KVCacheBytes-states < c.blockBytes(m) {
		if states > 0 {
			return fmt.Errorf("infer: --kv-cache-bytes=%d holds the gated delta net states of --max-num-seqs=%d sequences (%d bytes) and no block of %d tokens (%d bytes): raise it or lower --max-num-seqs",
				c.KVCacheBytes, c.MaxNumSeqs, states, c.BlockTokens, c.blockBytes(m))
		}
		return fmt.Errorf("infer: --kv-cache-bytes=%d holds no block of %d tokens (%d bytes)", c.KVCacheBytes, c.BlockTokens, c.blockBytes(m))
	}
	return nil
}

// bytesPerToken is the KV cache size of one position: keys and values of
// every attention layer m holds (not the gated delta net layers), float32,
// of the query groups this rank holds (a tensor-parallel rank caches its
// own heads, a pipeline stage its own layers).
func (c *EngineConfig) bytesPerToken(m *gpt.Model) int64 {
	return m.KVBytesPerToken()
}

// stateBytes is the memory of MaxNumSeqs sequences' gated delta net
// states (0 without such layers); ok is false on overflow.
func (c *EngineConfig) stateBytes(m *gpt.Model) (int64, bool) {
	return checked.Mul(int64(c.MaxNumSeqs), m.GDNStateBytes())
}

func (c *EngineConfig) blockBytes(m *gpt.Model) int64 {
	return int64(c.BlockTokens) * c.bytesPerToken(m)
}

// Request is one generation request.
type Request struct {
	// Prompt is the token ids to continue; not empty.
	Prompt []int32
	// MaxTokens is the most new tokens to generate (Megatron's
	// tokens_to_generate); 0 is allowed only with PromptLogprobs (scoring).
	MaxTokens int
	// Sampling is the per-request sampling (Megatron's rules).
	Sampling Sampling
	// StopTokens end generation when sampled (reason "stop"; the token is
	// reported but has no text). Usually the tokenizer's end of document.
	StopTokens []int
	// Stop strings end generation before their first occurrence in the
	// generated text, which excludes them. Needs EngineConfig.Decoder.
	Stop []string
	// Logprobs reports each sampled token's log-probability (log-softmax of
	// the raw logits over the vocabulary, before temperature).
	Logprobs bool
	// TopLogprobs also reports this many most likely tokens per step.
	TopLogprobs int
	// PromptLogprobs reports the log-probability of every prompt token
	// after the first, given those before it (Megatron's logprobs). Such a
	// request does not reuse cached prefix blocks.
	PromptLogprobs bool
	// PromptTopLogprobs, with PromptLogprobs and TopLogprobs, also reports
	// the TopLogprobs most likely tokens of each prompt position followed by
	// a prompt token (Megatron's prompt_top_n_logprobs).
	PromptTopLogprobs bool
	// JSONObject constrains the generated text to one JSON object (OpenAI's
	// response_format json_object): before each draw, every token whose
	// text (EngineConfig.Decoder's, token by token) would not continue a
	// JSON object is masked out of the logits, stop tokens included, and
	// the sequence finishes with FinishStop once the object is closed (or
	// FinishLength first, its text then a prefix of one). Log-probabilities
	// are over the tokens the constraint allows. Needs a Decoder whose
	// tokens' texts concatenate (byte-level BPE) and the CPU.
	JSONObject bool
}

// SeqID identifies a request inside an Engine.
type SeqID int64

// FinishReason says why a sequence ended.
type FinishReason string

// Finish reasons (OpenAI's names).
const (
	FinishStop   FinishReason = "stop"   // a stop token or stop string
	FinishLength FinishReason = "length" // MaxTokens reached
	FinishAbort  FinishReason = "abort"  // cancelled, or the engine closed
)

// TokenLogprob is a token with its log-probability.
type TokenLogprob struct {
	Token   int
	Logprob float32
}

// Event is one step's news of one sequence: a sampled token, or the end.
type Event struct {
	Seq SeqID
	// Token is the sampled id, or -1 when the event only finishes.
	Token int
	// Text is the new text (with a Decoder): what Token completes, less any
	// part held back because it may begin a stop string. It may be empty.
	Text string
	// Logprob and TopLogprobs are set when the request asked for them.
	Logprob     float32
	TopLogprobs []TokenLogprob
	// PromptLogprobs is set on a sequence's first event when the request
	// asked for it: entry i is the log-probability of prompt token i+1.
	PromptLogprobs []float32
	// PromptTopLogprobs is set with PromptLogprobs when the request asked
	// for it: entry i is the most likely tokens where prompt token i+1 is.
	PromptTopLogprobs [][]TokenLogprob
	// Finish is non-empty on a sequence's last event.
	Finish FinishReason
	// PromptTokens and CompletionTokens count the sequence's tokens so far.
	PromptTokens, CompletionTokens int
}

// ErrContextLength is wrapped by Add's error when a request cannot fit the
// model's positions or the KV pool.
var ErrContextLength = errors.New("infer: request exceeds the context")

// ErrBadRequest is wrapped by Add's other errors on a malformed request.
var ErrBadRequest = errors.New("infer: bad request")

// Stats is a snapshot of an engine's state and counters.
type Stats struct {
	Waiting, Running     int   // sequences
	KVBlocksUsed         int   // blocks held by sequences
	KVBlocksCached       int   // free blocks still indexed for prefix reuse
	KVBlocksTotal        int   // the pool
	BlockTokens          int   // positions per block
	Steps                int64 // forward steps run
	Preemptions          int64 // sequences preempted (recomputed later)
	PromptTokens         int64 // prompt tokens admitted
	PrefixCacheHitTokens int64 // of which found in the prefix cache
	GeneratedTokens      int64 // tokens sampled
	BatchedTokens        int64 // tokens run through the model
}

// Engine is the synchronous, deterministic core of continuous batching
// (raft's RawNode split; Runner is the goroutine wrapper): Add queues
// requests, each Step schedules one batch — every running sequence's next
// token plus prefill chunks of waiting ones, within MaxNumBatchedTokens —
// runs one forward over it through the paged KV cache and returns the
// events. The same calls give the same events. Not safe for concurrent use.
type Engine struct {
	m      *gpt.Model
	cfg    EngineConfig
	pool   *kvPool
	att    *pagedAttention
	packed *PackedLinears // nil: the model's weights through the general GEMM
	pipe   *pipeline      // nil: the whole model (or its tensor-parallel slice)
	maxPos int

	nextID  SeqID
	waiting []*sequence // by arrival (id)
	running []*sequence // by arrival (id)
	byID    map[SeqID]*sequence
	stats   Stats
	// freeStates are the gated delta net state slots no running sequence
	// holds (MaxNumSeqs in all; none without such layers).
	freeStates []*gpt.GDNState

	// step scratch
	bufs      gpt.DecodeBuffers
	plan      []scheduled
	draws     []Event      // by plan index: the token drawn (drawTokens)
	drawIdx   []int        // plan indices that draw this step
	prompts   []promptRows // the step's prompt log-probabilities
	drawSpec  []tensor.TokenSampling
	drawIDs   []int32   // by draw: the drawn token
	drawLPs   []float32 // by draw: its log-probability
	topIDs    []int32   // by draw: its top log-probabilities (k each)
	topLPs    []float32
	tokens    []int32
	positions []int32
	// tokenBytes is each id's text (the Decoder's), for JSON output,
	// computed once (jsonVocab) at the first JSON request, whose
	// Validate may run on another goroutine.
	jsonOnce   sync.Once
	tokenBytes [][]byte
	jsonErr    error
	jsonMasks  map[jsonObject][]bool // by state, at most jsonMaskCache
	spans      []span
	rows       []int
	events     []Event
}

// scheduled is one sequence's share of a step: n tokens from its computed
// position, and where its logits rows start (-1: none).
type scheduled struct {
	s       *sequence
	n       int
	logits0 int
	nLogits int
}

// NewEngine allocates the KV pool for m and the buffers of its largest
// step, and returns an idle engine.
func NewEngine(m *gpt.Model, cfg EngineConfig) (*Engine, error) {
	return newEngine(m, cfg, nil)
}

// newEngine is NewEngine of m, a pipeline stage's model with pipe.
func newEngine(m *gpt.Model, cfg EngineConfig, pipe *pipeline) (*Engine, error) {
	if cf := m.Config.MoE.CapacityFactor; m.Config.MoE.Enabled() && cf > 0 {
		// Capacity is counted over the tokens routed together: a token's
		// output would depend on which other requests share its step.
		return nil, fmt.Errorf("infer: MoE model with --moe-expert-capacity-factor %g: a serving step would drop tokens depending on the other requests in it; serve a dropless model (no capacity factor)", cf)
	}
	switch {
	case m.Experts != nil && !m.DecodesExperts():
		// training's dispatchers exchange each rank's own tokens; the
		// lockstep ranks hold the same ones
		return nil, errors.New("infer: an MoE model split over expert-parallel ranks for training (gpt.Model.SliceExperts): split it for decoding (gpt.Model.DecodeExperts)")
	case m.Sharding != nil && m.Config.MoE.Enabled() && !m.ExpertsOverTP() && !m.DecodesExperts():
		return nil, errors.New("infer: an MoE model split over tensor-parallel ranks with its experts whole: split them over the ranks too (gpt.Model.SplitExpertsOverTP, or gpt.Model.DecodeExperts)")
	}
	if err := cfg.validate(m); err != nil {
		return nil, err
	}
	mc := &m.Config
	if mc.GDN.Enabled {
		cfg.DisablePrefixCaching = true // see EngineConfig.DisablePrefixCaching
	}
	states, _ := cfg.stateBytes(m) // validate checked it
	// A pipeline stage of gated delta net layers alone caches no keys.
	blocks := math.MaxInt
	if bb := cfg.blockBytes(m); bb > 0 {
		blocks = int((cfg.KVCacheBytes - states) / bb)
	}
	if pipe != nil {
		// Every stage schedules the same blocks: the fewest any holds.
		var err error
		if blocks, err = pipe.agreeBlocks(blocks); err != nil {
			return nil, err
		}
	}
	if blocks == math.MaxInt {
		return nil, errors.New("infer: a model without attention layers: nothing for the KV cache's blocks to hold, not built in gotron")
	}
	e := &Engine{m: m, cfg: cfg, pipe: pipe, maxPos: mc.MaxPositionEmbeddings, byID: map[SeqID]*sequence{}}
	cached := make([]bool, len(m.Layers)) // a pipeline stage's layers
	for i := range cached {
		cached[i] = m.Layers[i].GDN == nil
	}
	e.pool = newKVPool(m.Device(), cached, m.QueryGroupsHere(), m.KVHeadDim(), cfg.BlockTokens, blocks, m.SharedKV())
	if states > 0 {
		// one slot per sequence that can run; the slices are the
		// sequences' state while they hold them
		for range cfg.MaxNumSeqs {
			e.freeStates = append(e.freeStates, m.NewGDNState())
		}
	}
	e.att = newPagedAttention(e.pool)
	if cfg.BF16 {
		if err := m.CheckBF16(); err != nil {
			return nil, fmt.Errorf("infer: EngineConfig.BF16: %w", err)
		}
	}
	if cfg.Weights == WeightsPacked {
		dtype := tensor.Float32
		if cfg.BF16 {
			dtype = tensor.BFloat16
		}
		e.packed = PackLinears(m, dtype)
	}
	if m.Sharding != nil || pipe != nil {
		// The warm-up communicates (tensor parallelism), or the engine
		// steps with the other stages': the ranks first check that their
		// engines agree (NewLockstep, Follow), then warm up together.
		return e, nil
	}
	if err := e.warmUp(); err != nil {
		return nil, fmt.Errorf("infer: warm-up step: %w", err)
	}
	return e, nil
}

// warmUp runs the largest step — MaxNumBatchedTokens dummy tokens, with
// logits for MaxNumSeqs of them — through the model with an attention that
// stores nothing, as vLLM's profiling run does: the step buffers are then
// allocated, and their pages committed, at start instead of being faulted
// in during the first large batch (GPT-2 124M's 512-token prefill took
// ~150 ms longer when it had to fault in its ~40 MB of buffers). Smaller
// steps reuse these buffers (tensor.NewSizeClassArena). A layer's buffers
// go back to the pool when it is done, so the model's first layer alone
// shows them all: the warm-up costs a layer, not a whole prefill.
func (e *Engine) warmUp() error {
	n := e.cfg.MaxNumBatchedTokens
	tokens, positions := make([]int32, n), make([]int32, n)
	for i := range positions {
		positions[i] = int32(i % e.maxPos)
	}
	rows := make([]int, min(n, e.cfg.MaxNumSeqs))
	for i := range rows {
		rows[i] = n - len(rows) + i
	}
	if e.pipe != nil {
		return e.pipe.warmUp(e, tokens, positions, rows)
	}
	first := *e.m // shares the weights
	first.Layers = first.Layers[:min(1, len(first.Layers))]
	var att discardAttention
	for i := 0; i < n && first.GDNStateBytes() > 0; i += e.maxPos { // a sequence per wrap of the positions
		att.runs = append(att.runs, gpt.GDNRun{Tokens: min(e.maxPos, n-i)})
		att.states = append(att.states, first.NewGDNState())
	}
	_, err := first.DecodeBatch(&e.bufs, tokens, positions, att, rows, e.linears())
	return err
}

// discardAttention is the warm-up's gpt.Attender: it stores nothing and
// leaves the output zero; the gated delta net layers run the tokens as
// sequences (runs) with scratch states.
type discardAttention struct {
	runs   []gpt.GDNRun
	states []*gpt.GDNState
}

func (discardAttention) Attend(layer int, q, k, v, out *tensor.Tensor) {}

func (a discardAttention) GDNRuns(layer int) []gpt.GDNRun {
	for i := range a.runs {
		a.runs[i] = a.states[i].Run(layer, a.runs[i].Tokens)
	}
	return a.runs
}

// PackedWeightBytes returns the memory of the packed weight copies (0
// with WeightsModel).
func (e *Engine) PackedWeightBytes() int64 {
	if e.packed == nil {
		return 0
	}
	return e.packed.Bytes()
}

// linears returns what DecodeBatch computes the linear layers with.
func (e *Engine) linears() gpt.Linears {
	if e.packed == nil {
		return nil // a nil *PackedLinears in the interface would not be nil
	}
	return e.packed
}

// StateBytes is the memory of the gated delta net layers' state slots,
// part of EngineConfig.KVCacheBytes (0 without such layers).
func (e *Engine) StateBytes() int64 {
	b, _ := e.cfg.stateBytes(e.m) // validate checked it
	return b
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() EngineConfig { return e.cfg }

// MaxTokens is the most tokens (prompt and generated) one sequence can hold.
func (e *Engine) MaxTokens() int {
	return min(e.maxPos, e.pool.numBlocks*e.pool.blockTokens)
}

// Add validates r and queues it; the returned id names its events.
func (e *Engine) Add(r Request) (SeqID, error) {
	if err := e.Validate(r); err != nil {
		return 0, err
	}
	s, err := newSequence(e.nextID, r, e.cfg.Decoder, e.MaxTokens())
	if err != nil {
		return 0, err
	}
	e.nextID++
	e.waiting = append(e.waiting, s)
	e.byID[s.id] = s
	return s.id, nil
}

// Validate reports whether Add would accept r: wrapping ErrBadRequest for a
// malformed request, ErrContextLength for one too long for the model or the
// KV pool. It reads only the engine's fixed configuration, so it is safe to
// call from any goroutine while another runs the engine.
func (e *Engine) Validate(r Request) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadRequest}, args...)...)
	}
	switch {
	case len(r.Prompt) == 0:
		return bad("empty prompt")
	case r.MaxTokens < 0:
		return bad("max tokens %d: want >= 0", r.MaxTokens)
	case r.MaxTokens == 0 && !r.PromptLogprobs:
		return bad("max tokens 0: want >= 1 (0 only to score the prompt's log-probabilities)")
	case r.TopLogprobs < 0 || r.TopLogprobs > e.cfg.VocabSize:
		return bad("top logprobs %d: want 0..%d (the vocabulary)", r.TopLogprobs, e.cfg.VocabSize)
	case len(r.Stop) > 0 && e.cfg.Decoder == nil:
		return bad("stop strings need a tokenizer")
	case r.JSONObject && e.CheckJSONOutput() != nil:
		return bad("%v", e.CheckJSONOutput())
	}
	for _, st := range r.Stop {
		if st == "" {
			return bad("empty stop string")
		}
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= e.cfg.VocabSize {
			return bad("prompt token %d at %d outside the vocabulary of %d", t, i, e.cfg.VocabSize)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	// The sum is checked: a MaxTokens near 2^63 must not wrap it negative
	// and slip past the comparison.
	if need, ok := checked.AddInt(len(r.Prompt), r.MaxTokens); !ok || need > e.MaxTokens() {
		have := e.MaxTokens()
		what := fmt.Sprintf("the model's %d positions", e.maxPos)
		if have < e.maxPos {
			what = fmt.Sprintf("the KV cache's %d positions (--kv-cache-bytes)", have)
		}
		return fmt.Errorf("%w: %d prompt tokens + %d new tokens exceed %s", ErrContextLength, len(r.Prompt), r.MaxTokens, what)
	}
	return nil
}

// Cancel ends the sequence id, freeing its blocks; it reports whether the
// sequence was still queued or running. No event follows.
func (e *Engine) Cancel(id SeqID) bool {
	s, ok := e.byID[id]
	if !ok {
		return false
	}
	e.finish(s)
	return true
}

// HasWork reports whether a Step would run anything.
func (e *Engine) HasWork() bool { return len(e.waiting)+len(e.running) > 0 }

// Stats returns the current counters.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Waiting, st.Running = len(e.waiting), len(e.running)
	st.KVBlocksUsed, st.KVBlocksCached, st.KVBlocksTotal = e.pool.Used(), e.pool.cachedCount(), e.pool.numBlocks
	st.BlockTokens = e.pool.blockTokens
	return st
}

// Step runs one batched forward over the scheduled sequences and returns
// their events (valid until the next Step). With nothing to run it returns
// no events. An error means the model failed: the step's sequences are
// aborted (their events say so) and the engine stays usable.
func (e *Engine) Step() ([]Event, error) {
	e.events = e.events[:0]
	e.schedule()
	if len(e.plan) == 0 {
		return e.events, nil
	}
	e.tokens, e.positions, e.spans, e.rows = e.tokens[:0], e.positions[:0], e.spans[:0], e.rows[:0]
	for i := range e.plan {
		p := &e.plan[i]
		s := p.s
		e.spans = append(e.spans, span{row: len(e.tokens), n: p.n, pos: s.computed, table: s.table, state: s.state})
		e.tokens = append(e.tokens, s.tokens[s.computed:s.computed+p.n]...)
		for j := range p.n {
			e.positions = append(e.positions, int32(s.computed+j))
		}
		p.logits0, p.nLogits = len(e.rows), 0
		if s.wantsPromptLogprobs() {
			for j := range p.n {
				e.rows = append(e.rows, e.spans[i].row+j)
			}
			p.nLogits = p.n
		} else if s.computed+p.n == len(s.tokens) {
			e.rows = append(e.rows, e.spans[i].row+p.n-1)
			p.nLogits = 1
		}
	}
	e.att.reset(e.spans)
	rows := e.rows
	if len(rows) == 0 {
		// Every sequence is mid-prefill: the forward still fills the
		// cache; ask for one row's logits and ignore them.
		rows = []int{len(e.tokens) - 1}
	}
	var logits *tensor.Tensor // (rows, V) on the model's device; nil on a pipeline stage but the last
	var err error
	if e.pipe != nil {
		logits, err = e.pipe.forward(e, rows)
	} else {
		logits, err = e.m.DecodeBatch(&e.bufs, e.tokens, e.positions, e.att, rows, e.linears())
	}
	e.stats.Steps++
	e.stats.BatchedTokens += int64(len(e.tokens))
	if err == nil {
		err = e.results(logits)
	}
	if err != nil {
		for _, p := range e.plan {
			e.emit(p.s, Event{Token: -1, Finish: FinishAbort})
			e.finish(p.s)
		}
		return e.events, fmt.Errorf("infer: step: %w", err)
	}
	for i, p := range e.plan {
		s := p.s
		s.computed += p.n
		e.registerBlocks(s)
		if s.computed < len(s.tokens) {
			continue // mid-prefill
		}
		if s.generated == s.req.MaxTokens { // scoring only
			e.emit(s, Event{Token: -1, Finish: FinishLength})
			e.finish(s)
			continue
		}
		if s.json != nil {
			for _, b := range e.tokenBytes[e.draws[i].Token] {
				s.json.feed(b)
			}
		}
		ev := s.take(e.draws[i])
		e.stats.GeneratedTokens++
		e.emit(s, ev)
		if ev.Finish != "" {
			e.finish(s)
		}
	}
	return e.events, nil
}

// results computes what the step's logits give, before any sequence
// advances: the draws (e.draws) and the prompt log-probabilities asked for.
// On a pipeline stage the last computes them and the others receive them.
func (e *Engine) results(logits *tensor.Tensor) error {
	e.prompts = e.prompts[:0]
	for _, p := range e.plan {
		if s := p.s; s.wantsPromptLogprobs() {
			if m := min(p.nLogits, s.nPrompt-1-s.computed); m > 0 {
				e.prompts = append(e.prompts, promptRows{s: s, pos0: s.computed, m: m})
			}
		}
	}
	e.drawSpecs()
	if logits != nil {
		e.drawTokens(logits)
		var view *tensor.Tape // no gradients: views of the step's rows
		for i, p := range e.plan {
			if s := p.s; s.wantsPromptLogprobs() {
				s.addPromptLogprobs(s.computed, view.Narrow(logits, 0, e.plan[i].logits0, p.nLogits), e.cfg.VocabSize)
			}
		}
	}
	if e.pipe == nil {
		return nil
	}
	return e.pipe.shareResults(e)
}

// drawSpecs lists the planned sequences that draw a token this step (all
// their tokens computed, not scoring only) into e.drawIdx, with each one's
// rules and next uniform number (its sampler advances) into e.drawSpec.
func (e *Engine) drawSpecs() {
	e.draws = slices.Grow(e.draws[:0], len(e.plan))[:len(e.plan)]
	e.drawIdx, e.drawSpec = e.drawIdx[:0], e.drawSpec[:0]
	for i, p := range e.plan {
		s := p.s
		if s.computed+p.n == len(s.tokens) && s.generated < s.req.MaxTokens {
			d := s.sampler.next(p.logits0 + p.nLogits - 1)
			d.Logprob = s.req.Logprobs || s.req.TopLogprobs > 0
			d.TopLogprobs = s.req.TopLogprobs
			e.drawIdx = append(e.drawIdx, i)
			e.drawSpec = append(e.drawSpec, d)
		}
	}
}

// drawTokens draws the next token of every planned sequence whose tokens
// are all computed (except scoring-only ones) into e.draws, by plan index:
// one tensor.SampleTokens over the step's logits, each sequence with its
// own sampler's rules and uniform number, so the backend may draw them in
// any order (the CPU draws them in parallel).
func (e *Engine) drawTokens(logits *tensor.Tensor) {
	k := 0
	for _, d := range e.drawSpec {
		k = max(k, d.TopLogprobs)
	}
	n := len(e.drawIdx)
	if n == 0 {
		return
	}
	e.drawIDs = slices.Grow(e.drawIDs[:0], n)[:n]
	e.drawLPs = slices.Grow(e.drawLPs[:0], n)[:n]
	out := tensor.SampledTokens{IDs: tensor.FromInt32(e.drawIDs, n), Logprobs: tensor.FromFloat32(e.drawLPs, n)}
	if k > 0 {
		e.topIDs = slices.Grow(e.topIDs[:0], n*k)[:n*k]
		e.topLPs = slices.Grow(e.topLPs[:0], n*k)[:n*k]
		out.TopIDs, out.TopLogprobs = tensor.FromInt32(e.topIDs, n, k), tensor.FromFloat32(e.topLPs, n, k)
	}
	e.maskJSON(logits)
	// The draws are made where the logits are; the drawn tokens and their
	// log-probabilities, the step's output, are read back here.
	sampleOn(logits.Device(), out, logits, e.cfg.VocabSize, e.drawSpec)
	ids, lps := out.IDs.Int32s(), out.Logprobs.Float32s()
	var topIDs []int32
	var topLPs []float32
	if k > 0 {
		topIDs, topLPs = out.TopIDs.Int32s(), out.TopLogprobs.Float32s()
	}
	for j, i := range e.drawIdx {
		d := &e.drawSpec[j]
		ev := Event{Token: int(ids[j])}
		if d.Logprob {
			ev.Logprob = lps[j]
		}
		if d.TopLogprobs > 0 {
			ev.TopLogprobs = make([]TokenLogprob, min(d.TopLogprobs, e.cfg.VocabSize))
			for t := range ev.TopLogprobs {
				ev.TopLogprobs[t] = TokenLogprob{Token: int(topIDs[j*k+t]), Logprob: topLPs[j*k+t]}
			}
		}
		e.draws[i] = ev
	}
}

// emit appends ev for s, filling the sequence fields.
func (e *Engine) emit(s *sequence, ev Event) {
	ev.Seq = s.id
	ev.PromptTokens, ev.CompletionTokens = s.nPrompt, s.generated
	if !s.emitted {
		s.emitted = true
		ev.PromptLogprobs = s.promptLP
		ev.PromptTopLogprobs = s.promptTop
	}
	e.events = append(e.events, ev)
}

// schedule fills e.plan: running sequences first, oldest first (a decode
// token each, or their next prefill chunk), preempting the youngest when the
// pool runs out; then, if nothing was preempted, waiting sequences in
// arrival order while the token budget, MaxNumSeqs and the pool allow.
func (e *Engine) schedule() {
	e.plan = e.plan[:0]
	budget := e.cfg.MaxNumBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := s.chunk(budget)
		for !e.grow(s, s.computed+n) {
			v := e.running[len(e.running)-1] // the youngest; may be s
			e.preempt(v)
			preempted = true
			if v == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		e.plan = append(e.plan, scheduled{s: s, n: n})
		budget -= n
	}
	if preempted {
		return
	}
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[0]
		e.matchPrefix(s)
		n := s.chunk(budget)
		if !e.grow(s, s.computed+n) {
			e.releaseBlocks(s)
			break
		}
		if !s.admitted { // first admission (not a recompute)
			s.admitted = true
			e.stats.PromptTokens += int64(s.nPrompt)
			e.stats.PrefixCacheHitTokens += int64(s.computed)
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		if len(e.freeStates) > 0 { // running sequences are at most MaxNumSeqs, the slots
			s.state, e.freeStates = e.freeStates[len(e.freeStates)-1], e.freeStates[:len(e.freeStates)-1]
		}
		e.plan = append(e.plan, scheduled{s: s, n: n})
		budget -= n
	}
}

// grow gives s blocks for positions [0, upto), all or none.
func (e *Engine) grow(s *sequence, upto int) bool {
	need := (upto+e.pool.blockTokens-1)/e.pool.blockTokens - len(s.table)
	if need <= 0 {
		return true
	}
	if need > e.pool.Available() {
		return false
	}
	for range need {
		id, _ := e.pool.alloc()
		s.table = append(s.table, id)
	}
	return true
}

// preempt returns the running sequence s to the waiting queue, freeing its
// blocks: it will be recomputed from its tokens (prompt and generated so
// far), its sampler state kept, so its output does not change.
func (e *Engine) preempt(s *sequence) {
	e.releaseBlocks(s)
	e.running = remove(e.running, s)
	i := sort.Search(len(e.waiting), func(i int) bool { return e.waiting[i].id > s.id })
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[i+1:], e.waiting[i:])
	e.waiting[i] = s
	e.stats.Preemptions++
}

// finish removes s from the engine and frees its blocks.
func (e *Engine) finish(s *sequence) {
	e.releaseBlocks(s)
	e.running = remove(e.running, s)
	e.waiting = remove(e.waiting, s)
	delete(e.byID, s.id)
}

func (e *Engine) releaseBlocks(s *sequence) {
	for _, id := range s.table {
		e.pool.release(id)
	}
	if s.state != nil {
		// its recurrent state goes with its keys and values: a preempted
		// sequence is recomputed from position 0, which zeroes the state
		// it gets then
		e.freeStates = append(e.freeStates, s.state)
		s.state = nil
	}
	s.table, s.keys, s.computed = s.table[:0], s.keys[:0], 0
}

// matchPrefix points s's first blocks at cached blocks holding the same
// tokens (full blocks only, and never the last token, whose logits the
// step needs).
func (e *Engine) matchPrefix(s *sequence) {
	if e.cfg.DisablePrefixCaching || s.wantsPromptLogprobs() {
		return
	}
	bt := e.pool.blockTokens
	var parent uint64
	for b := 0; (b+1)*bt <= len(s.tokens)-1; b++ {
		id, ok := e.pool.lookup(parent, s.tokens[b*bt:(b+1)*bt])
		if !ok {
			break
		}
		e.pool.acquire(id)
		s.table = append(s.table, id)
		parent = blockKey(parent, s.tokens[b*bt:(b+1)*bt])
		s.keys = append(s.keys, parent)
	}
	s.computed = len(s.table) * bt
}

// registerBlocks indexes s's newly filled full blocks for prefix reuse.
func (e *Engine) registerBlocks(s *sequence) {
	if e.cfg.DisablePrefixCaching {
		return
	}
	bt := e.pool.blockTokens
	for b := len(s.keys); (b+1)*bt <= s.computed; b++ {
		var parent uint64
		if b > 0 {
			parent = s.keys[b-1]
		}
		s.keys = append(s.keys, e.pool.register(s.table[b], parent, s.tokens[b*bt:(b+1)*bt]))
	}
}

func remove(list []*sequence, s *sequence) []*sequence {
	for i, x := range list {
		if x == s {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

// sampleOn is tensor.SampleTokens into the host tensors of out, for logits
// on dev: on the CPU in place, elsewhere into device tensors copied back
// (the step's one read of its results).
func sampleOn(dev tensor.Device, out tensor.SampledTokens, logits *tensor.Tensor, vocab int, draws []tensor.TokenSampling) {
	if dev == tensor.CPU {
		tensor.SampleTokens(out, logits, vocab, draws)
		return
	}
	on := func(t *tensor.Tensor) *tensor.Tensor {
		if t == nil {
			return nil
		}
		return tensor.NewOn(dev, t.DType(), t.Shape()...)
	}
	d := tensor.SampledTokens{IDs: on(out.IDs), Logprobs: on(out.Logprobs), TopIDs: on(out.TopIDs), TopLogprobs: on(out.TopLogprobs)}
	tensor.SampleTokens(d, logits, vocab, draws)
	for _, c := range [][2]*tensor.Tensor{{out.IDs, d.IDs}, {out.Logprobs, d.Logprobs}, {out.TopIDs, d.TopIDs}, {out.TopLogprobs, d.TopLogprobs}} {
		if c[0] != nil {
			tensor.Copy(c[0], c[1])
		}
	}
}

// maskJSON sets to -Inf, in the logits rows of this step's JSON draws, every
// token that would not continue the sequence's JSON object (the CPU's
// logits, in place: Validate refuses JSON requests elsewhere). Validate
// also checked that the vocabulary has a token for every printable ASCII
// character, so some token always continues the object.
func (e *Engine) maskJSON(logits *tensor.Tensor) {
	V := logits.Dim(1)
	for j, i := range e.drawIdx {
		s := e.plan[i].s
		if s.json == nil {
			continue
		}
		r := e.drawSpec[j].Row
		row := logits.Float32s()[r*V : (r+1)*V]
		for id, ok := range e.jsonMask(*s.json) {
			if !ok {
				row[id] = float32(math.Inf(-1))
			}
		}
		for _, id := range s.req.StopTokens { // they would end it unclosed
			if id >= 0 && id < V {
				row[id] = float32(math.Inf(-1))
			}
		}
	}
}

// jsonMaskCache bounds the masks kept (a vocabulary's worth of bools each).
const jsonMaskCache = 64

// jsonMask returns which tokens may follow state st. Masks are cached by
// state: inside a string, where a sequence spends most tokens, the state
// repeats step after step, and computing a mask tries every token.
func (e *Engine) jsonMask(st jsonObject) []bool {
	if m, ok := e.jsonMasks[st]; ok {
		return m
	}
	if e.jsonMasks == nil || len(e.jsonMasks) >= jsonMaskCache {
		e.jsonMasks = map[jsonObject][]bool{}
	}
	m := make([]bool, len(e.tokenBytes))
	for id, text := range e.tokenBytes {
		m[id] = st.accepts(text)
	}
	e.jsonMasks[st] = m
	return m
}

// CheckJSONOutput returns why this engine cannot constrain output to a
// JSON object (Request.JSONObject), or nil. Safe from any goroutine.
func (e *Engine) CheckJSONOutput() error {
	switch {
	case e.cfg.Decoder == nil:
		return errors.New("JSON output needs a tokenizer")
	case e.m.Device() != tensor.CPU:
		return errors.New("JSON output is constrained on the CPU only (--device cpu)")
	}
	return e.jsonVocab()
}

// jsonVocab returns why JSON output cannot be constrained with this
// engine's tokenizer (nil: it can), computing each token's text once.
// Constraining needs each token's text to be what it adds to any text
// before it (true of byte-level BPE vocabularies; checked on a few
// pairs) and a token for every printable ASCII character, so that every
// prefix of an object can be continued.
func (e *Engine) jsonVocab() error {
	e.jsonOnce.Do(func() {
		e.tokenBytes = make([][]byte, e.cfg.VocabSize)
		single := map[byte]int{}
		for id := range e.tokenBytes {
			t := []byte(e.cfg.Decoder.Decode([]int{id}))
			e.tokenBytes[id] = t
			if len(t) == 1 {
				if _, ok := single[t[0]]; !ok {
					single[t[0]] = id
				}
			}
		}
		for c := byte(0x20); c < 0x7f; c++ {
			if _, ok := single[c]; !ok {
				e.jsonErr = fmt.Errorf("JSON output needs a token for every printable ASCII character; the tokenizer has none for %q", c)
				return
			}
		}
		for _, pair := range []string{" 1", "1 ", "{\"", "\"a", "a\"", ": "} {
			if got := e.cfg.Decoder.Decode([]int{single[pair[0]], single[pair[1]]}); got != pair {
				e.jsonErr = fmt.Errorf("JSON output needs tokens whose texts concatenate; this tokenizer decodes %q and %q together as %q", pair[:1], pair[1:], got)
				return
			}
		}
	})
	return e.jsonErr
}
