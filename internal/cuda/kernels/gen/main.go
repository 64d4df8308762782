// Command gen compiles the CUDA kernel families of package kernels (every
// *.cu file in the current directory) to PTX with nvcc, once per target
// architecture:
//
//	go run ./gen -out ptx      (what go generate runs, from internal/cuda/kernels)
//
// writes <out>/sm_80/<family>.ptx and <out>/sm_90/<family>.ptx and removes
// PTX files in those folders whose .cu file no longer exists. The flags are
// fixed (see Flags) so that the committed PTX is reproducible: nvcc emits
// the same PTX for the same source and compiler version.
package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// Archs are the virtual architectures gotron ships PTX for: sm_80 (A100,
// and the driver JIT-compiles it for newer GPUs) and sm_90 (H100/H200).
var Archs = []string{"sm_80", "sm_90"}

// Flags are nvcc's options besides -arch. No --use_fast_math: the kernels
// must round like the CPU backend's float32 code.
var Flags = []string{"-ptx", "-O3", "-std=c++14"}

func main() {
	out := flag.String("out", "ptx", "folder to write <arch>/<family>.ptx into")
	src := flag.String("src", ".", "folder holding the <family>.cu files")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("kernels/gen: ")
	if err := run(*src, *out); err != nil {
		log.Fatal(err)
	}
}

// nvccPath finds nvcc on PATH, then under $CUDA_HOME/bin and /usr/local/cuda/bin.
func nvccPath() (string, error) {
	if p, err := exec.LookPath("nvcc"); err == nil {
		return p, nil
	}
	var dirs []string
	if h := os.Getenv("CUDA_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "bin"))
	}
	dirs = append(dirs, "/usr/local/cuda/bin")
	for _, d := range dirs {
		p := filepath.Join(d, "nvcc")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("nvcc not found on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin: install the CUDA toolkit (11.8 or newer) to regenerate the PTX")
}

func run(src, out string) error {
	nvcc, err := nvccPath()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(src, "*.cu"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no .cu files in %s", src)
	}
	sort.Strings(files)
	type job struct{ cu, arch, ptx string }
	var jobs []job
	want := map[string]bool{}
	for _, arch := range Archs {
		dir := filepath.Join(out, arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, cu := range files {
			fam := strings.TrimSuffix(filepath.Base(cu), ".cu")
			ptx := filepath.Join(dir, fam+".ptx")
			want[ptx] = true
			jobs = append(jobs, job{cu, arch, ptx})
		}
	}
	// nvcc is single-threaded: compile the files in parallel.
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = compile(nvcc, j.cu, j.arch, j.ptx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := writeSources(files, filepath.Join(out, SourcesFile)); err != nil {
		return err
	}
	// Remove PTX of families whose .cu is gone.
	for _, arch := range Archs {
		old, err := filepath.Glob(filepath.Join(out, arch, "*.ptx"))
		if err != nil {
			return err
		}
		for _, p := range old {
			if !want[p] {
				if err := os.Remove(p); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// SourcesFile, beside the architectures' folders, records the SHA-256 of
// every .cu the PTX was made from: TestPTXUpToDate compares it where it
// cannot compare a family's PTX bytes (see compile).
const SourcesFile = "sources.sha256"

// writeSources writes "<sha256>  <file>" for each .cu, sorted by name.
func writeSources(files []string, path string) error {
	var b strings.Builder
	for _, cu := range files {
		src, err := os.ReadFile(cu)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%x  %s\n", sha256.Sum256(src), filepath.Base(cu))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// compile runs nvcc on cu for arch and writes ptx (a failed compile
// leaves the old PTX in place).
//
// nvcc 11.8's PTX for attntc.cu (large unrolled mma loops) depends on its
// process's memory layout: runs differing only in address randomization,
// or in the length of an argument or of the environment, order a few
// instructions and number registers differently. So nvcc runs without
// randomization (setarch -R, util-linux, where present), in the .cu's
// folder with relative paths of fixed length (output .gen-<family>-<arch>,
// copied to ptx afterwards) and an environment of only a fixed PATH
// (nvcc's folder, then the system's). That still does not make attntc's
// PTX the same bytes everywhere: the path of the checkout alone changes it
// (seen with two clones on one machine). TestPTXUpToDate therefore
// compares such families through SourcesFile, and the others byte for
// byte.
// setarchR returns setarch's path when `setarch -R true` runs here, else "".
var setarchR = sync.OnceValue(func() string {
	p, err := exec.LookPath("setarch")
	if err != nil || exec.Command(p, "-R", "true").Run() != nil {
		return ""
	}
	return p
})

func compile(nvcc, cu, arch, ptx string) error {
	fam := strings.TrimSuffix(filepath.Base(cu), ".cu")
	tmp := ".gen-" + fam + "-" + arch
	args := append(append([]string(nil), Flags...), "-arch="+arch, "-o", tmp, fam+".cu")
	run := func(name string, args ...string) ([]byte, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = filepath.Dir(cu)
		cmd.Env = []string{"PATH=" + filepath.Dir(nvcc) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		return cmd.CombinedOutput()
	}
	tmpPath := filepath.Join(filepath.Dir(cu), tmp)
	defer os.Remove(tmpPath)
	var msg []byte
	var err error
	if setarch := setarchR(); setarch != "" {
		msg, err = run(setarch, append([]string{"-R", nvcc}, args...)...)
	} else {
		// no setarch, or one the sandbox refuses (personality(2)): plain
		// nvcc, whose attntc PTX may then differ from run to run
		msg, err = run(nvcc, args...)
	}
	if err != nil {
		return fmt.Errorf("nvcc %s (in %s): %v\n%s", strings.Join(args, " "), filepath.Dir(cu), err, msg)
	}
	b, err := os.ReadFile(tmpPath)
	if err != nil {
		return err
	}
	// through a temporary file beside ptx, so that readers never see half of it
	if err := os.WriteFile(ptx+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(ptx+".tmp", ptx)
}
