package solver

// PairRefine exposes pairRefine to the external tests, which have HiGHS.
var PairRefine = pairRefine

// HomeLowerBound exposes homeLowerBound.
var HomeLowerBound = homeLowerBound

// PairFeasible exposes pairFeasible.
var PairFeasible = pairFeasible
