package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/infer/server"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
)

const serveSynopsis = "serve --load DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-bytes SIZE --max-num-batched-tokens N --max-num-seqs N ...]"

// serveFlags are gotron serve's flags (vLLM's names where Megatron has none).
type serveFlags struct {
	load, host, modelName, chatTemplate string
	decodeWeights, device               string
	memFraction                         float64
	bf16, cacheLatents                  bool
	port                                int
	kvCacheBytes                        string
	kvCacheFraction                     float64
	engine                              infer.EngineConfig
	noPrefixCaching                     bool
	maxRequestBytes                     int64
	maxPromptTokens, maxN               int
	grace                               time.Duration
	tok                                 tokenizer.Config
	// Admission: what one client may hold (connections, time, bytes).
	readTimeout, writeTimeout, idleTimeout time.Duration
	maxConnections, maxWaitingSeqs         int
	log                                    *log.Logger // access lines and warnings; nil: none
	// group is the model-parallel group (gotron serve
	// --tensor-model-parallel-size, --pipeline-model-parallel-size); nil:
	// one process.
	group *decodeGroup
}

// checkAdmission checks the admission flags before anything is loaded.
func (f *serveFlags) checkAdmission() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--read-timeout", f.readTimeout}, {"--write-timeout", f.writeTimeout}, {"--idle-timeout", f.idleTimeout}, {"--shutdown-grace", f.grace}} {
		if d.v < 0 {
			return fmt.Errorf("%s=%v: want a duration >= 0 (0: no limit)", d.name, d.v)
		}
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"--max-connections", f.maxConnections}, {"--max-waiting-seqs", f.maxWaitingSeqs}, {"--max-n", f.maxN}, {"--max-prompt-tokens", f.maxPromptTokens}} {
		if err := checked.NonNegative(c.name, int64(c.v)); err != nil {
			return err
		}
	}
	return checked.NonNegative("--max-request-bytes", f.maxRequestBytes)
}

func addServeFlags(fs *flag.FlagSet, f *serveFlags) {
	fs.StringVar(&f.load, "load", "", "checkpoint directory (gotron train --save) or Hugging Face directory")
	fs.StringVar(&f.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&f.port, "port", 8000, "port to listen on (0: any free port)")
	fs.StringVar(&f.modelName, "served-model-name", "", "model id in the API (default: the --load directory's name)")
	fs.StringVar(&f.chatTemplate, "chat-template", "", "Jinja chat template file (default: the tokenizer_config.json's, else the plain template)")
	fs.StringVar(&f.kvCacheBytes, "kv-cache-bytes", "", "KV cache pool, allocated at start, e.g. 2GiB (default: min(1GiB, --max-num-seqs full-context sequences); with gated delta net layers it also holds --max-num-seqs recurrent states, which the default adds)")
	fs.Float64Var(&f.kvCacheFraction, "kv-cache-memory-fraction", 0, "KV cache pool as this fraction (0 < F ≤ 0.95) of the memory available after loading the weights (MemAvailable in /proc/meminfo); excludes --kv-cache-bytes")
	fs.IntVar(&f.engine.BlockTokens, "block-size", 16, "tokens per KV cache block")
	fs.IntVar(&f.engine.MaxNumBatchedTokens, "max-num-batched-tokens", 512, "tokens per forward step: decode tokens plus prefill chunks")
	fs.IntVar(&f.engine.MaxNumSeqs, "max-num-seqs", 256, "sequences batched at once")
	fs.BoolVar(&f.noPrefixCaching, "no-enable-prefix-caching", false, "turn off the reuse of cached prompt blocks")
	fs.StringVar(&f.decodeWeights, "decode-weights", "packed", "how decode steps read the linear weights: packed (a copy packed once for the GEMM kernels: faster) or model (the model's own, through the general GEMM: gotron generate's arithmetic on every CPU)")
	fs.BoolVar(&f.cacheLatents, "cache-mla-latents", false, cacheMLALatentsUsage)
	fs.BoolVar(&f.bf16, "bf16", false, "serve bfloat16 weights: every weight rounded to bf16 (to nearest even; exact for bf16 checkpoints) and the packed copy stored in bf16, half the bytes per decode step; activations and sums stay float32 (as gotron generate --bf16)")
	fs.Int64Var(&f.maxRequestBytes, "max-request-bytes", 1<<20, "largest request body (413 beyond)")
	fs.IntVar(&f.maxPromptTokens, "max-prompt-tokens", 0, "longest prompt in tokens, 413 beyond (default: the model's context)")
	fs.IntVar(&f.maxN, "max-n", 16, "largest n (choices) per request")
	fs.DurationVar(&f.grace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long requests in flight may take before they are cancelled")
	fs.DurationVar(&f.readTimeout, "read-timeout", 30*time.Second, "how long a client may take to send a request's headers, and again its body (408 and the connection closed beyond; 0: no limit)")
	fs.DurationVar(&f.writeTimeout, "write-timeout", 30*time.Second, "how long each write of an answer (a JSON answer, one streamed event) may wait for the client to read: a client that stops reading is cut off and its request cancelled (0: no limit)")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 60*time.Second, "how long an idle keep-alive connection is kept open (0: no limit)")
	fs.IntVar(&f.maxConnections, "max-connections", 1024, "connections open at once; one more is answered 503 (too_many_connections) and closed (0: no limit)")
	fs.IntVar(&f.maxWaitingSeqs, "max-waiting-seqs", 1024, "sequences that may wait beyond the --max-num-seqs running; a request that would queue more is answered 429 (queue_full) (0: no limit)")
	fs.StringVar(&f.device, "device", "cpu", deviceUsage)
	fs.Float64Var(&f.memFraction, "device-memory-fraction", 0, memFractionUsage)
	addTokenizerFlags(fs, &f.tok)
}

func cmdServe(ctx context.Context, env *cli, args []string) error {
	var f serveFlags
	fs := newFlags("serve", serveSynopsis)
	addServeFlags(fs, &f)
	disableLog := fs.Bool("disable-log-requests", false, "write no access line per request (method, path, status, duration, tokens) and no warning about ignored request fields")
	tpSize := fs.Int("tensor-model-parallel-size", 1, "split the model over this many ranks started by gotron launch (or torchrun, srun, mpirun), as training splits it; rank 0 serves HTTP, the others step with it")
	ppSize := fs.Int("pipeline-model-parallel-size", 1, "split the layers evenly into this many pipeline stages, one rank each (times --tensor-model-parallel-size ranks in all); rank 0 serves HTTP, the last stage draws the tokens for all")
	epSize, etpSize := expertParallelFlags(fs)
	if err := parseFlags(fs, args, env.stdout, serveSynopsis); err != nil {
		return err
	}
	if f.load == "" {
		return fmt.Errorf("--load is required")
	}
	group, closeGroup, err := joinDecodeGroup(ctx, env, decodeLayout{tp: *tpSize, pp: *ppSize, ep: *epSize, etp: *etpSize}, 0, args)
	if err != nil {
		return err
	}
	defer closeGroup()
	f.group = group
	if !*disableLog {
		f.log = log.New(env.stdout, "gotron serve: ", 0)
	}
	since := tensor.SimTransfers()
	srv, runner, err := newServer(&f, env.stderr)
	if err != nil {
		return err
	}
	if !group.leader() {
		// A follower steps with rank 0 until rank 0 closes (its shutdown
		// included: the launcher's SIGTERM does not stop a follower, whose
		// leader may still be draining requests) or is lost.
		me := group.world.Rank()
		fmt.Fprintf(env.stderr, "gotron serve: %s rank %d of %d: stepping with rank 0, which serves HTTP\n", group.kind(), me, group.world.Size())
		if err := infer.Follow(context.WithoutCancel(ctx), runner.Engine(), group.world); err != nil {
			return err
		}
		fmt.Fprintf(env.stderr, "gotron serve: %s rank %d: rank 0 stopped\n", group.kind(), me)
		return nil
	}
	if dev, _ := parseDevice(f.device, f.memFraction); dev == tensor.Sim {
		defer reportTransfers(env.stderr, "serve", dev, since)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		return fmt.Errorf("--host/--port: %w", err)
	}
	cfg := runner.Engine().Config()
	st := runner.Stats()
	fmt.Fprintf(env.stdout, "gotron serve: model %q (--served-model-name) from %s: %d KV blocks of %d tokens (%d positions), up to %d sequences, %d tokens per step, decode weights: %s, GOGC %d\n",
		srv.ModelName(), f.load, st.KVBlocksTotal, cfg.BlockTokens, st.KVBlocksTotal*cfg.BlockTokens, cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens, weightsDescription(runner.Engine()), gcPercent())
	if b := runner.Engine().StateBytes(); b > 0 {
		fmt.Fprintf(env.stdout, "gotron serve: gated delta net layers: %d recurrent-state slots (--max-num-seqs) of %d bytes, %d KiB of --kv-cache-bytes; prefix caching off\n",
			cfg.MaxNumSeqs, b/int64(cfg.MaxNumSeqs), b>>10)
	}
	fmt.Fprintf(env.stdout, "gotron serve: listening on http://%s\n", ln.Addr())
	hs, ln := httpServer(&f, srv, ln)
	return serve(ctx, env, hs, srv, runner, ln, f.grace)
}

// httpServer returns the HTTP server of srv with f's timeouts, and ln
// limited to f's connections. The body and write timeouts are srv's own
// (server.Config): http.Server's ReadTimeout and WriteTimeout would also
// bound a long streamed answer.
func httpServer(f *serveFlags, srv *server.Server, ln net.Listener) (*http.Server, net.Listener) {
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: f.readTimeout, IdleTimeout: f.idleTimeout}
	if f.maxConnections > 0 {
		ln = server.LimitConnections(ln, f.maxConnections)
	}
	return hs, ln
}

// newServer loads the model and tokenizer and builds the engine, its runner
// and the HTTP server (the runner is not started).
func newServer(f *serveFlags, stderr io.Writer) (*server.Server, *infer.Runner, error) {
	m, tokDir, err := loadForDecoding(f.load, f.group)
	if err != nil {
		return nil, nil, err
	}
	tok, err := checkpointTokenizer(f.tok, tokDir, m.Config.VocabSize, f.load, stderr)
	if err != nil {
		return nil, nil, err
	}
	var tpl *server.ChatTemplate
	if f.chatTemplate != "" {
		tpl, err = loadTemplateFile(f.chatTemplate, tokDir)
	} else {
		tpl, err = server.LoadChatTemplate(tokDir)
	}
	if err != nil {
		return nil, nil, err
	}
	return buildServer(f, m, tok, tpl)
}

// kvPoolFromFraction is --kv-cache-memory-fraction: that fraction of the
// memory the kernel reports available now (the weights are loaded), from
// machine (meminfo.Read).
func kvPoolFromFraction(frac float64, haveBytes bool, machine func() (meminfo.Info, bool)) (int64, error) {
	switch {
	case haveBytes:
		return 0, fmt.Errorf("set one of --kv-cache-bytes and --kv-cache-memory-fraction")
	case !(frac > 0 && frac <= 0.95):
		return 0, fmt.Errorf("--kv-cache-memory-fraction=%g: want 0 < F ≤ 0.95 (the rest is for activations, the runtime and the OS)", frac)
	}
	mem, ok := machine()
	if !ok || mem.AvailableBytes <= 0 {
		return 0, fmt.Errorf("--kv-cache-memory-fraction: cannot read the available memory from %s (use --kv-cache-bytes)", meminfo.Path)
	}
	return int64(frac * float64(mem.AvailableBytes)), nil
}

// buildServer builds the engine for m, its runner and the HTTP server.
func buildServer(f *serveFlags, m *gpt.Model, tok tokenizer.Tokenizer, tpl *server.ChatTemplate) (*server.Server, *infer.Runner, error) {
	if err := f.checkAdmission(); err != nil {
		return nil, nil, err
	}
	var err error
	ec := f.engine
	ec.DisablePrefixCaching = f.noPrefixCaching
	if ec.Weights, err = infer.ParseWeightLayout(f.decodeWeights); err != nil {
		return nil, nil, fmt.Errorf("--decode-weights: %w", err)
	}
	dev, err := parseDevice(f.device, f.memFraction)
	if err != nil {
		return nil, nil, err
	}
	if f.bf16 {
		m.RoundToBF16()
		ec.BF16 = true
	}
	if err := m.Config.CheckDevice(dev); err != nil {
		return nil, nil, err
	}
	if err := m.Config.CheckDecode(); err != nil {
		return nil, nil, err
	}
	dm, err := shardForDecoding(m, f.group)
	if err != nil {
		return nil, nil, err
	}
	m = dm.m
	if err := applyCacheMLALatents(m, f.cacheLatents, f.load); err != nil {
		return nil, nil, err
	}
	m.ToDevice(dev) // the engine's KV pool and packed weights follow the model
	ec.VocabSize, ec.Decoder = tok.VocabSize(), tok
	if ec.VocabSize > m.Config.VocabSize {
		return nil, nil, fmt.Errorf("the tokenizer's %d ids exceed the model's vocabulary of %d", ec.VocabSize, m.Config.VocabSize)
	}
	if f.kvCacheBytes != "" {
		if ec.KVCacheBytes, err = parseByteSize(f.kvCacheBytes); err != nil {
			return nil, nil, fmt.Errorf("--kv-cache-bytes: %w", err)
		}
	}
	if f.kvCacheFraction != 0 {
		if ec.KVCacheBytes, err = kvPoolFromFraction(f.kvCacheFraction, f.kvCacheBytes != "", meminfo.Read); err != nil {
			return nil, nil, err
		}
		// The packed weights are allocated after this reading.
		if ec.KVCacheBytes -= infer.PackedBytes(m, ec); ec.KVCacheBytes <= 0 {
			return nil, nil, fmt.Errorf("--kv-cache-memory-fraction=%g leaves no memory for the KV cache beside the packed weights (%d MB)", f.kvCacheFraction, infer.PackedBytes(m, ec)>>20)
		}
	}
	e, err := dm.newEngine(context.Background(), ec)
	if err != nil {
		return nil, nil, err
	}
	tuneGCForServing()
	runner := infer.NewRunner(e)
	if f.group != nil && f.group.leader() {
		ls, err := infer.NewLockstep(context.Background(), e, f.group.world)
		if err != nil {
			return nil, nil, err
		}
		runner = infer.NewLockstepRunner(ls, 0)
	}
	name := f.modelName
	if name == "" {
		name = filepath.Base(filepath.Clean(f.load))
	}
	srv, err := server.New(server.Config{Runner: runner, Tokenizer: tok, ModelName: name, ChatTemplate: tpl,
		MaxRequestBytes: f.maxRequestBytes, MaxPromptTokens: f.maxPromptTokens, MaxN: f.maxN,
		MaxWaitingSeqs: f.maxWaitingSeqs, ReadTimeout: f.readTimeout, WriteTimeout: f.writeTimeout, Log: f.log})
	return srv, runner, err
}

// gcHeadroom is how far a serving process's heap may grow over its live
// heap before a collection: several steps' activations at the batch sizes
// served here (a GPT-2 124M step of 32 sequences allocates ~25 MB).
const gcHeadroom = 256 << 20

// servingGCPercent is the GOGC value that lets a heap of live bytes grow
// by about gcHeadroom, between 10 and Go's default 100. A served model's
// heap is mostly its weights, so the default lets the short-lived
// activations of the steps take as much fresh memory again as the weights
// before a collection, and every page of it is first faulted in and zeroed
// by the kernel: with GPT-2 124M (1 GB of model and packed weights) a
// 32-sequence step took 89 ms under GOGC=100 and 70 ms under 25, with two
// thirds of the page faults gone. Collections cost little here: the
// weights hold no pointers.
func servingGCPercent(live int64) int {
	if live <= 0 {
		return 100
	}
	return int(min(100, max(10, (100*gcHeadroom+live-1)/live)))
}

// tuneGCForServing sets servingGCPercent of the live heap after the model
// and engine are built, unless the user set GOGC.
func tuneGCForServing() {
	if os.Getenv("GOGC") != "" {
		return
	}
	runtime.GC() // the loading's garbage out of the live heap
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	live := int64(0)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		live = int64(sample[0].Value.Uint64())
	}
	debug.SetGCPercent(servingGCPercent(live))
}

// gcPercent returns the GOGC percentage in force.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// weightsDescription says how decode steps read the weights, for the
// start-up line.
func weightsDescription(e *infer.Engine) string {
	cfg := e.Config()
	dtype := "float32"
	if cfg.BF16 {
		dtype = "bfloat16"
	}
	if cfg.Weights == infer.WeightsModel {
		return "the model's (" + dtype + " values)"
	}
	return fmt.Sprintf("packed %s (%d MB)", dtype, e.PackedWeightBytes()>>20)
}

// loadTemplateFile reads a --chat-template file, with the special tokens of
// the tokenizer directory's tokenizer_config.json when it has one.
func loadTemplateFile(path, tokDir string) (*server.ChatTemplate, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--chat-template: %w", err)
	}
	bos, eos := "", ""
	if t, err := server.LoadChatTemplate(tokDir); err == nil && t != nil {
		bos, eos = t.SpecialTokens()
	}
	return server.ParseChatTemplate(string(src), bos, eos)
}

// answerGrace bounds how long, after the shutdown grace period, the
// handlers of cancelled requests may take to write their error answers.
const answerGrace = 5 * time.Second

// serve runs the runner and the HTTP server on ln until ctx ends (SIGTERM or
// SIGINT), then shuts down gracefully: /health turns 503, the listener
// closes, requests in flight get up to grace to finish, and whatever is
// left is cancelled.
func serve(ctx context.Context, env *cli, hs *http.Server, srv *server.Server, runner *infer.Runner, ln net.Listener, grace time.Duration) error {
	runCtx, stopRunner := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	var runErr error
	go func() { runErr = runner.Run(runCtx); close(runDone) }()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
	case <-runDone:
		// Only a model-parallel group's failure ends the runner first
		// (a rank lost): no request can run any more.
		err = fmt.Errorf("the model-parallel group failed: %w", runErr)
		fmt.Fprintf(env.stdout, "gotron serve: %v\n", err)
	}
	srv.Drain()
	fmt.Fprintf(env.stdout, "gotron serve: shutting down (grace %v, %d requests running, %d waiting)\n", grace, runner.Stats().Running, runner.Stats().Waiting)
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if shutErr := hs.Shutdown(graceCtx); shutErr != nil {
		// Past the grace period: stopping the runner ends every request
		// left with infer.ErrClosed; its handler answers (a stream gets an
		// error event, others a 503) and returns, and only then are the
		// connections closed. A client that does not read its answer gets
		// answerGrace, then its connection is closed under it.
		stopRunner()
		<-runDone
		answerCtx, cancelAnswer := context.WithTimeout(context.Background(), answerGrace)
		defer cancelAnswer()
		hs.Shutdown(answerCtx)
		hs.Close()
	}
	stopRunner()
	<-runDone
	fmt.Fprintln(env.stdout, "gotron serve: stopped")
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
