package solver

import (
	"errors"
	"fmt"
)

// ErrNoILPBackend is wrapped by every *BackendError: errors.Is(err,
// ErrNoILPBackend) tells that a strategy needed an ILP and the build had
// no backend for it.
var ErrNoILPBackend = errors.New("solver: no ILP backend")

// BackendError says that a solve needed an integer linear program and
// Options.Backend was nil in a build without cgo, where the default
// backend, HiGHS (mip/highs, a cgo binding), is not linked in.
type BackendError struct {
	// Strategy is the strategy that was asked for.
	Strategy Strategy
	// Needs names what needed the ILP, e.g. "the paper's two ILPs".
	Needs string
}

// Error names what needed the ILP and the three ways out.
func (e *BackendError) Error() string {
	return fmt.Sprintf("solver: strategy %s needs an ILP backend for %s, and this binary was built without cgo (the cgo build constraint): HiGHS (mip/highs) is unavailable; "+
		"rebuild with CGO_ENABLED=1 and a C++ toolchain, set Options.Backend to a mip.Backend, or choose a strategy that needs no ILP (eplb, eplb-hierarchical, greedy, contiguous, round-robin)",
		e.Strategy, e.Needs)
}

// Unwrap lets errors.Is(err, ErrNoILPBackend) work.
func (e *BackendError) Unwrap() error { return ErrNoILPBackend }
