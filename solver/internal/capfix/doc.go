// Package capfix brings a plan's layers under a cap on their busiest/mean
// load per unit of GPU speed (solver.Problem.MaxImbalance): Cap repairs a
// plan in place with swaps and retargets that relieve each layer's busiest
// GPU, Refuse rejects a cap no plan with the problem's slots can meet
// before any search, and LayersOver counts the layers above a cap. The
// balance is the cost model's (costmodel.BalanceAt), within its tolerance
// (costmodel.CapTol). Errors for a cap that cannot be met are
// *task.Infeasible values, which name the worst layer and what would fix
// it in the words of solver.Problem and solver.Options.
package capfix
