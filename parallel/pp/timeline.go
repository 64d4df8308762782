package pp

import (
	"fmt"
	"io"
	"strings"
)

// Span is one forward or backward pass placed on a time axis. The zero value
// is an empty span at time 0.
type Span struct {
	Action Action // a Forward or Backward
	Start  int    // first time unit the pass runs in
	End    int    // first time unit after it: Start + its duration
}

// Timeline places every rank's forward and backward passes in time, for
// pictures like the schedule figures of Megatron's papers. Each forward of
// a chunk takes forwardUnits and each backward backwardUnits (both must be
// positive); a pass starts as soon as the rank's previous pass has ended
// and its input (the previous stage's activation, or the next stage's
// gradient) exists. Communication takes no time and sends never hold up
// their sender, so this is the schedule's ideal timing; an executor whose
// sends wait for the receiver can only be later. Result [r] lists rank r's
// passes in the order of Actions(cfg, r).
func Timeline(cfg Config, forwardUnits, backwardUnits int) ([][]Span, error) {
	if forwardUnits <= 0 || backwardUnits <= 0 {
		return nil, fmt.Errorf(errPrefix+"timeline: forward %d and backward %d time units: want both positive",
			forwardUnits, backwardUnits)
	}
	lists, err := Schedule(cfg)
	if err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	stages := c.PP * c.VPP
	type key struct {
		stage, mb int
		bwd       bool
	}
	end := map[key]int{} // finished passes, by virtual stage
	out := make([][]Span, c.PP)
	pcs := make([]int, c.PP)
	clock := make([]int, c.PP)
	for progress := true; progress; {
		progress = false
		for r, list := range lists {
			for pcs[r] < len(list) {
				a := list[pcs[r]]
				if !a.Op.Compute() {
					pcs[r]++
					continue
				}
				s := a.Chunk*c.PP + r
				ready, dur := 0, forwardUnits
				dep, need := key{s - 1, a.Microbatch, false}, s > 0
				if a.Op == Backward {
					dur = backwardUnits
					dep, need = key{s + 1, a.Microbatch, true}, s < stages-1
					ready = end[key{s, a.Microbatch, false}]
				}
				if need {
					t, ok := end[dep]
					if !ok {
						break // wait for the neighbour stage
					}
					ready = max(ready, t)
				}
				start := max(clock[r], ready)
				clock[r] = start + dur
				end[key{s, a.Microbatch, a.Op == Backward}] = clock[r]
				out[r] = append(out[r], Span{Action: a, Start: start, End: clock[r]})
				pcs[r]++
				progress = true
			}
		}
	}
	for r, list := range lists {
		if pcs[r] < len(list) {
			// Unreachable for lists that pass the package's tests.
			return nil, fmt.Errorf(errPrefix+"timeline: rank %d stuck at %v", r, list[pcs[r]])
		}
	}
	return out, nil
}

// WriteTimeline draws Timeline(cfg, forwardUnits, backwardUnits) as text,
// one row per rank, like the schedule figures of Megatron's papers. Every
// time unit is a column of equal width. A forward fills one unit's column
// (forwardUnits of them) with its label, a backward its backwardUnits
// columns; "." marks an idle unit. Labels are F or B and the micro-batch,
// followed by the chunk as a letter (a for chunk 0, b for chunk 1, ...) when
// VPP > 1: "F3", "B3", "F3b". The first line states the schedule and the
// last the makespan and measured bubble.
func WriteTimeline(w io.Writer, cfg Config, forwardUnits, backwardUnits int) error {
	spans, err := Timeline(cfg, forwardUnits, backwardUnits)
	if err != nil {
		return err
	}
	c := cfg.withDefaults()
	label := func(a Action) string {
		s := fmt.Sprintf("%v%d", a.Op, a.Microbatch)
		switch {
		case c.VPP > 26:
			s += fmt.Sprintf(".%d", a.Chunk)
		case c.VPP > 1:
			s += string(rune('a' + a.Chunk))
		}
		return s
	}
	width, makespan := 0, 0
	for _, row := range spans {
		for _, sp := range row {
			width = max(width, len(label(sp.Action))+1)
			makespan = max(makespan, sp.End)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%v: PP=%d VPP=%d M=%d", c.Kind(), c.PP, c.VPP, c.Microbatches)
	if c.Kind() == Interleaved {
		fmt.Fprintf(&b, " G=%d", c.GroupSize)
	}
	fmt.Fprintf(&b, "; one column per time unit, forward %d, backward %d; \".\" idle\n", forwardUnits, backwardUnits)
	rowName := fmt.Sprintf("rank %d", c.PP-1)
	busy := 0
	for r, row := range spans {
		line := fmt.Sprintf("%-*s | ", len(rowName), fmt.Sprintf("rank %d", r))
		t := 0
		for _, sp := range row {
			for ; t < sp.Start; t++ {
				line += fmt.Sprintf("%-*s", width, ".")
			}
			line += fmt.Sprintf("%-*s", width*(sp.End-sp.Start), label(sp.Action))
			busy += sp.End - sp.Start
			t = sp.End
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	idle := makespan*c.PP - busy
	fmt.Fprintf(&b, "makespan %d units; idle %d of %d rank-units, bubble %d/%d = %.4g of compute ((PP-1)/(VPP*M) = %.4g)\n",
		makespan, idle, makespan*c.PP, idle, busy, float64(idle)/float64(busy),
		float64(c.PP-1)/float64(c.VPP*c.Microbatches))
	_, err = io.WriteString(w, b.String())
	return err
}
