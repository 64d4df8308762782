package tensor

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/gotron/gotron/internal/cuda/kernels"
)

// TestAttntcArgsMatchPTX checks, without a GPU, that the tensor-core
// attention's launch arguments match its kernels' PTX parameters one for
// one in size, and that the dynamic shared memory the host passes is the
// size each kernel checks for (the constant of its %dynamic_smem_size
// comparison), for both architectures and head dimensions.
func TestAttntcArgsMatchPTX(t *testing.T) {
	a := cudaAttn{}
	p := attntcBwdPtrs{}
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		ptx := string(mods["attntc"])
		for _, d := range []int{64, 128} {
			for kind, args := range map[string][]any{
				"fwd": attntcFwdArgs(0, 0, 0, 0, 0, a, 1, 1, 1),
				"dq":  attntcDqArgs(0, p, a, 1, 1, 1),
				"dkv": attntcDkvArgs(0, 0, p, a, 1, 1, 1),
			} {
				name := attntcName(kind, d)
				checkArgsMatchPTX(t, arch, ptx, name, args)
				body := regexp.MustCompile(`(?s)\.entry ` + name + `\(.*?\n}\n`).FindString(ptx)
				smem := regexp.MustCompile(`mov\.u32 \s*%r\d+, %dynamic_smem_size;`).FindStringIndex(body)
				if smem == nil {
					t.Fatalf("sm_%d%d %s: no %%dynamic_smem_size check in the PTX", arch[0], arch[1], name)
				}
				// the comparison right after it names the bytes the kernel
				// needs: have < need, or (as nvcc writes it) have > need-1
				m := regexp.MustCompile(`setp\.(lt|ge|gt|le)\.u32 \s*%p\d+, %r\d+, (\d+);`).FindStringSubmatch(body[smem[1]:])
				if m == nil {
					t.Fatalf("sm_%d%d %s: no comparison after %%dynamic_smem_size", arch[0], arch[1], name)
				}
				need, _ := strconv.Atoi(m[2])
				if m[1] == "gt" || m[1] == "le" {
					need++
				}
				if need != attntcSharedBytes(kind, d) {
					t.Errorf("sm_%d%d %s: the kernel checks for %d bytes of shared memory, attntcSharedBytes gives %d", arch[0], arch[1], name, need, attntcSharedBytes(kind, d))
				}
			}
		}
	}
}
