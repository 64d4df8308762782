package nprand

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// Reference vectors computed by numpy's RandomState(seed).shuffle.
func TestSpecVectors(t *testing.T) {
	if got := New(1234).Uint32(); got != 822569775 {
		t.Errorf("first output of MT19937(1234) = %d, want 822569775", got)
	}
	cases := []struct {
		seed uint32
		n    int
		want []int
	}{
		{1234, 10, []int{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}},
		{0, 20, []int{18, 1, 19, 8, 10, 17, 6, 13, 4, 2, 5, 14, 9, 7, 16, 11, 3, 0, 15, 12}},
	}
	for _, c := range cases {
		x := make([]int, c.n)
		for i := range x {
			x[i] = i
		}
		Shuffle(New(c.seed), x)
		if !slices.Equal(x, c.want) {
			t.Errorf("RandomState(%d).shuffle(arange(%d)) = %v, want %v", c.seed, c.n, x, c.want)
		}
	}
}

// TestNumpyGolden compares against numpy 1.24's RandomState.shuffle
// (testdata/gen_golden.py), including a second shuffle on the same generator.
func TestNumpyGolden(t *testing.T) {
	f, err := os.Open("testdata/shuffle_golden.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	lines := 0
	for sc.Scan() {
		var seed uint32
		var n int
		if _, err := fmt.Sscan(sc.Text(), &seed, &n); err != nil {
			t.Fatalf("bad golden line %q: %v", sc.Text(), err)
		}
		r := New(seed)
		a := make([]int64, n)
		for i := range a {
			a[i] = int64(i)
		}
		Shuffle(r, a)
		b := []int{0, 1, 2, 3, 4, 5, 6}
		Shuffle(r, b)
		var dot int64
		for i, v := range a {
			dot += v * int64(i)
		}
		got := fmt.Sprintf("%d %d %s %s %d %s", seed, n, pyList(a[:min(8, n)]), pyList(a[max(0, n-3):]), dot, pyList(b))
		if got != sc.Text() {
			t.Errorf("got  %s\nwant %s", got, sc.Text())
		}
		lines++
	}
	if lines != 15 {
		t.Fatalf("read %d golden lines, want 15", lines)
	}
}

// numpy: RandomState(5).randint(0, 2**40, size=5, dtype=np.uint64), the
// masked 64-bit path of Interval.
func TestInterval64(t *testing.T) {
	want := []uint64{425438759118, 1030067709629, 989404716150, 622681974857, 34745516772}
	r := New(5)
	for i, w := range want {
		if got := r.Interval(1<<40 - 1); got != w {
			t.Errorf("draw %d = %d, want %d", i, got, w)
		}
	}
}

func pyList[T any](x []T) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func BenchmarkShuffle1M(b *testing.B) {
	x := make([]int32, 1<<20)
	r := New(1)
	for b.Loop() {
		Shuffle(r, x)
	}
}

// TestBinomialAndRandintMatchNumpy checks Binomial(1, p) and Interval (as
// randint(0, high, size=2)[1]) interleaved on one stream against numpy 1.24:
//
//	r = np.random.RandomState(5); ps = [0.5, 0.0, 1.0, 0.9, 0.1, 0.999999, 1e-9, 0.3, 0.7, 0.5]
//	for i in range(40): out += [r.binomial(1, ps[i%10]), r.randint(low=0, high=(i*37)%50+1, size=2)[1]]
//
// p = 0 and p = 1 still draw, so a miscount shifts every later value.
func TestBinomialAndRandintMatchNumpy(t *testing.T) {
	want := []int64{0, 0, 0, 9, 1, 16, 1, 1, 0, 27, 1, 1, 0, 22, 0, 9, 1, 1, 0, 14, 0, 16, 0, 1, 1, 2, 1, 19, 0, 7, 1, 3, 0, 3, 0, 29, 1, 16, 0, 3, 1, 5, 0, 24, 1, 8, 0, 0, 0, 18, 1, 22, 0, 8, 1, 30, 0, 5, 0, 15, 0, 1, 0, 18, 1, 17, 0, 20, 0, 1, 1, 41, 0, 31, 0, 9, 0, 2, 0, 0}
	ps := []float64{0.5, 0.0, 1.0, 0.9, 0.1, 0.999999, 1e-9, 0.3, 0.7, 0.5}
	r := New(5)
	var got []int64
	for i := range 40 {
		b, ok := r.Binomial(1, ps[i%len(ps)])
		if !ok {
			t.Fatalf("Binomial(1, %v) not ok", ps[i%len(ps)])
		}
		high := uint64((i*37)%50 + 1)
		r.Interval(high - 1)
		got = append(got, b, int64(r.Interval(high-1)))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	r = New(5)
	if a, b := r.Float64(), r.Float64(); a != 0.22199317108973948 || b != 0.8707323061773764 {
		t.Fatalf("Float64 = %v, %v; numpy random_sample gives 0.22199317108973948, 0.8707323061773764", a, b)
	}
	if _, ok := New(1).Binomial(100, 0.5); ok {
		t.Fatal("Binomial(100, 0.5) needs BTPE, want ok=false")
	}
}
