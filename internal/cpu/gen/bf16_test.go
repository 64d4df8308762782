package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestVDPBF16PSEncoding checks the hand-made EVEX encoding against bytes
// from GNU as 2.x (objdump -d of "vdpbf16ps %zmm<src2>, %zmm<src1>,
// %zmm<dst>"), covering every combination of the high register bits.
func TestVDPBF16PSEncoding(t *testing.T) {
	for _, tc := range []struct {
		dst, src1, src2 int
		want            []byte
	}{
		{0, 1, 2, []byte{0x62, 0xf2, 0x76, 0x48, 0x52, 0xc2}},
		{29, 30, 31, []byte{0x62, 0x02, 0x0e, 0x40, 0x52, 0xef}},
		{8, 9, 17, []byte{0x62, 0x32, 0x36, 0x48, 0x52, 0xc1}},
		{27, 16, 8, []byte{0x62, 0x42, 0x7e, 0x40, 0x52, 0xd8}},
		{13, 28, 30, []byte{0x62, 0x12, 0x1e, 0x40, 0x52, 0xee}},
	} {
		if got := vdpbf16ps(tc.dst, tc.src1, tc.src2); !bytes.Equal(got, tc.want) {
			t.Errorf("VDPBF16PS zmm%d, zmm%d, zmm%d = % x, want % x", tc.dst, tc.src1, tc.src2, got, tc.want)
		}
	}
	var w bytes.Buffer
	emitVDPBF16PS(&w, 0, 1, 2)
	if want := "BYTE $0x62; BYTE $0xf2; BYTE $0x76; BYTE $0x48; BYTE $0x52; BYTE $0xc2 // VDPBF16PS Z2, Z1, Z0"; !strings.Contains(w.String(), want) {
		t.Errorf("emitVDPBF16PS = %q, want %q", w.String(), want)
	}
}
