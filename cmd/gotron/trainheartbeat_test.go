package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/launch"
)

// TestHeartbeatFlags: --heartbeat-timeout and Megatron's names for it, the
// launcher's default through the environment, and bad values refused.
func TestHeartbeatFlags(t *testing.T) {
	resolve := func(envTimeout string, args ...string) (joinOptions, string, error) {
		var h heartbeatFlags
		fs := flag.NewFlagSet("train", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		h.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var errb strings.Builder
		env := &cli{stderr: &errb, getenv: func(k string) string {
			if k == launch.HeartbeatTimeoutEnv {
				return envTimeout
			}
			return ""
		}}
		jo, err := h.resolve(env, given, args)
		return jo, errb.String(), err
	}
	for _, c := range []struct {
		env           string
		args          []string
		timeout, ivl  time.Duration
		note, wantErr string
	}{
		{"", nil, 20 * time.Second, 0, "", ""},
		{"5s", nil, 5 * time.Second, 0, "", ""},
		{"5s", []string{"--heartbeat-timeout", "7.5"}, 7500 * time.Millisecond, 0, "", ""},
		{"", []string{"--inprocess-heartbeat-timeout", "60", "--inprocess-heartbeat-interval", "30"}, time.Minute, 30 * time.Second, "", ""},
		{"", []string{"--enable-ft-package"}, 20 * time.Second, 0, "--enable-ft-package: gotron's own heartbeats", ""},
		{"", []string{"--heartbeat-timeout", "-1"}, 0, 0, "", "--heartbeat-timeout -1: want seconds above 0"},
		{"", []string{"--heartbeat-timeout", "0"}, 0, 0, "", "--heartbeat-timeout 0: want seconds above 0"},
		{"", []string{"--heartbeat-timeout", "2", "--heartbeat-interval", "2"}, 0, 0, "", "--heartbeat-interval 2: want seconds above 0 and below the heartbeat timeout (2s)"},
		{"soon", nil, 0, 0, "", `GOTRON_HEARTBEAT_TIMEOUT="soon"`},
	} {
		jo, note, err := resolve(c.env, c.args...)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s %v: error %v, want %q", c.env, c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil || jo.heartbeatTimeout != c.timeout || jo.heartbeatInterval != c.ivl || !strings.Contains(note, c.note) {
			t.Errorf("%s %v: %+v, %q, %v; want timeout %v interval %v note %q", c.env, c.args, jo, note, err, c.timeout, c.ivl, c.note)
		}
	}
	a, _, _ := resolve("", "--heartbeat-timeout", "10")
	b, _, _ := resolve("", "--heartbeat-timeout", "11")
	if a.flagsHash == b.flagsHash || len(a.flagsHash) != 12 {
		t.Errorf("flags hashes %q and %q", a.flagsHash, b.flagsHash)
	}
}

// TestFTFlags: Megatron's fault-tolerance flags are accepted with a note
// (--enable-ft-package) or refused with the reason (its section timeouts).
func TestFTFlags(t *testing.T) {
	_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", "--enable-ft-package")...)
	if code != 0 || !strings.Contains(errs, "--enable-ft-package: gotron's own heartbeats stand in") {
		t.Errorf("--enable-ft-package: exit %d, stderr %q", code, errs)
	}
	for _, flag := range []string{"--calc-ft-timeouts", "--ft-num-warmup-iters=5"} {
		_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", flag)...)
		if code == 0 || !strings.Contains(errs, "section timeouts are not built") {
			t.Errorf("%s: exit %d, stderr %q; want a refusal", flag, code, errs)
		}
	}
}
