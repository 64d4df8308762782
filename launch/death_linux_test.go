package launch

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLauncherKilledWorkersDie: after kill -9 of the launcher, its workers
// die too (parent-death signal) instead of running on as orphans.
func TestLauncherKilledWorkersDie(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "LAUNCH_TEST_WORKER=launcher")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	re := regexp.MustCompile(`^\[rank\d\]: pid (\d+)$`)
	sc := bufio.NewScanner(stdout)
	var pidfds []int
	for len(pidfds) < 2 && sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			t.Fatalf("unexpected line %q", sc.Text())
		}
		pid, _ := strconv.Atoi(m[1])
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			cmd.Process.Kill()
			t.Fatalf("pidfd_open %d: %v", pid, err)
		}
		defer unix.Close(fd)
		pidfds = append(pidfds, fd)
	}
	if len(pidfds) < 2 {
		cmd.Process.Kill()
		for _, fd := range pidfds {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		t.Fatalf("launcher printed %d worker pids", len(pidfds))
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i, fd := range pidfds {
		// A pidfd becomes readable when its process exits.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 20_000)
		for err == unix.EINTR {
			n, err = unix.Poll(fds, 20_000)
		}
		if err != nil || n != 1 {
			t.Errorf("worker %d still running 20s after the launcher was killed (poll: %d, %v)", i, n, err)
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
	}
}
