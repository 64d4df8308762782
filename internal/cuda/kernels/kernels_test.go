package kernels

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestPTXForEveryFamily: every .cu file has committed PTX for both
// architectures, and PTX picks the folder by compute capability.
func TestPTXForEveryFamily(t *testing.T) {
	cus, err := filepath.Glob("*.cu")
	if err != nil {
		t.Fatal(err)
	}
	if len(cus) == 0 {
		t.Fatal("no .cu files")
	}
	var want []string
	for _, cu := range cus {
		want = append(want, strings.TrimSuffix(cu, ".cu"))
	}
	if got := Families(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("Families() = %v, want the .cu files' %v (run go generate ./internal/cuda/kernels)", got, want)
	}
	for _, cc := range []struct {
		major, minor int
		arch         string
	}{{8, 0, "sm_80"}, {8, 6, "sm_80"}, {8, 9, "sm_80"}, {9, 0, "sm_90"}, {10, 0, "sm_90"}, {12, 0, "sm_90"}} {
		ptx, err := PTX(cc.major, cc.minor)
		if err != nil {
			t.Fatalf("PTX(%d, %d): %v", cc.major, cc.minor, err)
		}
		for _, fam := range want {
			if !bytes.Contains(ptx[fam], []byte(".target "+cc.arch)) {
				t.Errorf("PTX(%d, %d)[%s] does not target %s", cc.major, cc.minor, fam, cc.arch)
			}
		}
	}
	if _, err := PTX(7, 5); err == nil || !strings.Contains(err.Error(), "compute capability 7.5 is older than the sm_80 PTX") {
		t.Errorf("PTX(7, 5) error = %v, want one naming compute capability 7.5", err)
	}
}

// TestKernelNamesPrefixed: every kernel of family f is named f_... (names
// are looked up across all modules, so they must not collide).
func TestKernelNamesPrefixed(t *testing.T) {
	ptx, err := PTX(9, 0)
	if err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`\.entry\s+([A-Za-z_][A-Za-z0-9_$]*)`)
	seen := map[string]string{}
	for fam, b := range ptx {
		for _, m := range entry.FindAllSubmatch(b, -1) {
			name := string(m[1])
			if !strings.HasPrefix(name, fam+"_") {
				t.Errorf("kernel %s of %s.cu is not prefixed %s_ (extern \"C\" missing?)", name, fam, fam)
			}
			if other, ok := seen[name]; ok {
				t.Errorf("kernel %s is in both %s.cu and %s.cu", name, other, fam)
			}
			seen[name] = fam
		}
	}
}

// nvccVersion returns the "release X.Y, VX.Y.Z" of a PTX header or of
// nvcc --version.
var nvccRelease = regexp.MustCompile(`release \d+\.\d+, V[\d.]+`)

// TestPTXUpToDate regenerates the PTX with the installed nvcc and compares
// it with the committed files. PTX from another nvcc release differs
// without being stale, so then it only checks that every file compiles.
func TestPTXUpToDate(t *testing.T) {
	t.Parallel() // nvcc and ptxas are slow: let the two overlap
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		t.Skip("nvcc not on PATH: cannot check that the committed PTX matches the .cu files")
	}
	ver, err := exec.Command(nvcc, "--version").Output()
	if err != nil {
		t.Fatalf("nvcc --version: %v", err)
	}
	installed := nvccRelease.Find(ver)
	// go run ./gen reads the .cu files in another process: read them here
	// too, so that go test's cache notices when they change.
	cus, err := filepath.Glob("*.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, cu := range cus {
		if _, err := os.ReadFile(cu); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("go", "run", "./gen", "-out", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./gen -out %s: %v\n%s", out, err, msg)
	}
	for _, arch := range []string{"sm_80", "sm_90"} {
		fresh, err := filepath.Glob(filepath.Join(out, arch, "*.ptx"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range fresh {
			name := filepath.Join("ptx", arch, filepath.Base(p))
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			committed, err := os.ReadFile(name)
			if err != nil {
				t.Errorf("%s: %v (run go generate ./internal/cuda/kernels)", name, err)
				continue
			}
			if bytes.Equal(got, committed) {
				continue
			}
			if made := nvccRelease.Find(committed); !bytes.Equal(made, installed) {
				t.Logf("%s was made by nvcc %s, the installed one is %s: not compared", name, made, installed)
				continue
			}
			fam := strings.TrimSuffix(filepath.Base(p), ".ptx")
			if layoutSensitive[fam] {
				// its sources' hash is compared below
				t.Logf("%s differs from this build's (nvcc's %s PTX depends on its process's memory layout): its source's hash is compared instead", name, fam)
				continue
			}
			t.Errorf("%s differs from what nvcc makes of %s.cu now: run go generate ./internal/cuda/kernels and commit the PTX", name, fam)
		}
	}
	fresh, err := os.ReadFile(filepath.Join(out, "sources.sha256"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("ptx", "sources.sha256"))
	if err != nil || !bytes.Equal(fresh, committed) {
		t.Errorf("ptx/sources.sha256 does not record the .cu files as they are (%v): run go generate ./internal/cuda/kernels and commit the PTX\ncommitted:\n%s\nnow:\n%s", err, committed, fresh)
	}
}

// layoutSensitive names the families whose PTX nvcc 11.8 makes differently
// from one checkout to another (attntc's large unrolled mma loops: the
// checkout's path alone reorders a few instructions and renumbers
// registers, see gen's compile). TestPTXUpToDate checks them through
// ptx/sources.sha256 (the PTX was made from these very sources) instead of
// byte for byte; TestPTXNoSpills still runs ptxas on the committed files.
var layoutSensitive = map[string]bool{"attntc": true}

// TestPTXNoSpills assembles each sm_90 file with ptxas and fails on
// register spills (local-memory traffic in a hot loop); it logs each
// kernel's register count.
func TestPTXNoSpills(t *testing.T) {
	t.Parallel()
	ptxas, err := exec.LookPath("ptxas")
	if err != nil {
		t.Skip("ptxas not on PATH: cannot check the kernels for register spills")
	}
	files, err := filepath.Glob(filepath.Join("ptx", "sm_90", "*.ptx"))
	if err != nil {
		t.Fatal(err)
	}
	fn := regexp.MustCompile(`Compiling entry function '([^']+)'`)
	spill := regexp.MustCompile(`(\d+) bytes spill stores, (\d+) bytes spill loads`)
	regs := regexp.MustCompile(`Used (\d+) registers`)
	stack := regexp.MustCompile(`(\d+) bytes stack frame`)
	outs := make([][]byte, len(files))
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, p := range files {
		wg.Go(func() {
			outs[i], errs[i] = exec.Command(ptxas, "-arch=sm_90", "-v", "-o", os.DevNull, p).CombinedOutput()
		})
	}
	wg.Wait()
	for i, p := range files {
		out, err := outs[i], errs[i]
		if err != nil {
			t.Errorf("ptxas %s: %v\n%s", p, err, out)
			continue
		}
		var kernel, frame string
		var summary []string
		for _, line := range strings.Split(string(out), "\n") {
			if m := fn.FindStringSubmatch(line); m != nil {
				kernel = m[1]
			}
			if m := spill.FindStringSubmatch(line); m != nil && (m[1] != "0" || m[2] != "0") {
				t.Errorf("%s: kernel %s spills: %s", p, kernel, strings.TrimSpace(line))
			}
			if m := stack.FindStringSubmatch(line); m != nil {
				frame = m[1]
			}
			if m := regs.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[1])
				s := kernel + "=" + strconv.Itoa(n)
				if frame != "" && frame != "0" {
					s += "(stack " + frame + "B)" // local arrays: fine off the hot path
				}
				summary = append(summary, s)
				frame = ""
			}
		}
		t.Logf("%s registers: %s", filepath.Base(p), strings.Join(summary, " "))
	}
}

// TestAttntcTensorCores: every kernel of the tensor-core attention
// (attntc.cu) multiplies with mma.sync m16n8k16 on bf16 operands into
// float32 accumulators and checks its dynamic shared memory; their
// registers and spills are TestPTXNoSpills' (no spills allowed).
func TestAttntcTensorCores(t *testing.T) {
	for _, arch := range []string{"sm_80", "sm_90"} {
		b, err := os.ReadFile(filepath.Join("ptx", arch, "attntc.ptx"))
		if err != nil {
			t.Fatal(err)
		}
		entries := regexp.MustCompile(`(?s)\.entry (attntc_\w+)\(.*?\n}\n`).FindAllSubmatch(b, -1)
		if len(entries) != 6 {
			t.Fatalf("%s attntc.ptx: %d kernels, want 6 (fwd, dq, dkv at d 64 and 128)", arch, len(entries))
		}
		for _, e := range entries {
			if !bytes.Contains(e[0], []byte("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")) {
				t.Errorf("%s %s: no bf16 m16n8k16 mma.sync", arch, e[1])
			}
			if !bytes.Contains(e[0], []byte("%dynamic_smem_size")) {
				t.Errorf("%s %s: no dynamic shared memory check", arch, e[1])
			}
		}
	}
}
