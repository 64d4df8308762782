package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

const versionSynopsis = "version   (module version, VCS revision and time, Go version, OS/arch)"

// cmdVersion prints what the binary was built from, as the Go toolchain
// recorded it: the module version ("(devel)" for a build inside the
// repository, vX.Y.Z for go install ...@vX.Y.Z) and, for a build with VCS
// stamping, the commit, its time and whether the tree had local changes.
func cmdVersion(_ context.Context, env *cli, args []string) error {
	fs := newFlags("version", versionSynopsis)
	if err := parseFlags(fs, args, env.stdout, versionSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fmt.Fprintln(env.stdout, versionText())
	return nil
}

func versionText() string {
	version, rev, when, modified := "unknown", "", "", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = " (modified)"
				}
			}
		}
	}
	if version == "" {
		version = "unknown"
	}
	out := "gotron " + version
	if rev != "" {
		out += " commit " + rev + modified
		if when != "" {
			out += " " + when
		}
	} else {
		out += " (no VCS information: built with -buildvcs=false or outside a git checkout)"
	}
	return out + fmt.Sprintf(" %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
