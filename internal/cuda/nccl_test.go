package cuda

import (
	"testing"
)

// A one-rank communicator: every collective is a copy, which checks the
// bindings (argument order, the by-value id, the stream) on one GPU.
func TestGPUNCCLOneRank(t *testing.T) {
	d := gpu(t)
	v, path, err := NCCLVersion()
	if err != nil {
		t.Skip("no NCCL: ", err)
	}
	t.Logf("NCCL %d from %s", v, path)
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.NewComm(id, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	}()
	const n = 1000
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i) - 3.25
	}
	src := upload(t, d, x)
	dst, _ := d.Alloc(4 * n)
	defer func() { d.Free(src); d.Free(dst) }()
	check := func(what string) {
		t.Helper()
		y := download(t, d, dst, n)
		for i := range x {
			if y[i] != x[i] {
				t.Fatalf("%s [%d] = %g, want %g", what, i, y[i], x[i])
			}
		}
		if err := d.Memset(dst, 4*n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AllReduce(src, dst, n, NCCLFloat32, ReduceSum); err != nil {
		t.Fatal(err)
	}
	check("AllReduce")
	if err := c.AllGather(src, dst, n, NCCLFloat32); err != nil {
		t.Fatal(err)
	}
	check("AllGather")
	if err := c.ReduceScatter(src, dst, n, NCCLFloat32, ReduceMax); err != nil {
		t.Fatal(err)
	}
	check("ReduceScatter")
	if err := c.Broadcast(src, dst, n, NCCLFloat32, 0); err != nil {
		t.Fatal(err)
	}
	check("Broadcast")
	if err := NCCLGroupStart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(src, n, NCCLFloat32, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Recv(dst, n, NCCLFloat32, 0); err != nil {
		t.Fatal(err)
	}
	if err := NCCLGroupEnd(); err != nil {
		t.Fatal(err)
	}
	check("Send/Recv to self")
	if _, err := d.NewComm(id, 2, 2); err == nil {
		t.Errorf("rank 2 of 2 accepted")
	}
}

// Where a library is installed (the driver library and cuBLAS exist on
// machines without a GPU too), every symbol the package binds must exist:
// this catches a misspelt name without a GPU.
func TestInstalledLibrariesHaveAllSymbols(t *testing.T) {
	type loader struct {
		name   string
		search libSearch
		load   func() error
	}
	for _, l := range []loader{
		{"driver", driverSearch(), func() error { _, err := loadDriver(); return err }},
		{"cuBLAS", cublasSearch(), func() error { _, err := loadBLAS(); return err }},
		{"NCCL", ncclSearch(), func() error { _, err := loadNCCL(); return err }},
	} {
		if _, path, err := l.search.open(); err != nil {
			t.Logf("%s not installed: skipped", l.name)
			continue
		} else if err := l.load(); err != nil {
			t.Errorf("%s at %s: %v", l.name, path, err)
		} else {
			t.Logf("%s at %s: all symbols found", l.name, path)
		}
	}
}
