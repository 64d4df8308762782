package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm/commbench"
)

// checkCommTables parses the report's tables and checks every op of ops
// has rows whose algbw = size/time and busbw = algbw·f(op, n) (to print
// precision).
func checkCommTables(t *testing.T, out string, n int, ops []string) {
	t.Helper()
	rows := map[string]int{}
	op := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "#" && !strings.Contains(f[1], "("):
			op = f[1]
		case len(f) == 6 && !strings.HasPrefix(line, "#"):
			size, _ := strconv.ParseFloat(f[0], 64)
			us, _ := strconv.ParseFloat(f[3], 64)
			alg, _ := strconv.ParseFloat(f[4], 64)
			bus, _ := strconv.ParseFloat(f[5], 64)
			if us <= 0 {
				t.Errorf("%s: time %v in %q", op, us, line)
				continue
			}
			if want := size / us / 1e3; math.Abs(alg-want) > 0.0015+want*(0.01+0.0006/us) {
				t.Errorf("%s: algbw %v, size/time = %v in %q", op, alg, want, line)
			}
			if want := alg * commbench.BusFactor(op, n); math.Abs(bus-want) > 0.002+0.001*want {
				t.Errorf("%s: busbw %v, want algbw·f = %v in %q", op, bus, want, line)
			}
			rows[op]++
		}
	}
	for _, o := range ops {
		if rows[o] == 0 {
			t.Errorf("no rows for %s in:\n%s", o, out)
		}
	}
}

func TestBenchCommInproc(t *testing.T) {
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code := run(t.Context(), env, []string{"bench", "comm", "--backend", "inproc", "--nproc", "3", "--ops", "all",
		"--min-bytes", "64", "--max-bytes", "16K", "--time-per-size", "0.001", "--memcpy-bytes", "1M"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"backend inproc, 3 ranks", "# memcpy:", "# all_reduce busbw at 16384 bytes:", "of memcpy"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	checkCommTables(t, s, 3, commbench.Ops)
}

// TestBenchCommUnderLauncher runs the command as rank 0 of a one-rank tcp
// job, as it runs under gotron launch (WORLD_SIZE set).
func TestBenchCommUnderLauncher(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	vars := map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	code := run(t.Context(), env, []string{"bench", "comm", "--backend", "tcp", "--ops", "all_reduce,broadcast",
		"--max-bytes", "1K", "--time-per-size", "0.001", "--memcpy-bytes", "1M", "--loopback-bytes", "4M"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "backend tcp, 1 ranks") || !strings.Contains(out.String(), "# loopback TCP, one stream:") {
		t.Errorf("output:\n%s", out.String())
	}
	checkCommTables(t, out.String(), 1, []string{"all_reduce", "broadcast"})
}

var buildGotronForComm = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gotron-comm-test")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gotron")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/gotron: %v\n%s", err, out)
	}
	return bin, nil
})

// TestBenchCommTCPProcesses runs the real binary, which starts 3 rank
// processes of itself over loopback.
func TestBenchCommTCPProcesses(t *testing.T) {
	bin, err := buildGotronForComm()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "bench", "comm", "--backend", "tcp", "--nproc", "3", "--ops", "all",
		"--min-bytes", "64", "--max-bytes", "256K", "--time-per-size", "0.001", "--memcpy-bytes", "1M",
		"--loopback-bytes", "8M", "--timeout", "60s")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, errb.String())
	}
	s := out.String()
	for _, want := range []string{"backend tcp, 3 ranks", "# loopback TCP, one stream:", "of loopback TCP"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	checkCommTables(t, s, 3, commbench.Ops)
}

// TestBenchCommTCPRankFails: rank 0 cannot serve the store (the port is
// taken), so it exits; the command must stop rank 1 at once (not after its
// 5-minute timeout) and name rank 0.
func TestBenchCommTCPRankFails(t *testing.T) {
	bin, err := buildGotronForComm()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "comm", "--backend", "tcp", "--nproc", "2", "--master-port", port, "--timeout", "5m")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("still running after 60s: rank 1 was not stopped; stderr:\n%s", errb.String())
	}
	if err == nil || !strings.Contains(errb.String(), "rank 0") || !strings.Contains(errb.String(), "address already in use") {
		t.Errorf("exit %v, stderr:\n%s\nwant a failure naming rank 0 and the busy address", err, errb.String())
	}
}

func TestBenchCommBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "nccl"}, `--backend "nccl": want inproc or tcp`},
		{[]string{"--ops", "all_reduce,allgather"}, `unknown op "allgather"`},
		{[]string{"--max-bytes", "12Q"}, `--max-bytes "12Q"`},
		{[]string{"--min-bytes", "1M", "--max-bytes", "1K"}, "larger than --max-bytes"},
		{[]string{"--nproc", "0"}, "--nproc 0"},
		{[]string{"--time-per-size", "0"}, "--time-per-size 0"},
		{[]string{"--nproc-per-node", "2"}, "unknown flag --nproc-per-node"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		env := &cli{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
		if code := run(t.Context(), env, append([]string{"bench", "comm"}, c.args...)); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errb.String(), c.want)
		}
	}
}

func TestBenchCommInprocUnderLauncher(t *testing.T) {
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "WORLD_SIZE" {
			return "4"
		}
		return ""
	}}
	if code := run(t.Context(), env, []string{"bench", "comm", "--backend", "inproc"}); code == 0 || !strings.Contains(errb.String(), "use --backend tcp") {
		t.Errorf("exit %d, stderr %q; want an error pointing to --backend tcp", code, errb.String())
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int{"8": 8, "64K": 64 << 10, "256M": 256 << 20, "1G": 1 << 30, "4MiB": 4 << 20, "2kb": 2 << 10} {
		if got, err := parseBytes("x", in); got != want || err != nil {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "M", "1T", "1.5M"} {
		if _, err := parseBytes("x", bad); err == nil {
			t.Errorf("parseBytes(%q): no error", bad)
		}
	}
}
