package affinity

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The zero ChainShares is the production split (0.6 to the proxy, 0.3 to
// the exact counters); a share in (0, 1) is taken as given and any other
// value falls back to its default, so no setting divides by 1 − 1.
func TestChainSharesDefaults(t *testing.T) {
	for _, tc := range []struct {
		name         string
		in           ChainShares
		proxy, exact float64
	}{
		{"zero", ChainShares{}, 0.6, 0.3},
		{"set", ChainShares{Proxy: 0.4, Exact: 0.5}, 0.4, 0.5},
		{"proxy only", ChainShares{Proxy: 0.7}, 0.7, 0.3},
		{"out of range", ChainShares{Proxy: 1, Exact: -0.1}, 0.6, 0.3},
		{"NaN", ChainShares{Proxy: math.NaN(), Exact: math.NaN()}, 0.6, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.proxy, tc.in.proxy())
			assert.Equal(t, tc.exact, tc.in.exact())
		})
	}
}
