// Package meminfo reads how much memory the machine has, so that commands
// can refuse a job whose estimated footprint cannot fit before allocating
// it (a Go program that runs out of memory dies with a fatal error and a
// goroutine dump, not an error it can report).
//
// The numbers come from Linux's /proc/meminfo. Where that file is absent
// (other systems) Read reports ok == false and callers skip their check. A
// container's cgroup memory limit is not consulted: /proc/meminfo shows the
// host's memory, so a limit below it can still end a job that passes.
package meminfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Path is where Linux publishes the machine's memory figures.
const Path = "/proc/meminfo"

// Info is the machine's memory.
type Info struct {
	// TotalBytes is MemTotal: the physical memory the kernel manages.
	TotalBytes int64
	// AvailableBytes is MemAvailable: what new allocations can get without
	// swapping. Kernels older than 3.14 lack it; Parse then uses
	// MemFree + Buffers + Cached.
	AvailableBytes int64
}

// Read parses /proc/meminfo. ok is false where the file cannot be read or
// parsed (not Linux): there is nothing to compare an estimate with.
func Read() (info Info, ok bool) {
	f, err := os.Open(Path)
	if err != nil {
		return Info{}, false
	}
	defer f.Close()
	info, err = Parse(f)
	return info, err == nil
}

// Parse reads the "Key: value kB" lines of a /proc/meminfo file.
func Parse(r io.Reader) (Info, error) {
	kb := map[string]int64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v *= 1024
		}
		kb[key] = v
	}
	if err := sc.Err(); err != nil {
		return Info{}, fmt.Errorf("meminfo: %w", err)
	}
	total, ok := kb["MemTotal"]
	if !ok || total <= 0 {
		return Info{}, fmt.Errorf("meminfo: no MemTotal line")
	}
	avail, ok := kb["MemAvailable"]
	if !ok {
		avail = kb["MemFree"] + kb["Buffers"] + kb["Cached"]
	}
	return Info{TotalBytes: total, AvailableBytes: avail}, nil
}

// Fits reports whether needBytes fit in the available memory. The zero
// Info (nothing known) fits everything.
func (i Info) Fits(needBytes float64) bool {
	return i.TotalBytes == 0 || needBytes <= float64(i.AvailableBytes)
}

// CheckFloat32Import refuses a model import whose float32 parameters
// (params of them) plus the largest source tensor being converted
// (largest elements) do not fit in the memory machine reports (Read when
// nil; no check where it is unknown). The error says what model describes
// (e.g. "the float32 model of config.json") and what it needs.
func CheckFloat32Import(machine func() (Info, bool), params, largest float64, model string) error {
	if machine == nil {
		machine = Read
	}
	mem, ok := machine()
	if !ok {
		return nil
	}
	need := 4 * (params + largest)
	if mem.Fits(need) {
		return nil
	}
	return fmt.Errorf("%s (%.4g billion parameters) needs at least %s but this machine has %s", model, params/1e9, FormatBytes(need), mem)
}

// String describes the machine for error messages:
// "23.0 GB available of 23.5 GB (/proc/meminfo)".
func (i Info) String() string {
	return fmt.Sprintf("%s available of %s (%s)", FormatBytes(float64(i.AvailableBytes)), FormatBytes(float64(i.TotalBytes)), Path)
}

// FormatBytes writes a byte count in GB (10^9 bytes), or TB or MB where
// GB would read badly.
func FormatBytes(b float64) string {
	switch {
	case b >= 1e13:
		return fmt.Sprintf("%.3g TB", b/1e12)
	case b >= 1e9:
		return fmt.Sprintf("%.1f GB", b/1e9)
	default:
		return fmt.Sprintf("%.1f MB", b/1e6)
	}
}
