package main

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"
)

// megatronArgumentsTSV is Megatron-LM's list of training arguments as its
// own argparse parser builds it (megatron/training/arguments.py at
// d98e8a6), written by tools/megatroncompat/extract_args.py: group, option
// strings, dest, type, default, nargs, choices.
//
//go:embed megatron_arguments.tsv
var megatronArgumentsTSV string

// megatronArg is one of Megatron-LM's training arguments.
type megatronArg struct {
	group string // argparse group title ("network size", "checkpointing", ...)
	name  string // first option string without the dashes
	typ   string // argparse type (int, float, str, bool for store_true/false)
	def   string // default, as Python's repr
}

// megatronTable is Megatron's arguments by every option string (without
// dashes) and its groups in the order arguments.py adds them.
type megatronTable struct {
	byName map[string]megatronArg
	groups []string
	count  int // arguments (an argument with two option strings counts once)
}

var loadMegatronTable = sync.OnceValue(func() megatronTable {
	t := megatronTable{byName: map[string]megatronArg{}}
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSpace(megatronArgumentsTSV), "\n") {
		cells := strings.Split(line, "\t")
		if i == 0 || len(cells) < 5 {
			continue // header
		}
		opts := strings.Split(cells[1], ",")
		a := megatronArg{group: cells[0], name: strings.TrimLeft(opts[0], "-"), typ: cells[3], def: cells[4]}
		for _, o := range opts {
			t.byName[strings.TrimLeft(o, "-")] = a
		}
		t.count++
		if !seen[a.group] {
			seen[a.group] = true
			t.groups = append(t.groups, a.group)
		}
	}
	return t
})

// megatronArgs returns Megatron-LM's training arguments by option name
// (without dashes).
func megatronArgs() map[string]megatronArg { return loadMegatronTable().byName }

// megatronGroupOrder returns Megatron's argument groups in arguments.py's order.
func megatronGroupOrder() []string { return loadMegatronTable().groups }

// megatronOnlyFlag explains a flag that a gotron command does not define but
// Megatron-LM does; "" if Megatron does not have it either.
func megatronOnlyFlag(command, name string) string {
	a, ok := megatronArgs()[name]
	if !ok {
		return ""
	}
	return fmt.Sprintf("--%s is a Megatron-LM argument (group %q) that gotron %s does not take", name, a.group, command)
}
