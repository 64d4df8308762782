package server

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
)

// metrics are the server's Prometheus series, written in the text
// exposition format (version 0.0.4) by hand.
type metrics struct {
	mu       sync.Mutex        // protects requests
	requests map[[2]string]int // (endpoint, status code) → count

	promptTokens     atomic.Int64
	generationTokens atomic.Int64
	ttft, itl, e2e   *histogram
}

func newMetrics() *metrics {
	lat := []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40}
	return &metrics{requests: map[[2]string]int{},
		ttft: newHistogram(lat), itl: newHistogram(lat),
		e2e: newHistogram([]float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160})}
}

func (m *metrics) request(endpoint string, status int) {
	m.mu.Lock()
	m.requests[[2]string{endpoint, strconv.Itoa(status)}]++
	m.mu.Unlock()
}

// histogram is a Prometheus histogram with fixed upper bounds.
type histogram struct {
	mu     sync.Mutex // protects the fields below
	bounds []float64
	counts []uint64 // per bound, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

func (h *histogram) write(w io.Writer, name, help string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", name, formatFloat(b), cum)
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n", name, h.n, name, formatFloat(h.sum), name, h.n)
}

func formatFloat(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func (s *Server) metricsHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m := s.metrics
	st := s.cfg.Runner.Stats()
	fmt.Fprintf(w, "# HELP gotron_requests_total HTTP requests by endpoint and status code.\n# TYPE gotron_requests_total counter\n")
	m.mu.Lock()
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(w, "gotron_requests_total{endpoint=%q,code=%q} %d\n", k[0], k[1], m.requests[k])
	}
	m.mu.Unlock()
	counter := func(name, help string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge := func(name, help string, v int) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter("gotron_prompt_tokens_total", "Prompt tokens of requests accepted.", m.promptTokens.Load())
	counter("gotron_generation_tokens_total", "Tokens generated and delivered.", m.generationTokens.Load())
	counter("gotron_engine_steps_total", "Batched forward steps.", st.Steps)
	counter("gotron_engine_batched_tokens_total", "Tokens run through the model (prefill and decode).", st.BatchedTokens)
	counter("gotron_preemptions_total", "Sequences preempted for KV blocks and recomputed later.", st.Preemptions)
	counter("gotron_prefix_cache_hit_tokens_total", "Prompt tokens whose KV blocks came from the prefix cache.", st.PrefixCacheHitTokens)
	gauge("gotron_queue_depth", "Requests waiting for admission.", st.Waiting)
	gauge("gotron_running_sequences", "Sequences in the running batch.", st.Running)
	gauge("gotron_kv_blocks_used", "KV cache blocks held by sequences.", st.KVBlocksUsed)
	gauge("gotron_kv_blocks_cached", "Free KV cache blocks kept for prefix reuse.", st.KVBlocksCached)
	gauge("gotron_kv_blocks_total", "KV cache blocks in the pool.", st.KVBlocksTotal)
	m.ttft.write(w, "gotron_time_to_first_token_seconds", "Time from request arrival to its first generated token.")
	m.itl.write(w, "gotron_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.")
	m.e2e.write(w, "gotron_request_duration_seconds", "Time from request arrival to its last token.")
}
