package comm

import (
	"errors"
	"fmt"
)

// Sentinel errors, checked with errors.Is.
var (
	// ErrPeerLost means a rank stopped taking part: its process died, its
	// connection broke, it was killed by a test hook, or it abandoned a
	// collective (its context ended).
	ErrPeerLost = errors.New("peer lost")
	// ErrTimeout means a collective did not complete within the group's
	// timeout; the RankError names a rank that had not arrived.
	ErrTimeout = errors.New("timeout")
	// ErrClosed means the group was closed.
	ErrClosed = errors.New("group closed")
	// ErrNotMember is returned by NewGroup to a caller not in the rank list.
	ErrNotMember = errors.New("not a member of the group")
	// ErrMismatch means ranks called a collective with incompatible
	// arguments (different ops, dtypes, lengths or roots).
	ErrMismatch = errors.New("mismatched collective arguments")
)

// RankError reports a failed collective and the rank it blames: the rank
// that died, timed out or disagreed. Rank is a world rank (the rank in the
// group every backend starts with), so it names the same process whatever
// sub-group the operation ran on.
type RankError struct {
	Rank int    // world rank blamed
	Op   string // operation, e.g. "all_reduce"
	Err  error  // cause; wraps ErrPeerLost, ErrTimeout, ErrClosed or ErrMismatch
}

// Error returns e.g. "comm: all_reduce: rank 3: peer lost: connection reset".
func (e *RankError) Error() string {
	return fmt.Sprintf("comm: %s: rank %d: %v", e.Op, e.Rank, e.Err)
}

// Unwrap returns the cause.
func (e *RankError) Unwrap() error { return e.Err }

func errorf(format string, args ...any) error {
	return fmt.Errorf("comm: "+format, args...)
}
