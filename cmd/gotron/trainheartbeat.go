package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/launch"
)

// heartbeatFlags are gotron train's failure-detection flags. Megatron's
// in-process restart names the same two settings --inprocess-heartbeat-
// timeout and --inprocess-heartbeat-interval (seconds); they are accepted
// as the same flags. --enable-ft-package turns on NVIDIA's fault-tolerance
// package, whose rank heartbeats gotron's always-on heartbeats play the
// part of: it is accepted with a note. See docs/distributed.md.
type heartbeatFlags struct {
	timeoutSecs, intervalSecs float64
	enableFT                  bool
}

func (h *heartbeatFlags) register(fs *flag.FlagSet) {
	const timeoutUsage = "seconds a rank may send no heartbeat before the others declare it dead and stop, naming it " +
		"(default 20, or gotron launch's --heartbeat-timeout); independent of --distributed-timeout-minutes"
	fs.Float64Var(&h.timeoutSecs, "heartbeat-timeout", 0, timeoutUsage)
	fs.Float64Var(&h.timeoutSecs, "inprocess-heartbeat-timeout", 0, "= --heartbeat-timeout (Megatron's name)")
	fs.Float64Var(&h.intervalSecs, "heartbeat-interval", 0, "seconds between a rank's heartbeats (default an eighth of the timeout, at most 5)")
	fs.Float64Var(&h.intervalSecs, "inprocess-heartbeat-interval", 0, "= --heartbeat-interval (Megatron's name)")
	fs.BoolVar(&h.enableFT, "enable-ft-package", false, "accepted: gotron's heartbeats (--heartbeat-timeout) are always on in multi-process runs")
}

// joinOptions are what gotron train adds to the launcher's environment
// when it joins a tcp world.
type joinOptions struct {
	heartbeatTimeout, heartbeatInterval time.Duration
	flagsHash                           string
}

// resolve checks the flags and returns the join options; args are train's
// command-line arguments, whose hash every rank must share.
func (h *heartbeatFlags) resolve(env *cli, given map[string]bool, args []string) (joinOptions, error) {
	jo := joinOptions{heartbeatTimeout: tcp.DefaultHeartbeatTimeout, flagsHash: flagsHash(args)}
	if v := env.getenv(launch.HeartbeatTimeoutEnv); v != "" && !given["heartbeat-timeout"] && !given["inprocess-heartbeat-timeout"] {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return jo, fmt.Errorf("%s=%q (from gotron launch --heartbeat-timeout): want a positive duration such as 20s", launch.HeartbeatTimeoutEnv, v)
		}
		jo.heartbeatTimeout = d
	}
	if given["heartbeat-timeout"] || given["inprocess-heartbeat-timeout"] {
		if !(h.timeoutSecs > 0 && h.timeoutSecs <= 86400) {
			return jo, fmt.Errorf("--heartbeat-timeout %v: want seconds above 0 and at most 86400", h.timeoutSecs)
		}
		jo.heartbeatTimeout = time.Duration(h.timeoutSecs * float64(time.Second))
	}
	if given["heartbeat-interval"] || given["inprocess-heartbeat-interval"] {
		iv := time.Duration(h.intervalSecs * float64(time.Second))
		if !(h.intervalSecs > 0) || iv >= jo.heartbeatTimeout {
			return jo, fmt.Errorf("--heartbeat-interval %v: want seconds above 0 and below the heartbeat timeout (%v)", h.intervalSecs, jo.heartbeatTimeout)
		}
		jo.heartbeatInterval = iv
	}
	if h.enableFT {
		fmt.Fprintf(env.stderr, "gotron train: --enable-ft-package: gotron's own heartbeats stand in for NVIDIA's fault-tolerance package (timeout %v)\n", jo.heartbeatTimeout)
	}
	return jo, nil
}

// flagsHash is a short hash of train's arguments: ranks started with
// different flags would train different things or deadlock, so the
// rendezvous refuses them.
func flagsHash(args []string) string {
	sum := sha256.Sum256([]byte(strings.Join(args, "\x00")))
	return hex.EncodeToString(sum[:6])
}
