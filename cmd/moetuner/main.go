// Command moetuner reads MoE routing traces and writes expert placements
// that cut tail latency. Run `moetuner -h` for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	// SIGTERM (what kill, systemd and Kubernetes send) is handled like
	// Ctrl-C: the context is cancelled, plan writes the best plan the
	// solver returns, and run picks the exit status (see exitInterrupted).
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		cancel(&interruptError{sig: sig})
		// A second signal stops at once; every write is atomic, so at worst
		// a temporary file is left behind.
		sig = <-sigs
		os.Exit(signalStatus(sig))
	}()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	signal.Stop(sigs)
	os.Exit(code)
}
