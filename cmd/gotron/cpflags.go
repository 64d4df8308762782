package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/train"
)

// Context parallelism's flags beside --context-parallel-size (train.go):
// --cp-comm-type and --hierarchical-context-parallel-sizes.

// cpCommFlag is --cp-comm-type, parsed by cp.ParseCommType.
type cpCommFlag struct{ t *cp.CommType }

func (f cpCommFlag) String() string {
	if f.t == nil {
		return cp.P2P.String()
	}
	return f.t.String()
}

func (f cpCommFlag) Set(s string) error {
	t, err := cp.ParseCommType(s)
	if err != nil {
		return err
	}
	*f.t = t
	return nil
}

// cpFlags are the context-parallel flags of train.
type cpFlags struct {
	hierarchical listFlag // --hierarchical-context-parallel-sizes A P
}

// add registers the flags on fs, into c.
func (f *cpFlags) add(fs *flag.FlagSet, c *train.Config) {
	fs.Var(cpCommFlag{&c.CPCommType}, "cp-comm-type", "with --context-parallel-size > 1, attention's communication: p2p (ring attention, key/value exchange overlapped with compute), all_gather, a2a (heads and query groups divisible by the CP size) or a2a+p2p (hierarchical, with --hierarchical-context-parallel-sizes)")
	fs.Var(&f.hierarchical, "hierarchical-context-parallel-sizes", "A P: with --cp-comm-type a2a+p2p, a2a within groups of A consecutive CP ranks, then ring attention over P; A·P must be --context-parallel-size")
}

// apply parses the list flag into c.
func (f *cpFlags) apply(c *train.Config) error {
	c.HierarchicalCPSizes = nil
	for _, v := range f.hierarchical.values {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("--hierarchical-context-parallel-sizes %s: want integers", f.hierarchical.String())
		}
		c.HierarchicalCPSizes = append(c.HierarchicalCPSizes, n)
	}
	return nil
}

// printContextParallel prints the context-parallel layout (nothing at CP=1).
func printContextParallel(w io.Writer, size int, c train.Config) {
	if size > 1 {
		fmt.Fprintf(w, "gotron train: context-parallel size %d (--cp-comm-type %v): each rank holds 2 chunks of %d tokens of every sequence\n",
			size, c.CPCommType, c.SeqLength/(2*size))
	}
}
