package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// libSearch describes where a shared library is looked for.
type libSearch struct {
	what   string   // what the library is, for the error text
	names  []string // file names, preferred first
	loader bool     // try the bare names through the dynamic loader first
	dirs   []string // directories to try, in order
}

// open dlopens the first name found (names are tried in order, each through
// the loader when s.loader and then in each directory, so a newer version in
// a toolkit directory wins over an older one on the loader's path). The
// error names the library and every place looked.
func (s libSearch) open() (handle uintptr, path string, err error) {
	var dirs []string
	seen := map[string]bool{}
	for _, dir := range s.dirs {
		if dir != "" && !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
	}
	var failures []string // files that exist but did not load
	for _, name := range s.names {
		if s.loader {
			if h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				return h, name, nil
			}
		}
		for _, dir := range dirs {
			p := filepath.Join(dir, name)
			if _, statErr := os.Stat(p); statErr != nil {
				continue
			}
			h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				return h, p, nil
			}
			failures = append(failures, fmt.Sprintf("%s: %v", p, err))
		}
	}
	looked := dirs
	if s.loader {
		looked = append([]string{"the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache)"}, dirs...)
	}
	msg := fmt.Sprintf("cuda: cannot load %s (%s): looked in %s", strings.Join(s.names, " or "), s.what, strings.Join(looked, ", "))
	if len(failures) > 0 {
		msg += "; found but failed to load: " + strings.Join(failures, "; ")
	}
	return 0, "", errors.New(msg)
}

// envDirs returns the directories of a PATH-like environment variable.
func envDirs(name string) []string {
	v := os.Getenv(name)
	if v == "" {
		return nil
	}
	return filepath.SplitList(v)
}

// toolkitDirs are the directories where CUDA toolkit libraries (cuBLAS, NCCL)
// are usually installed, newest toolkit first.
func toolkitDirs() []string {
	var dirs []string
	if home := os.Getenv("CUDA_HOME"); home != "" {
		dirs = append(dirs, filepath.Join(home, "lib64"), filepath.Join(home, "targets/x86_64-linux/lib"))
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	versioned, _ := filepath.Glob("/usr/local/cuda-*/targets/x86_64-linux/lib")
	sort.Sort(sort.Reverse(sort.StringSlice(versioned)))
	dirs = append(dirs, versioned...)
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
	return append(dirs, envDirs("LD_LIBRARY_PATH")...)
}

func driverSearch() libSearch {
	dirs := []string{"/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"}
	if home := os.Getenv("CUDA_HOME"); home != "" {
		dirs = append(dirs, filepath.Join(home, "lib64"), filepath.Join(home, "lib64/stubs"))
	}
	dirs = append(dirs, envDirs("LD_LIBRARY_PATH")...)
	return libSearch{
		what:   "the NVIDIA driver library; is an NVIDIA GPU and its driver installed?",
		names:  []string{"libcuda.so.1"},
		loader: true,
		dirs:   dirs,
	}
}

// cublasSearch finds libcublas for one major version; the caller tries 13, 12, 11.
func cublasSearch() libSearch {
	return libSearch{
		what:   "cuBLAS from the CUDA toolkit; set CUDA_HOME to the toolkit",
		names:  []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"},
		loader: true,
		dirs:   toolkitDirs(),
	}
}

func ncclSearch() libSearch {
	return libSearch{
		what:   "NCCL, NVIDIA's collective communication library",
		names:  []string{"libnccl.so.2"},
		loader: true,
		dirs:   toolkitDirs(),
	}
}

// symbols registers C functions of one library into Go function variables,
// collecting the names that are missing instead of panicking.
type symbols struct {
	lib     uintptr
	path    string
	missing []string
}

// fn binds fptr (a pointer to a Go func variable) to the C function name.
func (s *symbols) fn(fptr any, name string) {
	addr, err := purego.Dlsym(s.lib, name)
	if err != nil || addr == 0 {
		s.missing = append(s.missing, name)
		return
	}
	purego.RegisterFunc(fptr, addr)
}

// addr returns the address of the C function name, for purego.SyscallN on
// hot paths (no reflection, no allocation).
func (s *symbols) addr(name string) uintptr {
	addr, err := purego.Dlsym(s.lib, name)
	if err != nil || addr == 0 {
		s.missing = append(s.missing, name)
		return 0
	}
	return addr
}

// optional returns the address of name or 0, without recording it as missing.
func (s *symbols) optional(name string) uintptr {
	addr, err := purego.Dlsym(s.lib, name)
	if err != nil {
		return 0
	}
	return addr
}

func (s *symbols) err() error {
	if len(s.missing) == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s lacks %s (too old a version?)", s.path, strings.Join(s.missing, ", "))
}

// lazy loads a library once per process; later calls return the same result.
type lazy[T any] struct {
	once sync.Once
	val  *T
	err  error
}

func (l *lazy[T]) get(load func() (*T, error)) (*T, error) {
	l.once.Do(func() { l.val, l.err = load() })
	return l.val, l.err
}
