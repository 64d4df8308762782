package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// errHelp is returned by a command after it printed its --help text.
var errHelp = errors.New("help requested")

// newFlags returns a flag set that reports errors instead of exiting, so every
// command can turn a bad flag into a clear message.
func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	_ = synopsis
	return fs
}

// parseFlags parses Megatron-style flags (--name value, --name=value, --bool)
// anywhere among the positional arguments. Unknown flags are rejected with the
// nearest valid name. --help prints the flags to w and returns errHelp. If the
// flag set defines "config" and it is set, the YAML file it names supplies
// values for every flag not given on the command line (command-line flags
// override the file).
func parseFlags(fs *flag.FlagSet, args []string, w io.Writer, synopsis string) error {
	return parseFlagsHelp(fs, args, w, helpText{synopsis: synopsis})
}

// helpText is what --help prints: the synopsis and the flags for which show
// returns true (nil: every flag), then note, if any.
type helpText struct {
	synopsis string
	show     func(name string) bool
	note     string
	// command makes the first positional argument end the flags: the rest
	// is a command line of its own (gotron launch ... train --lr 1e-4).
	command bool
	// group, if set, lists first under its own title the flags it holds
	// that Megatron's training-argument table lacks (gotron inference:
	// the arguments of Megatron's inference scripts).
	group *helpGroup
}

// helpGroup is a --help group of Megatron arguments outside Megatron's
// training-argument table.
type helpGroup struct {
	title string
	has   func(name string) bool
}

// parseFlagsHelp is parseFlags with a --help that lists only some flags:
// for commands that accept flags of another command (gotron memory takes
// every gotron train flag) or keep a shared flag they refuse.
//
// The flags are defined on a standard library flag.FlagSet (typed values,
// Visit for "given on the command line") and parsed by spf13/pflag, which
// gives GNU-style parsing: flags after positional arguments, --name=value,
// "--" to end the flags. Every pflag value sets its flag through fs.Set, so
// fs.Visit still reports the flags the command line gave; the positional
// arguments are handed back to fs, so fs.Args works as before.
func parseFlagsHelp(fs *flag.FlagSet, args []string, w io.Writer, help helpText) error {
	if !help.command {
		for _, a := range args {
			if a == "--" {
				break
			}
			if a == "-h" || a == "--help" || a == "-help" {
				printFlags(fs, w, help)
				return errHelp
			}
		}
	}
	pf := pflagSet(fs)
	pf.SetInterspersed(!help.command)
	if err := pf.Parse(joinListArgs(fs, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			printFlags(fs, w, help)
			return errHelp
		}
		return explainFlagError(fs, err)
	}
	// "--" first: the standard parser takes every positional argument as
	// one, even one that starts with a dash.
	if err := fs.Parse(append([]string{"--"}, pf.Args()...)); err != nil {
		return err
	}
	if cf := fs.Lookup("config"); cf != nil && cf.Value.String() != "" {
		if err := applyConfigFile(fs, cf.Value.String()); err != nil {
			return err
		}
	}
	return nil
}

// pflagSet returns a pflag set with one flag for each of fs's, whose value
// sets fs's flag.
func pflagSet(fs *flag.FlagSet) *pflag.FlagSet {
	pf := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	pf.SetOutput(io.Discard)
	pf.Usage = func() {}
	pf.SortFlags = false
	fs.VisitAll(func(f *flag.Flag) {
		pfl := &pflag.Flag{Name: f.Name, Usage: f.Usage, DefValue: f.DefValue,
			Value: stdFlagValue{fs: fs, f: f}}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			pfl.NoOptDefVal = "true"
		}
		pf.AddFlag(pfl)
	})
	return pf
}

// stdFlagValue is a pflag.Value that sets a standard library flag through
// its FlagSet, so the set records it as given.
type stdFlagValue struct {
	fs *flag.FlagSet
	f  *flag.Flag
}

func (v stdFlagValue) String() string     { return v.f.Value.String() }
func (v stdFlagValue) Set(s string) error { return v.fs.Set(v.f.Name, s) }
func (v stdFlagValue) Type() string       { return flagTypeName(v.f) }

// flagTypeName is the short type name --help shows after a flag.
func flagTypeName(f *flag.Flag) string {
	if _, ok := f.Value.(*listFlag); ok {
		return "list"
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool:
			return "bool"
		case int, int64:
			return "int"
		case uint, uint64:
			return "uint"
		case float64:
			return "float"
		case time.Duration:
			return "duration"
		}
	}
	return "string"
}

func explainFlagError(fs *flag.FlagSet, err error) error {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	var notExist *pflag.NotExistError
	var needsValue *pflag.ValueRequiredError
	var invalid *pflag.InvalidValueError
	switch {
	case errors.As(err, &notExist):
		if short := notExist.GetSpecifiedShortnames(); short != "" {
			// "-lr": one dash makes pflag read single-letter flags.
			name, _, _ := strings.Cut(short, "=")
			if fs.Lookup(name) != nil {
				return fmt.Errorf("-%s: flags take two dashes: --%s", short, name)
			}
			return fmt.Errorf("unknown flag -%s (flags take two dashes; see --help)", short)
		}
		name := notExist.GetSpecifiedName()
		if msg := megatronOnlyFlag(fs.Name(), name); msg != "" {
			return errors.New(msg)
		}
		out := fmt.Sprintf("unknown flag --%s", name)
		if s := nearest(name, names); s != "" {
			out += fmt.Sprintf(" (did you mean --%s?)", s)
		}
		return errors.New(out)
	case errors.As(err, &needsValue):
		name := needsValue.GetSpecifiedName()
		return fmt.Errorf("flag --%s needs a value (a %s; see --help)", name, flagTypeName(fs.Lookup(name)))
	case errors.As(err, &invalid):
		name := invalid.GetFlag().Name
		why := invalid.Unwrap().Error()
		if want := flagType(fs.Lookup(name)); want != "" && strings.Contains(why, "parse error") {
			why = "want " + want // the flag package's own words are "parse error"
		}
		return fmt.Errorf("invalid value %q for flag --%s: %s (see --help)", invalid.GetValue(), name, why)
	}
	return fmt.Errorf("%v (see --help)", err)
}

// printFlags writes --help: the synopsis, then the flags in Megatron's
// argument groups (in the order of Megatron's arguments.py), each with its
// type and default, then gotron's own flags.
func printFlags(fs *flag.FlagSet, w io.Writer, help helpText) {
	fmt.Fprintf(w, "Usage: gotron %s\n", help.synopsis)
	groups := map[string][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if help.show != nil && !help.show(f.Name) {
			return
		}
		g := gotronGroup
		if a, ok := megatronArgs()[f.Name]; ok {
			g = a.group
		} else if help.group != nil && help.group.has(f.Name) {
			g = help.group.title
		}
		groups[g] = append(groups[g], f)
	})
	order := append(megatronGroupOrder(), gotronGroup)
	if help.group != nil {
		order = append([]string{help.group.title}, order...)
	}
	for _, g := range order {
		flags := groups[g]
		if len(flags) == 0 {
			continue
		}
		title := g
		if g != gotronGroup {
			title = "Megatron: " + g
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, f := range flags {
			fmt.Fprintf(w, "  --%s %s\n        %s%s\n", f.Name, flagTypeName(f), f.Usage, defaultText(f))
		}
	}
	if help.note != "" {
		fmt.Fprintf(w, "\n%s\n", help.note)
	}
}

// gotronGroup is the --help group of flags Megatron-LM does not have.
const gotronGroup = "gotron (no Megatron-LM equivalent)"

// defaultText is " (default V)" for a flag, or "" where the default is
// nothing (an empty string or list, a false boolean).
func defaultText(f *flag.Flag) string {
	switch {
	case f.DefValue == "" || strings.Contains(f.Usage, "(default"):
		return "" // empty, or the usage says it in words
	case flagTypeName(f) == "bool" && f.DefValue == "false":
		return ""
	case flagTypeName(f) == "string":
		return fmt.Sprintf(" (default %q)", f.DefValue)
	}
	return fmt.Sprintf(" (default %s)", f.DefValue)
}

// applyConfigFile sets every flag named by a key of the YAML mapping in path,
// unless it was given on the command line. Keys may use '-' or '_' (Megatron's
// YAML configs use underscores).
func applyConfigFile(fs *flag.FlagSet, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var kv map[string]any
	if err := yaml.Unmarshal(raw, &kv); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		f := fs.Lookup(name)
		if f == nil {
			msg := fmt.Sprintf("--config %s: unknown key %q", path, k)
			if s := nearest(name, names); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return errors.New(msg)
		}
		if given[name] || name == "config" {
			continue
		}
		v := kv[k]
		var s string
		switch x := v.(type) {
		case nil:
			continue
		case []any:
			// Only a list flag (Megatron's nargs='*': --data-path) takes a
			// YAML list; joining one into a scalar flag would make
			// "save: [a, b]" the directory "a b".
			if _, ok := f.Value.(*listFlag); !ok {
				return fmt.Errorf("--config %s: key %q: value %s is a YAML list; flag --%s takes a single value", path, k, yamlText(v), name)
			}
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			s = strings.Join(parts, " ")
		case map[string]any:
			return fmt.Errorf("--config %s: key %q: a mapping, want a value for flag --%s", path, k, name)
		default:
			s = fmt.Sprint(x)
		}
		if err := fs.Set(name, s); err != nil {
			if want := flagType(f); want != "" {
				return fmt.Errorf("--config %s: key %q: value %s (YAML %s) is not %s (flag --%s)", path, k, yamlText(v), yamlKind(v), want, name)
			}
			return fmt.Errorf("--config %s: key %q: value %s (YAML %s): %v (flag --%s)", path, k, yamlText(v), yamlKind(v), err, name)
		}
	}
	return nil
}

// flagType says what a flag's value must be, for error messages; "" for
// flag types whose own Set error says it.
func flagType(f *flag.Flag) string {
	if _, ok := f.Value.(*listFlag); ok {
		return "a list of strings"
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case bool:
		return "a boolean (true or false)"
	case int, int64:
		return "an integer"
	case uint, uint64:
		return "a non-negative integer"
	case float64:
		return "a number"
	case string:
		return "a string"
	case time.Duration:
		return "a duration (e.g. 30s)"
	}
	return ""
}

// yamlKind names the YAML type a value was decoded as.
func yamlKind(v any) string {
	switch v.(type) {
	case bool:
		return "boolean"
	case int, int64, uint64:
		return "integer"
	case float64:
		return "float"
	case string:
		return "string"
	case []any:
		return "list"
	}
	return fmt.Sprintf("%T", v)
}

// yamlText writes a YAML value back for error messages: strings quoted.
func yamlText(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// nearest returns the candidate closest to s by edit distance, or "" if none is
// plausibly what the user meant.
func nearest(s string, candidates []string) string {
	best, bestD := "", len(s)/2+2
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// listFlag is a flag taking several values, like Megatron's nargs='*'
// options (--data-path 30 a 70 b): the values following it up to the next
// --flag are joined with spaces.
type listFlag struct{ values []string }

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.values, " ")
}

func (l *listFlag) Set(s string) error {
	l.values = append(l.values, strings.Fields(s)...)
	return nil
}

// joinListArgs rewrites "--name v1 v2 v3" into "--name=v1 v2 v3" for every
// listFlag so the standard parser sees one value.
func joinListArgs(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		name := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") || strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if _, ok := f.Value.(*listFlag); !ok {
			continue
		}
		var vals []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			i++
			vals = append(vals, args[i])
		}
		out[len(out)-1] = "--" + name + "=" + strings.Join(vals, " ")
	}
	return out
}
