package affinity

// ChainShares split a timed SolveChain's limit among its phases: Proxy
// for the proxy's annealing, Exact for the exact counters' annealing
// (exactChain), and the rest for the exact polish on the full cost model.
// A field outside (0, 1) takes its default: 0.6 for Proxy, 0.3 for Exact.
// Solves by work do not use them.
type ChainShares struct {
	Proxy, Exact float64
}

// The chain shares' defaults (ChainShares).
const (
	defaultProxyShare = 0.6
	defaultExactShare = 0.3
)

func (s ChainShares) proxy() float64 {
	if s.Proxy > 0 && s.Proxy < 1 {
		return s.Proxy
	}
	return defaultProxyShare
}

func (s ChainShares) exact() float64 {
	if s.Exact > 0 && s.Exact < 1 {
		return s.Exact
	}
	return defaultExactShare
}
