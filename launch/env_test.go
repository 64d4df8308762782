package launch

import (
	"reflect"
	"strings"
	"testing"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// TestDetectEnv covers every launcher's variables and DetectEnv's
// precedence.
func TestDetectEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"no launcher", nil,
			Env{WorldSize: 1, LocalWorldSize: 1, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "default"}},
		{"no launcher, master set", map[string]string{"MASTER_ADDR": "h", "MASTER_PORT": "1234"},
			Env{WorldSize: 1, LocalWorldSize: 1, NNodes: 1, MasterAddr: "h", MasterPort: 1234, Source: "default"}},
		{"torchrun", map[string]string{"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
			"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29400",
			"TORCHELASTIC_RESTART_COUNT": "2"},
			Env{Rank: 5, LocalRank: 1, WorldSize: 8, LocalWorldSize: 4, NodeRank: 1, NNodes: 2,
				MasterAddr: "node0", MasterPort: 29400, RestartCount: 2, Source: "torchrun"}},
		{"torchrun without GROUP_*", map[string]string{"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
			Env{Rank: 6, LocalRank: 2, WorldSize: 8, LocalWorldSize: 4, NodeRank: 1, NNodes: 2,
				MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "torchrun"}},
		{"torchrun beats PET, Slurm and MPI", map[string]string{"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
			"PET_NPROC_PER_NODE": "4", "PET_NNODES": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "0",
			"OMPI_COMM_WORLD_SIZE": "1", "MASTER_ADDR": "m", "MASTER_PORT": "1"},
			Env{Rank: 3, LocalRank: 3, WorldSize: 4, LocalWorldSize: 4, NodeRank: 0, NNodes: 1, MasterAddr: "m", MasterPort: 1, Source: "torchrun"}},
		{"kubeflow one process per pod", map[string]string{"RANK": "2", "WORLD_SIZE": "3", "PET_NODE_RANK": "2", "PET_NNODES": "3",
			"PET_NPROC_PER_NODE": "1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
			Env{Rank: 2, WorldSize: 3, LocalWorldSize: 1, NodeRank: 2, NNodes: 3, MasterAddr: "job-master-0", MasterPort: 23456, Source: "kubeflow"}},
		{"kubeflow elastic nnodes", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "PET_NNODES": "1:4",
			"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"},
			Env{Rank: 1, WorldSize: 2, LocalWorldSize: 1, NodeRank: 1, NNodes: 2, MasterAddr: "job-master-0", MasterPort: 23456, Source: "kubeflow"}},
		{"kubeflow beats Slurm", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "PET_NNODES": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
			Env{Rank: 0, WorldSize: 2, LocalWorldSize: 1, NodeRank: 0, NNodes: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "kubeflow"}},
		{"plain RANK/WORLD_SIZE", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"},
			Env{Rank: 1, WorldSize: 2, LocalWorldSize: 1, NodeRank: 1, NNodes: 2, MasterAddr: "10.0.0.1", MasterPort: 6000, Source: "env"}},
		{"slurm", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
			"SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "node[01-04,07],gpu-a[1-2]", "SLURM_JOB_ID": "1234567"},
			Env{Rank: 6, LocalRank: 2, WorldSize: 8, LocalWorldSize: 4, NodeRank: 1, NNodes: 2, MasterAddr: "node01", MasterPort: 19567, Source: "slurm"}},
		{"slurm uneven tasks, step nodelist, MASTER_PORT", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0",
			"SLURM_NODEID": "3", "SLURM_NNODES": "4", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_NODELIST": "gpu[08-11]",
			"SLURM_JOB_NODELIST": "gpu[01-11]", "MASTER_PORT": "7000", "SLURM_JOB_ID": "12"},
			Env{Rank: 6, WorldSize: 7, LocalWorldSize: 1, NodeRank: 3, NNodes: 4, MasterAddr: "gpu08", MasterPort: 7000, Source: "slurm"}},
		{"slurm single task, short job id", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "42", "SLURM_NODELIST": "n1"},
			Env{WorldSize: 1, LocalWorldSize: 1, NNodes: 1, MasterAddr: "n1", MasterPort: 15042, Source: "slurm"}},
		{"slurm beats MPI", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
			"PMI_RANK": "0", "PMI_SIZE": "2"},
			Env{Rank: 1, LocalRank: 1, WorldSize: 2, LocalWorldSize: 2, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "slurm"}},
		{"open mpi", map[string]string{"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "head", "PMI_RANK": "0", "PMI_SIZE": "1"},
			Env{Rank: 5, LocalRank: 1, WorldSize: 8, LocalWorldSize: 4, NodeRank: 1, NNodes: 2, MasterAddr: "head", MasterPort: 29500, Source: "openmpi"}},
		{"open mpi one node", map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
			Env{Rank: 2, LocalRank: 2, WorldSize: 4, LocalWorldSize: 4, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "openmpi"}},
		{"mpich", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "5000"},
			Env{Rank: 3, LocalRank: 1, WorldSize: 4, LocalWorldSize: 2, NodeRank: 1, NNodes: 2, MasterAddr: "h0", MasterPort: 5000, Source: "mpich"}},
		{"mpich without local ids", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2"},
			Env{Rank: 1, LocalRank: 1, WorldSize: 2, LocalWorldSize: 2, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "mpich"}},
	} {
		got, err := DetectEnv(envOf(c.env))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// TestDetectEnvErrors checks that missing, malformed and inconsistent values
// are errors naming the variables involved.
func TestDetectEnvErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"rank beyond world", map[string]string{"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, []string{"RANK=4", "WORLD_SIZE=4"}},
		{"local rank beyond local world", map[string]string{"RANK": "1", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, []string{"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
		{"local world beyond world", map[string]string{"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, []string{"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"}},
		{"torchrun missing WORLD_SIZE", map[string]string{"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, []string{"WORLD_SIZE is not"}},
		{"torchrun missing RANK", map[string]string{"LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, []string{"LOCAL_RANK is set but RANK"}},
		{"group rank", map[string]string{"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2"}, []string{"GROUP_RANK=2", "GROUP_WORLD_SIZE=2"}},
		{"not a number", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, []string{`RANK="one"`}},
		{"negative", map[string]string{"RANK": "-1", "WORLD_SIZE": "2"}, []string{`RANK="-1"`}},
		{"plain missing WORLD_SIZE", map[string]string{"RANK": "0"}, []string{"RANK is set but WORLD_SIZE"}},
		{"bad port", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, []string{"port 99999"}},
		{"port text", map[string]string{"MASTER_PORT": "http"}, []string{`MASTER_PORT="http"`}},
		{"kubeflow launcher pod", map[string]string{"RANK": "1", "WORLD_SIZE": "8", "PET_NPROC_PER_NODE": "4", "PET_NNODES": "2"}, []string{"PET_NPROC_PER_NODE=4", "gotron launch"}},
		{"kubeflow rank mismatch", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "PET_NODE_RANK": "0", "PET_NNODES": "2"}, []string{"RANK=1", "PET_NODE_RANK=0"}},
		{"kubeflow size mismatch", map[string]string{"RANK": "1", "WORLD_SIZE": "3", "PET_NNODES": "2"}, []string{"PET_NNODES=2", "WORLD_SIZE=3"}},
		{"kubeflow elastic without WORLD_SIZE", map[string]string{"RANK": "1", "PET_NNODES": "1:2"}, []string{"WORLD_SIZE is not", "PET_NNODES=1:2"}},
		{"slurm procid", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, []string{"SLURM_PROCID=2", "SLURM_NTASKS=2"}},
		{"slurm missing ntasks", map[string]string{"SLURM_PROCID": "0"}, []string{"SLURM_NTASKS is not"}},
		{"slurm tasks per node sum", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "3(x2)"}, []string{"SLURM_TASKS_PER_NODE", "sums to 6", "SLURM_NTASKS=8"}},
		{"slurm tasks per node count", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "6", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "3(x2)"}, []string{"lists 2 nodes", "SLURM_NNODES=3"}},
		{"slurm tasks per node syntax", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "6", "SLURM_TASKS_PER_NODE": "3(2)"}, []string{"SLURM_TASKS_PER_NODE"}},
		{"slurm node id", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "2", "SLURM_NNODES": "2"}, []string{"SLURM_NODEID=2", "SLURM_NNODES=2"}},
		{"slurm local id", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2"}, []string{"SLURM_LOCALID=2"}},
		{"slurm bad nodelist", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "node[1-"}, []string{"SLURM_JOB_NODELIST", "node[1-"}},
		{"slurm multinode without nodelist", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "2"}, []string{"SLURM_JOB_NODELIST", "MASTER_ADDR"}},
		{"slurm job id", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "x1"}, []string{`SLURM_JOB_ID="x1"`}},
		{"open mpi missing size", map[string]string{"OMPI_COMM_WORLD_RANK": "0"}, []string{"OMPI_COMM_WORLD_SIZE is not"}},
		{"open mpi local", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, []string{"OMPI_COMM_WORLD_LOCAL_RANK=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4"}},
		{"open mpi multinode needs master", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, []string{"MASTER_ADDR", "OMPI_COMM_WORLD_SIZE=4"}},
		{"mpich rank", map[string]string{"PMI_RANK": "4", "PMI_SIZE": "4"}, []string{"PMI_RANK=4", "PMI_SIZE=4"}},
	} {
		_, err := DetectEnv(envOf(c.env))
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
}

func TestParseHostlist(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"node1", []string{"node1"}},
		{"node[01-04,07],gpu-a[1-2]", []string{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}},
		{"n[08-10]", []string{"n08", "n09", "n10"}},
		{"a,b,c", []string{"a", "b", "c"}},
		{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}},
		{"h[5]", []string{"h5"}},
		{"[1-2]x", []string{"1x", "2x"}},
		{"h[9-11]-ib", []string{"h9-ib", "h10-ib", "h11-ib"}},
	} {
		got, err := ParseHostlist(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: got %v, want %v", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"", "a,,b", "n[1-", "n1-2]", "n[a-b]", "n[3-1]", "n[1-2", "n[[1]]", "n[-1]", "n[1-]", "n[0-99999999]", "n[]"} {
		if got, err := ParseHostlist(bad); err == nil {
			t.Errorf("%q: no error, got %v", bad, got)
		}
	}
}

func TestParseTasksPerNode(t *testing.T) {
	got, err := parseTasksPerNode("2(x3),1,4(x1)")
	if err != nil || !reflect.DeepEqual(got, []int{2, 2, 2, 1, 4}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "2(x)", "2(3)", "0", "2(x0)", "2(x2", "-1"} {
		if _, err := parseTasksPerNode(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
