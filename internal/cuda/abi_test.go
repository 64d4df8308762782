package cuda

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The GEMM (23 arguments) and ncclCommInitRank (22, with the id on the
// stack) are called through purego.SyscallN with most arguments on the
// stack. This checks that layout against C: libc's snprintf reads 20
// integers, 17 of them from the stack, in order.
func TestSyscallNStackArguments(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skip("no libc.so.6: ", err)
	}
	snprintf, err := purego.Dlsym(libc, "snprintf")
	if err != nil {
		t.Skip(err)
	}
	const n = 20
	format := cString(strings.TrimSpace(strings.Repeat("%ld ", n)))
	buf := make([]byte, 512)
	args := []uintptr{uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&format[0]))}
	var want []string
	for i := range n {
		v := int64(i*1000003) - 7
		if i%3 == 0 {
			v = -v << 20
		}
		args = append(args, uintptr(v))
		want = append(want, fmt.Sprint(v))
	}
	purego.SyscallN(snprintf, args...)
	runtime.KeepAlive(format)
	got := string(buf[:bytes.IndexByte(buf, 0)])
	if got != strings.Join(want, " ") {
		t.Errorf("snprintf through SyscallN wrote\n%s\nwant\n%s", got, strings.Join(want, " "))
	}
	// int arguments passed as uintptr(uint32(v)) read back as C ints.
	format = cString("%d %d %d %d %d %d %d %d")
	args = []uintptr{uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&format[0]))}
	for _, v := range []int32{-1, 2, -3, 4, -5, 6, -7, 8} {
		args = append(args, uintptr(uint32(v)))
	}
	purego.SyscallN(snprintf, args...)
	runtime.KeepAlive(format)
	if got := string(buf[:bytes.IndexByte(buf, 0)]); got != "-1 2 -3 4 -5 6 -7 8" {
		t.Errorf("32-bit ints on the stack: %q", got)
	}
}
