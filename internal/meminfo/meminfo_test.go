package meminfo

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in    string
		total, free int64
		err         bool
	}{
		{"modern", "MemTotal:       24683656 kB\nMemFree:        23047116 kB\nMemAvailable:   24119260 kB\n", 24683656 * 1024, 24119260 * 1024, false},
		{"no MemAvailable", "MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\n", 100 * 1024, 35 * 1024, false},
		{"empty", "", 0, 0, true},
		{"garbage", "hello\nMemTotal: x kB\n", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.in))
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error %v", err, tt.err)
			}
			if got.TotalBytes != tt.total || got.AvailableBytes != tt.free {
				t.Fatalf("got %+v, want total %d available %d", got, tt.total, tt.free)
			}
		})
	}
}

func TestFits(t *testing.T) {
	i := Info{TotalBytes: 2e9, AvailableBytes: 1e9}
	if !i.Fits(1e9) || i.Fits(1e9+1) {
		t.Errorf("Fits around 1e9 wrong for %+v", i)
	}
	if !(Info{}).Fits(1e30) {
		t.Error("the zero Info must fit everything (nothing known)")
	}
	if s := i.String(); s != "1.0 GB available of 2.0 GB (/proc/meminfo)" {
		t.Errorf("String() = %q", s)
	}
}
