// Package highs is the HiGHS backend of package mip: a thin cgo binding
// over the HiGHS 1.12 C API that implements mip.Backend.
//
// All of moetuner's `import "C"` for HiGHS lives here; the exported API uses
// Go types only (Backend, WriteModel). The C headers are vendored under
// include/ (MIT, see include/LICENSE); the static libhighs.a is linked
// through a blank import of github.com/bartolsthoorn/gohighs/highs, whose
// #cgo LDFLAGS carry the prebuilt library, so a plain `go build` needs no
// system HiGHS, only cgo and a C++ toolchain. A build without cgo
// (CGO_ENABLED=0) leaves the binding out (this package then has no
// Backend), and package solver, which imports it only under the cgo build
// constraint, has no default backend: its ILP strategies return a
// *solver.BackendError and the others run.
//
// The binding keeps to a few rules:
//
//   - Pass once, copy out, destroy. Each Solve call creates its own HiGHS
//     instance, hands it the whole model in one Highs_passMip call (row-wise
//     CSR built in Go), copies the solution into Go slices and destroys the
//     instance before returning. No HiGHS handle escapes, so a Backend is
//     safe for concurrent use. After each run the calling OS thread's HiGHS
//     task scheduler is shut down, so solves with different Threads do not
//     clash on a reused thread.
//   - C never keeps a Go pointer. Arrays go to HiGHS for the duration of one
//     call; the state shared with the callback (interrupt flag, latest
//     objective and bound) is C memory, accessed with atomics on both sides.
//   - Statuses are mapped in one switch (readSolution): optimal → Optimal;
//     time limit, interrupt, iteration/solution limit → Feasible with an
//     incumbent, NoSolution without (TimedOut for time limit and
//     interrupt); infeasible → Infeasible; unbounded, unbounded or
//     infeasible, and every error status → Error with an error.
//   - The objective is never to be trusted by callers: HiGHS reports it for
//     information; callers recompute it in Go from X.
//
// A watchdog interrupts HiGHS through its interrupt callbacks when ctx ends
// or when the wall clock passes TimeLimitSec·1.1 + 1 s (HiGHS does not always
// honour time_limit). A MIP start (Options.Start) is checked in Go first:
// bounds, integrality and rows within 1e-6; a start that fails the check is
// skipped silently.
package highs
