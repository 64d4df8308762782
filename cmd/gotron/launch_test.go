package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/tensor"
)

// TestLaunchHelperWorker is not a test: it is the worker program that the
// launch tests start (the test binary itself, via --no-python) with
// GOTRON_LAUNCH_HELPER set to the behaviour wanted.
func TestLaunchHelperWorker(t *testing.T) {
	mode := os.Getenv("GOTRON_LAUNCH_HELPER")
	if mode == "" {
		return
	}
	e, err := launch.DetectEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	switch {
	case mode == "env":
		fmt.Printf("rank=%d local=%d world=%d node=%d/%d master=%s:%d source=%s\n",
			e.Rank, e.LocalRank, e.WorldSize, e.NodeRank, e.NNodes, e.MasterAddr, e.MasterPort, e.Source)
		os.Exit(0)
	case strings.HasPrefix(mode, "exit:"): // exit:RANK:CODE; the other ranks wait for SIGTERM
		parts := strings.Split(mode, ":")
		if strconv.Itoa(e.Rank) == parts[1] {
			code, _ := strconv.Atoi(parts[2])
			os.Exit(code)
		}
		fallthrough
	case mode == "wait":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		fmt.Printf("pid %d\n", os.Getpid())
		fmt.Println("ready")
		fmt.Printf("rank %d got %v, saving\n", e.Rank, <-sigs)
		os.Exit(0)
	}
	os.Exit(9)
}

func launchCLI(t *testing.T, getenv map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(k string) string { return getenv[k] }}
	code := run(context.Background(), env, args)
	return code, out.String(), errb.String()
}

func sortLines(s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestLaunchNoPython starts the test binary as 3 workers and checks each
// one's environment, with torchrun's underscore flag spellings.
func TestLaunchNoPython(t *testing.T) {
	t.Setenv("GOTRON_LAUNCH_HELPER", "env")
	for _, flags := range [][]string{
		{"--nproc-per-node", "3", "--master-port", "4321", "--no-python"},
		{"--nproc_per_node=3", "--master_port", "4321", "--no_python"},
	} {
		args := append(append([]string{"launch"}, flags...), "--", os.Args[0], "-test.run=^TestLaunchHelperWorker$")
		code, out, errs := launchCLI(t, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", flags, code, errs)
		}
		want := "[rank0]: rank=0 local=0 world=3 node=0/1 master=127.0.0.1:4321 source=torchrun\n" +
			"[rank1]: rank=1 local=1 world=3 node=0/1 master=127.0.0.1:4321 source=torchrun\n" +
			"[rank2]: rank=2 local=2 world=3 node=0/1 master=127.0.0.1:4321 source=torchrun"
		if got := sortLines(out); got != want {
			t.Errorf("%v:\n%s\nwant\n%s", flags, got, want)
		}
	}
}

// TestLaunchKubeflowDefaults: in a PyTorchJob pod the PET_* variables give
// the launcher its node count, node rank and master.
func TestLaunchKubeflowDefaults(t *testing.T) {
	t.Setenv("GOTRON_LAUNCH_HELPER", "env")
	pet := map[string]string{"PET_NPROC_PER_NODE": "2", "PET_NNODES": "3", "PET_NODE_RANK": "2",
		"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "2", "WORLD_SIZE": "6"}
	code, out, errs := launchCLI(t, pet, "launch", "--no-python", "--", os.Args[0], "-test.run=^TestLaunchHelperWorker$")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	want := "[rank4]: rank=4 local=0 world=6 node=2/3 master=job-master-0:23456 source=torchrun\n" +
		"[rank5]: rank=5 local=1 world=6 node=2/3 master=job-master-0:23456 source=torchrun"
	if got := sortLines(out); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestLaunchWorkerFails: rank 1 exits 4; the launcher stops the others and
// exits non-zero naming rank 1.
func TestLaunchWorkerFails(t *testing.T) {
	t.Setenv("GOTRON_LAUNCH_HELPER", "exit:1:4")
	code, out, errs := launchCLI(t, nil, "launch", "--nproc-per-node", "3", "--no-python", "--",
		os.Args[0], "-test.run=^TestLaunchHelperWorker$")
	if code == 0 || !strings.Contains(errs, "gotron launch: worker rank 1 (local rank 1, host ") ||
		!strings.Contains(errs, "exited with status 4") {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	if strings.Contains(out, "rank 1 got") {
		t.Errorf("rank 1 should have exited, not waited:\n%s", out)
	}
}

// TestLaunchInproc runs 'parallel groups' as 4 in-process ranks, then a
// failing command.
func TestLaunchInproc(t *testing.T) {
	code, out, errs := launchCLI(t, nil, "launch", "--inproc", "--nproc-per-node", "4", "--",
		"parallel", "groups", "--world-size", "2", "--tensor-model-parallel-size", "2")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	lines := strings.Split(sortLines(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 lines, got\n%s", out)
	}
	for r, l := range lines {
		if want := fmt.Sprintf(`[rank%d]: {"tp":[[0,1]],`, r); !strings.HasPrefix(l, want) {
			t.Errorf("line %q does not start with %q", l, want)
		}
	}
	code, _, errs = launchCLI(t, nil, "launch", "--inproc", "--nproc-per-node", "2", "--",
		"parallel", "groups", "--world-size", "3", "--tensor-model-parallel-size", "2")
	if code == 0 || !regexp.MustCompile(`gotron launch: worker rank \d \(local rank \d\) failed: gotron parallel exited with status 1`).MatchString(errs) ||
		!regexp.MustCompile(`\[rank\d\]: gotron parallel: world size 3 is not divisible`).MatchString(errs) {
		t.Errorf("exit %d, stderr:\n%s", code, errs)
	}
}

func TestLaunchErrors(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--nproc-per-node", "2"}, "no worker command"},
		{nil, []string{"--nproc-per-node", "2", "--", "trian"}, `"trian" is not a gotron command (did you mean "train"?); use --no-python`},
		{nil, []string{"--", "launch", "train"}, "cannot be 'launch'"},
		{nil, []string{"--inproc", "--no-python", "--", "/bin/true"}, "--inproc"},
		{nil, []string{"--nnodes", "1:4", "--", "train"}, "elastic node counts are not supported"},
		{nil, []string{"--nnodes", "2", "--node-rank", "2", "--no-python", "--", "/bin/true"}, "--node-rank 2"},
		{nil, []string{"--nproc-per-node", "0", "--", "train"}, "--nproc-per-node 0"},
		{nil, []string{"--nproc-per-nod", "2", "--", "train"}, "did you mean --nproc-per-node"},
		{nil, []string{"--standalone", "--nnodes", "2", "--", "train"}, "--standalone"},
		{nil, []string{"--rdzv-endpoint", "host:x", "--", "train"}, "--rdzv-endpoint"},
		{nil, []string{"--rdzv-backend", "etcd", "--", "train"}, "--rdzv-backend"},
		{map[string]string{"PET_NPROC_PER_NODE": "four"}, []string{"--", "train"}, `--nproc-per-node "four"`},
		{nil, []string{"--nproc-per-node", "gpu", "--", "train"}, "gotron runs on CPUs"},
		{map[string]string{"MASTER_PORT": "http"}, []string{"--", "train"}, `MASTER_PORT/PET_MASTER_PORT="http"`},
		{nil, []string{"--master-port", "70000", "--no-python", "--", "/bin/true"}, "--master-port 70000"},
		{nil, []string{"--no-python", "--", "/nonexistent/worker"}, "start worker rank 0"},
	} {
		code, _, errs := launchCLI(t, c.env, append([]string{"launch"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
	if code, out, _ := launchCLI(t, nil, "launch", "--help"); code != 0 || !strings.Contains(out, "--nproc-per-node") {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
}

func TestLaunchNprocAuto(t *testing.T) {
	for _, spec := range []string{"auto", "cpu"} {
		lf, _, err := parseLaunchFlags(&cli{getenv: func(string) string { return "" }}, []string{"--nproc-per-node", spec, "--", "train"})
		if err != nil || lf.nproc != runtime.NumCPU() {
			t.Errorf("--nproc-per-node %s: %d workers, %v; want %d", spec, lf.nproc, err, runtime.NumCPU())
		}
	}
}

func TestUnderscoresToHyphens(t *testing.T) {
	got := underscoresToHyphens([]string{"--nproc_per_node", "2", "--master_addr=a_b", "--no_python", "--", "x", "--a_b"})
	want := []string{"--nproc-per-node", "2", "--master-addr=a_b", "--no-python", "--", "x", "--a_b"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	got = underscoresToHyphens([]string{"--rdzv_id", "my_job", "train", "--data_path", "p"})
	want = []string{"--rdzv-id", "my_job", "train", "--data_path", "p"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestMain removes the binary buildGotron built, once every test that
// shares it is done.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtGotronDir != "" {
		os.RemoveAll(builtGotronDir)
	}
	os.Exit(code)
}

// builtGotronDir is where buildGotron put the binary ("" before it ran).
var builtGotronDir string

// buildGotron builds the gotron binary once per test run.
var buildGotron = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gotron-launch-test")
	if err != nil {
		return "", err
	}
	builtGotronDir = dir
	bin := filepath.Join(dir, "gotron")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/gotron: %v\n%s", err, out)
	}
	return bin, nil
})

// readyCounter closes ready after n lines ending in "ready".
type readyCounter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int
	ready chan struct{}
}

func (w *readyCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.n > 0 {
		if w.n -= bytes.Count(p, []byte(": ready\n")); w.n <= 0 {
			close(w.ready)
		}
	}
	return len(p), nil
}

func (w *readyCounter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestLaunchBinary runs the real gotron binary: workers re-executing gotron
// itself, --standalone, and SIGTERM sent to the launcher reaching every
// worker.
func TestLaunchBinary(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(bin, "launch", "--standalone", "--nproc-per-node", "2", "--",
		"parallel", "groups", "--world-size", "4", "--pipeline-model-parallel-size", "2").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for r := range 2 {
		if want := fmt.Sprintf(`[rank%d]: {"tp":[[0],[1],[2],[3]],"pp":[[0,2],[1,3]],`, r); !strings.Contains(string(out), want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}

	w := &readyCounter{n: 3, ready: make(chan struct{})}
	cmd := exec.Command(bin, "launch", "--nproc-per-node", "3", "--no-python", "--", os.Args[0], "-test.run=^TestLaunchHelperWorker$")
	cmd.Env = append(os.Environ(), "GOTRON_LAUNCH_HELPER=wait")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	<-w.ready
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(errb.String(), "interrupted") {
		t.Errorf("launcher: %v, exit %d, stderr %q", err, code, errb.String())
	}
	for r := range 3 {
		if want := fmt.Sprintf("[rank%d]: rank %d got terminated, saving\n", r, r); !strings.Contains(w.String(), want) {
			t.Errorf("missing %q in\n%s", want, w.String())
		}
	}

	// kill -9 of worker rank 1: the launcher stops the others and exits 1
	// naming rank 1.
	w = &readyCounter{n: 3, ready: make(chan struct{})}
	cmd = exec.Command(bin, "launch", "--nproc-per-node", "3", "--no-python", "--", os.Args[0], "-test.run=^TestLaunchHelperWorker$")
	cmd.Env = append(os.Environ(), "GOTRON_LAUNCH_HELPER=wait", "GOTRON_NUM_THREADS=1") // no threads notice
	errb.Reset()
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	<-w.ready
	m := regexp.MustCompile(`\[rank1\]: pid (\d+)\n`).FindStringSubmatch(w.String())
	if m == nil {
		cmd.Process.Kill()
		t.Fatalf("no pid from rank 1 in\n%s", w.String())
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	host, _ := os.Hostname()
	want := fmt.Sprintf("gotron launch: worker rank 1 (local rank 1, host %s, pid %d) was killed by signal killed\n", host, pid)
	if code := cmd.ProcessState.ExitCode(); code != 1 || errb.String() != want {
		t.Errorf("launcher: exit %d, stderr %q; want 1, %q", code, errb.String(), want)
	}
	for _, r := range []int{0, 2} {
		if want := fmt.Sprintf("[rank%d]: rank %d got terminated, saving\n", r, r); !strings.Contains(w.String(), want) {
			t.Errorf("missing %q in\n%s", want, w.String())
		}
	}
}

func TestWorkerEnviron(t *testing.T) {
	for _, c := range []struct {
		env     map[string]string
		nproc   int
		want    string // the GOTRON_NUM_THREADS entry added, or ""
		wantLog string
	}{
		{nil, 4, "GOTRON_NUM_THREADS=4", "GOTRON_NUM_THREADS=4 for each of 4 workers (16 CPUs)"},
		{nil, 32, "GOTRON_NUM_THREADS=1", "GOTRON_NUM_THREADS=1"},
		{nil, 1, "", ""},
		{map[string]string{"GOTRON_NUM_THREADS": "2"}, 4, "", ""},
		{map[string]string{"GOMAXPROCS": "2"}, 4, "", ""},
	} {
		var errb bytes.Buffer
		env := &cli{stderr: &errb, getenv: func(k string) string { return c.env[k] }}
		got := workerEnviron(env, c.nproc, 16)
		added := ""
		if len(got) > len(os.Environ()) {
			added = got[len(got)-1]
		}
		if added != c.want || !strings.Contains(errb.String(), c.wantLog) || (c.wantLog == "") != (errb.Len() == 0) {
			t.Errorf("%v nproc %d: added %q, log %q; want %q, %q", c.env, c.nproc, added, errb.String(), c.want, c.wantLog)
		}
	}
}

// TestInprocSharesThreads: the --inproc ranks divide the process's kernel
// threads among them for the run (at least 1 each), and the count is
// restored after.
func TestInprocSharesThreads(t *testing.T) {
	prev := tensor.SetCPUThreads(4)
	defer tensor.SetCPUThreads(prev)
	for _, c := range []struct{ nproc, per int }{{1, 4}, {2, 2}, {3, 1}, {8, 1}} {
		var errb bytes.Buffer
		restore := shareThreads(&cli{stderr: &errb}, c.nproc)
		if got := tensor.CPUThreads(); got != c.per {
			t.Errorf("%d ranks: %d threads per rank, want %d", c.nproc, got, c.per)
		}
		if want := fmt.Sprintf("%d ranks share the process's 4 kernel threads: %d per rank", c.nproc, c.per); c.nproc > 1 && !strings.Contains(errb.String(), want) {
			t.Errorf("%d ranks: stderr %q, want it to say %q", c.nproc, errb.String(), want)
		}
		restore()
		if got := tensor.CPUThreads(); got != 4 {
			t.Errorf("%d ranks: %d threads after the run, want 4 again", c.nproc, got)
		}
	}
}
