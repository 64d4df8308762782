package half_test

import (
	"fmt"

	"github.com/gotron/gotron/internal/half"
)

func Example() {
	b := half.BFloat16From(3.14159)
	h := half.Float16From(3.14159)
	fmt.Printf("bf16 %#04x = %v\n", uint16(b), b.Float32())
	fmt.Printf("f16  %#04x = %v\n", uint16(h), h.Float32())
	fmt.Println(half.Float16From(65520).Float32(), half.Float16From(1e-8).Float32())
	// Output:
	// bf16 0x4049 = 3.140625
	// f16  0x4248 = 3.140625
	// +Inf 0
}
