package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/moetuner/moetuner/placement"
)

// DefaultTrace is the bundled Mixtral-8x7B data `plan` uses without --trace.
const DefaultTrace = "testdata/mixtral-8x7b/fiddler"

const usage = `moetuner places Mixture-of-Experts experts on GPUs to cut tail latency.

Usage:
  moetuner stats   TRACE...                       summarise routing statistics
  moetuner plan    [--trace T]... [flags]         solve a placement and write it
  moetuner eval    --trace T... --plan FILE       model the cost of a placement
  moetuner compare --trace T... [flags]           every strategy side by side
  moetuner replay  --trace T... --plan A [--plan B] [--backend sim|cpu|gpu]   measure placements
  moetuner report  --trace T... --plan A [--plan B]... --out report.html       plots in one HTML page
  moetuner backtest --trace T... [flags]          replay per-step loads under rebalancing policies

A TRACE is a file or directory: moetuner JSONL or .npy per-token traces,
FLAME-MoE CSV (one file per layer), OLMoE routing-analysis JSON, Fiddler
popularity JSON, or EPLB/SGLang logical_count JSON. Run 'moetuner CMD -h'
for a command's flags.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "stats":
		err = cmdStats(args[1:], stdout, stderr)
	case "plan":
		err = cmdPlan(ctx, args[1:], stdout, stderr)
	case "eval":
		err = cmdEval(args[1:], stdout, stderr)
	case "compare":
		err = cmdCompare(ctx, args[1:], stdout, stderr)
	case "replay":
		err = cmdReplay(ctx, args[1:], stdout, stderr)
	case "report":
		err = cmdReport(args[1:], stdout, stderr)
	case "backtest":
		err = cmdBacktest(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "moetuner: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		return exitInterrupted(ctx, args[0], err, stderr)
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(stderr, "moetuner %s: %v (run 'moetuner %s -h' for the flags)\n", args[0], err, args[0])
		return 2
	default:
		fmt.Fprintln(stderr, "moetuner:", err)
		return 1
	}
}

var errUsage = errors.New("usage")

// interruptError is the cause of the context's cancellation when a signal
// arrives (main sets it).
type interruptError struct{ sig os.Signal }

func (e *interruptError) Error() string { return "interrupted by " + signalName(e.sig) }

// signalStatus is the shell's exit status for a process stopped by sig:
// 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case os.Interrupt:
		return "SIGINT"
	}
	return sig.String()
}

// exitInterrupted reports a command that failed after its context was
// cancelled. A command that still wrote its result (plan with the best
// plan found) returned nil and exits 0; one that wrote nothing exits
// 128 + the signal number, as a shell reports a process the signal killed.
func exitInterrupted(ctx context.Context, cmd string, err error, stderr io.Writer) int {
	var ie *interruptError
	if !errors.As(context.Cause(ctx), &ie) {
		fmt.Fprintln(stderr, "moetuner:", err)
		return 1
	}
	fmt.Fprintf(stderr, "moetuner %s: %v before a result was ready; nothing written (%v)\n", cmd, ie, err)
	return signalStatus(ie.sig)
}

type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }

func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: moetuner %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args; -h prints the full usage, a bad flag only the error
// (the flag package prints it) and a pointer to -h.
func parse(fs *flag.FlagSet, args []string) error {
	full := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = full
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		full()
		return err
	}
	fmt.Fprintf(fs.Output(), "run 'moetuner %s -h' for the flags\n", fs.Name())
	return errUsage
}

// usageError is a mistake in how the command was called: a missing or
// malformed flag. run prints it with a pointer to -h and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// choice is a string flag that accepts only the listed values, so a
// misspelt value fails flag parsing (a usage error, exit 2).
type choice struct {
	val     *string
	allowed []string
}

func (c choice) String() string {
	if c.val == nil {
		return ""
	}
	return *c.val
}

func (c choice) Set(s string) error {
	if !slices.Contains(c.allowed, s) {
		return fmt.Errorf("want one of %s", strings.Join(c.allowed, ", "))
	}
	*c.val = s
	return nil
}

// choiceVar defines a choice flag with default def.
// dispatchChoices is every dispatch model's name, and "static".
func dispatchChoices() []string {
	out := []string{"static"}
	for d := placement.Dispatch(0); d.Valid(); d++ {
		out = append(out, d.String())
	}
	return out
}

func choiceVar(fs *flag.FlagSet, p *string, name, def string, allowed []string, usage string) {
	*p = def
	fs.Var(choice{val: p, allowed: allowed}, name, usage)
}
