package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds the expansion of a hostlist, so a typo like node[1-99999999]
// is an error rather than a gigabyte of strings.
const maxHosts = 1 << 20

// ParseHostlist expands a Slurm compressed hostlist such as
// "node[01-04,07],gpu-a[1-2]" into host names, in order: node01 node02 node03
// node04 node07 gpu-a1 gpu-a2. Zero padding follows the lower bound of each
// range ("[08-10]" gives 08 09 10). A name may hold several bracket
// expressions ("r[1-2]n[1-2]" gives r1n1 r1n2 r2n1 r2n2, the last varying
// fastest).
func ParseHostlist(s string) ([]string, error) {
	var hosts []string
	for _, item := range splitTop(s) {
		if item == "" {
			return nil, fmt.Errorf("launch: hostlist %q: empty host name", s)
		}
		exp, err := expandHost(item)
		if err != nil {
			return nil, fmt.Errorf("launch: hostlist %q: %w", s, err)
		}
		hosts = append(hosts, exp...)
		if len(hosts) > maxHosts {
			return nil, fmt.Errorf("launch: hostlist %q: more than %d hosts", s, maxHosts)
		}
	}
	return hosts, nil
}

// splitTop splits s at commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// expandHost expands one host pattern with zero or more bracket expressions.
func expandHost(p string) ([]string, error) {
	open := strings.IndexByte(p, '[')
	if open < 0 {
		if strings.ContainsRune(p, ']') {
			return nil, fmt.Errorf("%q: ']' without '['", p)
		}
		return []string{p}, nil
	}
	end := strings.IndexByte(p[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", p)
	}
	end += open
	prefix, body, rest := p[:open], p[open+1:end], p[end+1:]
	if strings.ContainsRune(prefix, ']') || strings.ContainsRune(body, '[') {
		return nil, fmt.Errorf("%q: unbalanced brackets", p)
	}
	nums, err := expandRanges(body)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", p, err)
	}
	tails, err := expandHost(rest)
	if err != nil {
		return nil, err
	}
	if len(nums)*len(tails) > maxHosts {
		return nil, fmt.Errorf("%q: more than %d hosts", p, maxHosts)
	}
	out := make([]string, 0, len(nums)*len(tails))
	for _, n := range nums {
		for _, t := range tails {
			out = append(out, prefix+n+t)
		}
	}
	return out, nil
}

// expandRanges expands "01-04,07" into 01 02 03 04 07.
func expandRanges(body string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.Atoi(lo)
		b, errB := strconv.Atoi(hi)
		if lo == "" || hi == "" || errA != nil || errB != nil || a < 0 || strings.HasPrefix(hi, "+") || strings.HasPrefix(lo, "+") {
			return nil, fmt.Errorf("bad range %q (want N or N-M with digits)", r)
		}
		if b < a {
			return nil, fmt.Errorf("range %q runs backwards", r)
		}
		if b-a >= maxHosts {
			return nil, fmt.Errorf("range %q has more than %d hosts", r, maxHosts)
		}
		for i := a; i <= b; i++ {
			out = append(out, fmt.Sprintf("%0*d", len(lo), i))
		}
	}
	return out, nil
}

// parseTasksPerNode expands Slurm's SLURM_TASKS_PER_NODE ("2(x3),1") into one
// count per node: 2 2 2 1.
func parseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(s, ",") {
		n, rep := item, "1"
		if i := strings.IndexByte(item, '('); i >= 0 {
			if !strings.HasPrefix(item[i:], "(x") || !strings.HasSuffix(item, ")") {
				return nil, fmt.Errorf("bad item %q (want N or N(xM))", item)
			}
			n, rep = item[:i], item[i+2:len(item)-1]
		}
		c, err1 := strconv.Atoi(n)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 1 || r < 1 || r > maxHosts || len(out)+r > maxHosts {
			return nil, fmt.Errorf("bad item %q (want N or N(xM), positive)", item)
		}
		for range r {
			out = append(out, c)
		}
	}
	return out, nil
}
