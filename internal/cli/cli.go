// Package cli implements the toolgate command: every subcommand runs through
// Run with injected arguments and streams, so tests capture its output and
// exit code exactly as an operator would see them.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes shared by every subcommand.
const (
	ExitOK       = 0 // success; for decide and call: allowed / ran
	ExitFailure  = 1 // bad input, invalid bundle, I/O failure
	ExitUsage    = 2 // wrong flags or arguments
	ExitDenied   = 3 // decide/call: the decision denied
	ExitApproval = 4 // decide/call: the decision requires approval
	ExitToolFail = 5 // call: the tool itself failed
)

// IO is the streams a command uses.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, io IO) int
}

// commandTable lists the subcommands.
func commandTable() map[string]command {
	out := map[string]command{}
	for _, c := range []command{
		{"validate", "check a policy bundle: errors and warnings with file and line", runValidate},
		{"resolve", "show an agent's active, authorized and disclosed tool sets", runResolve},
		{"decide", "decide one tool call (exit 0 allow, 3 deny, 4 approval)", runDecide},
		{"explain", "show every layer's verdict for one tool call", runExplain},
		{"call", "decide and run one tool call, recorded (exit 0 ran, 3 deny, 4 approval, 5 tool failed)", runCall},
		{"serve", "run the MCP gateway and JSON API (default 127.0.0.1:8420)", runServe},
	} {
		out[c.name] = c
	}
	for _, c := range extraCommands() {
		out[c.name] = c
	}
	return out
}

// Run executes "toolgate ARGS..." and returns the process exit code. Errors
// are one clear line on stderr, never a stack trace.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	io := IO{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "toolgate "+Version)
		return ExitOK
	}
	c, ok := commandTable()[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "toolgate: unknown command %q (run toolgate help)\n", args[0])
		return ExitUsage
	}
	return c.run(ctx, args[1:], io)
}

// Version is the toolgate release, set at build time with -ldflags.
var Version = "0.1.0-dev"

func usage(w io.Writer) {
	fmt.Fprintln(w, "toolgate: the tool authorization gateway for AI agents")
	fmt.Fprintln(w, "\nUsage: toolgate COMMAND [flags]\n\nCommands:")
	commands := commandTable()
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun toolgate COMMAND -h for a command's flags.")
}

// newFlags returns a FlagSet that reports errors to stderr and never exits.
func newFlags(name string, io IO) *flag.FlagSet {
	fs := flag.NewFlagSet("toolgate "+name, flag.ContinueOnError)
	fs.SetOutput(io.Stderr)
	return fs
}

// parse parses flags; it returns an exit code and false when the caller
// should return it.
func parse(fs *flag.FlagSet, args []string) (int, bool) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
			return ExitOK, false
		}
		fmt.Fprintf(out, "%s: %v (run %s -h)\n", fs.Name(), err, fs.Name())
		return ExitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return ExitUsage, false
	}
	return 0, true
}

func bundleFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("TOOLGATE_BUNDLE")
	return fs.String("bundle", def, "policy bundle folder (default $TOOLGATE_BUNDLE)")
}

func outputFlag(fs *flag.FlagSet) *string {
	return fs.String("o", "text", "output format: text or json")
}

func checkOutput(o string, stderr io.Writer) bool {
	if o != "text" && o != "json" {
		fmt.Fprintf(stderr, "toolgate: -o %q: want text or json\n", o)
		return false
	}
	return true
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func fail(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "toolgate: "+format+"\n", args...)
	return ExitFailure
}
