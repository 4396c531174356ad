package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/routing"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// An experiment is one subcommand: run parses args (its flags, whose
// usage goes to stderr) and writes its findings to stdout.
type experiment struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func experiments() []experiment {
	return []experiment{
		{"home", "the home-flow affinity search against EPLB with redundant slots: remote copies, time, NIC ports", runHome},
		{"holdout-floor", "how low a plan made on a trace's first half can keep the busiest GPU on its second half: the sampling noise between the halves", runHoldoutFloor},
		{"chain", "the chain-flow search against EPLB: cross-node bytes, time, NIC ports", runChain},
		{"chain-ceiling", "how far cross-node transitions alone could fall at EPLB's balance (exact chain counters)", runChainCeiling},
		{"node-ceiling", "node placements annealed under balance caps against EPLB's nodes", runNodeCeiling},
		{"relax-node", "a relaxed, rounded node placement against the annealing from EPLB", runRelaxNode},
		{"hub-copies", "whether copies under static dispatch pay for an unbalanced node placement", runHubCopies},
		{"bound-budgets", "where the home-flow bound loses against EPLB and a node search", runBoundBudgets},
		{"balanced-bound", "the home-flow bound over every plan and over the plans within a node cap", runBalancedBound},
	}
}

// run is the command: args[0] names the experiment, the rest are its
// flags. It returns the exit status: 0 done, 1 failed, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, e := range experiments() {
		if e.name != args[0] {
			continue
		}
		err := e.run(ctx, args[1:], stdout, stderr)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errFlags):
			return 2 // the flag package said why
		case errors.As(err, new(usageError)):
			fmt.Fprintf(stderr, "experiments %s: %v\n", e.name, err)
			return 2
		case err != nil:
			fmt.Fprintf(stderr, "experiments %s: %v\n", e.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "experiments: unknown experiment %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: go run ./solver/internal/experiments <experiment> [flags]")
	fmt.Fprintln(w, "experiments (each takes -h for its flags):")
	for _, e := range experiments() {
		fmt.Fprintf(w, "  %-15s %s\n", e.name, e.summary)
	}
}

// usageError is a bad flag value.
type usageError struct{ err error }

// errFlags: the flags did not parse (the flag package printed why).
var errFlags = errors.New("bad flags")

func (e usageError) Error() string { return e.err.Error() }

// flags is one experiment's flag set with the settings most share.
type flags struct {
	fs     *flag.FlagSet
	trace  string
	nodes  int
	layers []int
	limit  time.Duration
}

// defaultTrace is the experiments' trace when -trace is not given,
// looked up beside the repository.
const defaultTrace = "shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy"

// newFlags registers -trace and -nodes (default 4) on a flag set for
// experiment name that reports to stderr; -layers and -limit are
// registered by withLayers and withLimit where the experiment uses them.
func newFlags(name string, stderr io.Writer) *flags {
	f := &flags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	f.fs.SetOutput(stderr)
	f.fs.StringVar(&f.trace, "trace", "", "the per-token trace (any format routing.Load reads); default "+defaultTrace+" found beside the repository")
	f.fs.IntVar(&f.nodes, "nodes", 4, "nodes of 8 GPUs (h100x8)")
	return f
}

func (f *flags) withLayers(def ...int) *flags {
	f.layers = def
	f.fs.Func("layers", fmt.Sprintf("comma-separated MoE layers (default %s)", joinInts(def)), func(v string) error {
		ls, err := parseInts(v)
		f.layers = ls
		return err
	})
	return f
}

func (f *flags) withLimit(def time.Duration, what string) *flags {
	f.fs.DurationVar(&f.limit, "limit", def, what)
	return f
}

// parse parses args and checks the shared settings.
func (f *flags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errFlags
	}
	if f.fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q: every setting is a flag (-h lists them)", f.fs.Arg(0))}
	}
	if f.nodes < 1 {
		return usageError{fmt.Errorf("-nodes %d: need at least 1", f.nodes)}
	}
	if f.limit < 0 {
		return usageError{fmt.Errorf("-limit %v: need 0 or more", f.limit)}
	}
	return nil
}

// stats loads the trace (-trace, else the default one beside the
// repository) and checks -layers against it.
func (f *flags) stats() (*routing.Stats, error) {
	path := f.trace
	if path == "" {
		if path = sharedfiles.Find(defaultTrace); path == "" {
			return nil, usageError{fmt.Errorf("no trace: %s is not beside the repository; pass -trace", defaultTrace)}
		}
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	if err != nil {
		return nil, err
	}
	st := src.Stats
	if st.Patterns == nil {
		return nil, usageError{fmt.Errorf("-trace %s has no per-token paths: the experiments need a per-token trace", path)}
	}
	for _, l := range f.layers {
		if l < 0 || l >= st.Layers {
			return nil, usageError{fmt.Errorf("-layers: layer %d out of range [0,%d) for %s", l, st.Layers, path)}
		}
	}
	return st, nil
}

func parseInts(v string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not a comma-separated list of integers", v)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// lineWriter prints whole lines to w from any goroutine.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *lineWriter) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}
