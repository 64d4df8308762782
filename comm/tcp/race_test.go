//go:build race

package tcp_test

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// pooled paths allocate under it.
const raceEnabled = true
