package costmodel

// DefaultSigma is the compute slowdown under overlap measured on average in
// arXiv 2507.03114 (18.9 %).
const DefaultSigma = 0.189

// GPUs returns Nodes × GPUsPerNode.
func (c Cluster) GPUs() int { return c.Nodes * c.GPUsPerNode }

// NodeOf returns the node of GPU g.
func (c Cluster) NodeOf(g int) int { return g / c.GPUsPerNode }

// SigmaValue returns Sigma, or DefaultSigma when unset.
func (c Cluster) SigmaValue() float64 {
	if c.Sigma == nil {
		return DefaultSigma
	}
	return *c.Sigma
}

// SpeedOf returns the relative speed of GPU g (1 when Speed is nil).
func (c Cluster) SpeedOf(g int) float64 {
	if g < len(c.Speed) && c.Speed[g] > 0 {
		return c.Speed[g]
	}
	return 1
}

// NVLinkBytesPerSec returns the per-direction NVLink bandwidth of one GPU
// in bytes/s (half of the quoted bidirectional NVLinkGBps).
func (c Cluster) NVLinkBytesPerSec() float64 { return c.NVLinkGBps * 1e9 / 2 }

// NICBytesPerSec returns the per-direction NIC bandwidth of one GPU in
// bytes/s.
func (c Cluster) NICBytesPerSec() float64 { return c.NICGbps * 1e9 / 8 }

// Coefficients returns, in seconds at speed 1, the time per routed token
// per expert and the fixed time per expert held. TokenCost/ExpertCost win
// when set; otherwise a SwiGLU expert costs 6·Hidden·FFN flops per token at
// TFLOPS·Efficiency (default 0.6), and reading its weights from HBM costs
// ExpertBytes/HBMGBps. Seconds as float64 keep sub-nanosecond precision.
func (c Cluster) Coefficients(m Model) (perTokenSec, perExpertSec float64) {
	perTokenSec, perExpertSec = c.TokenCost.Seconds(), c.ExpertCost.Seconds()
	if perTokenSec == 0 && c.TFLOPS > 0 {
		eff := c.Efficiency
		if eff <= 0 {
			eff = 0.6
		}
		perTokenSec = 6 * float64(m.Hidden) * float64(m.FFN) / (c.TFLOPS * 1e12 * eff)
	}
	if perExpertSec == 0 && c.HBMGBps > 0 {
		perExpertSec = float64(m.ExpertBytes()) / (c.HBMGBps * 1e9)
	}
	return perTokenSec, perExpertSec
}

// TokenBytes returns the bytes of one token's activation (Hidden ×
// BytesPerActivation).
func (m Model) TokenBytes() float64 { return float64(m.Hidden * m.BytesPerActivation) }

// ExpertBytes returns BytesPerExpert, or 3·Hidden·FFN·BytesPerActivation.
func (m Model) ExpertBytes() int64 {
	if m.BytesPerExpert > 0 {
		return m.BytesPerExpert
	}
	return 3 * int64(m.Hidden) * int64(m.FFN) * int64(m.BytesPerActivation)
}

// MemOf returns GPU g's memory for expert weights: MemBytes[g] when set,
// else GPUMemBytes (0: unlimited).
func (c Cluster) MemOf(g int) int64 {
	if g < len(c.MemBytes) {
		return c.MemBytes[g]
	}
	return c.GPUMemBytes
}
