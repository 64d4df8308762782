package launch_test

import (
	"fmt"

	"github.com/gotron/gotron/launch"
)

// A worker started by "srun -N2 --ntasks-per-node=4" finds its rank, and the
// master is the first host of the node list.
func ExampleDetectEnv() {
	vars := map[string]string{
		"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
		"SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242",
	}
	e, err := launch.DetectEnv(func(k string) string { return vars[k] })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: rank %d of %d (local %d of %d), master %s:%d\n",
		e.Source, e.Rank, e.WorldSize, e.LocalRank, e.LocalWorldSize, e.MasterAddr, e.MasterPort)
	// Output: slurm: rank 5 of 8 (local 1 of 4), master gpu07:19242
}

func ExampleParseHostlist() {
	hosts, _ := launch.ParseHostlist("node[01-03,07],gpu-a[1-2]")
	fmt.Println(hosts)
	// Output: [node01 node02 node03 node07 gpu-a1 gpu-a2]
}
