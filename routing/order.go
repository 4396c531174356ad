package routing

import (
	"errors"
	"fmt"
)

// maxOrderEntries bounds Layers × Tokens × TopK for a TokenOrder (2^26
// rows, 256 MiB): the order holds one row per routed (token, expert) pair,
// as much as the trace's own ids take twice over.
const maxOrderEntries = 1 << 26

// TokenOrder is what a dispatch rule that picks a copy from a token's
// position in its rank's batch (vLLM's replica hash) needs of a per-token
// trace: for every layer, expert and source rank, the row each of its
// tokens has in its rank's forward pass. Rows[l][Start[l][e·Ranks+r] :
// Start[l][e·Ranks+r+1]] are the rows of layer l's tokens that picked
// expert e and started on rank r, in trace order. A token's row is its
// index among rank r's tokens of its step (of the whole trace when the
// trace has no steps), taken modulo PassTokens when PassTokens > 0 (each
// rank's tokens cut into forward passes of PassTokens). Tokens of unknown
// source have no row. A TokenOrder is read-only once built: Clone shares
// it.
type TokenOrder struct {
	Layers, Experts, Ranks int
	// PassTokens is the forward-pass size the rows were cut by; 0 when
	// they run through the step (or the trace).
	PassTokens int
	// Steps reports that the rows restart at every step of the trace.
	Steps bool
	Start [][]int32 // [L][Experts·Ranks+1]
	Rows  [][]int32 // [L][...]
}

// Count returns the number of layer l's tokens of expert e that started on
// rank r (0 outside the order's ranks).
func (o *TokenOrder) Count(l, e, r int) int {
	if r < 0 || r >= o.Ranks {
		return 0
	}
	i := e*o.Ranks + r
	return int(o.Start[l][i+1] - o.Start[l][i])
}

// Of returns the rows of layer l's tokens of expert e that started on rank
// r (nil outside the order's ranks).
func (o *TokenOrder) Of(l, e, r int) []int32 {
	if r < 0 || r >= o.Ranks {
		return nil
	}
	i := e*o.Ranks + r
	return o.Rows[l][o.Start[l][i]:o.Start[l][i+1]]
}

// TokenOrder returns t's token order (see TokenOrder) with rows cut into
// forward passes of passTokens tokens per rank (0: the step, or the whole
// trace without steps, is one pass). It fails, naming the field, when the
// trace has no source ranks, passTokens is negative, or the order would
// exceed maxOrderEntries rows.
func (t *Trace) TokenOrder(passTokens int) (*TokenOrder, error) {
	if passTokens < 0 {
		return nil, fmt.Errorf("routing: token order: pass tokens %d, want ≥ 0 (0: a step is one pass)", passTokens)
	}
	if t.Source == nil {
		return nil, errors.New("routing: token order: the trace has no Source (source ranks): a token's row in its rank's batch is unknown")
	}
	if len(t.Source) != t.Tokens || (t.Step != nil && len(t.Step) != t.Tokens) {
		return nil, fmt.Errorf("routing: token order: %d tokens but %d sources and %d steps", t.Tokens, len(t.Source), len(t.Step))
	}
	L, K, E := t.Layers, t.TopK, t.Experts
	if n := uint64(L) * uint64(t.Tokens) * uint64(K); n > maxOrderEntries {
		return nil, fmt.Errorf("routing: token order: %d layers × %d tokens × top-%d = %d rows exceed %d; cut the trace", L, t.Tokens, K, n, maxOrderEntries)
	}
	R := 0
	for tok, r := range t.Source {
		if r < -1 {
			return nil, fmt.Errorf("routing: token order: token %d: Source %d, want ≥ -1", tok, r)
		}
		R = max(R, int(r)+1)
	}
	rows := tokenRows(t, R, passTokens)
	o := &TokenOrder{Layers: L, Experts: E, Ranks: R, PassTokens: passTokens, Steps: t.Step != nil,
		Start: make([][]int32, L), Rows: make([][]int32, L)}
	for l := range L {
		start := make([]int32, E*R+1)
		for tok, r := range t.Source {
			if r < 0 {
				continue
			}
			for _, e := range t.IDs[(tok*L+l)*K : (tok*L+l+1)*K] {
				if e < 0 || int(e) >= E {
					return nil, fmt.Errorf("routing: token order: token %d layer %d: expert %d outside [0,%d)", tok, l, e, E)
				}
				start[int(e)*R+int(r)+1]++
			}
		}
		for i := 1; i < len(start); i++ {
			start[i] += start[i-1]
		}
		fill := make([]int32, E*R)
		copy(fill, start)
		out := make([]int32, start[E*R])
		for tok, r := range t.Source {
			if r < 0 {
				continue
			}
			for _, e := range t.IDs[(tok*L+l)*K : (tok*L+l+1)*K] {
				i := int(e)*R + int(r)
				out[fill[i]] = rows[tok]
				fill[i]++
			}
		}
		o.Start[l], o.Rows[l] = start, out
	}
	return o, nil
}

// tokenRows is every token's row (see TokenOrder) in a trace of R ranks;
// -1 for a token of unknown source.
func tokenRows(t *Trace, R, passTokens int) []int32 {
	rows := make([]int32, t.Tokens)
	next := make([]int32, R)
	var step []map[int32]int32 // per rank: the next row of each step
	if t.Step != nil {
		step = make([]map[int32]int32, R)
	}
	for tok, r := range t.Source {
		if r < 0 {
			rows[tok] = -1
			continue
		}
		var row int32
		if step != nil {
			if step[r] == nil {
				step[r] = map[int32]int32{}
			}
			row = step[r][t.Step[tok]]
			step[r][t.Step[tok]]++
		} else {
			row = next[r]
			next[r]++
		}
		if passTokens > 0 {
			row %= int32(passTokens)
		}
		rows[tok] = row
	}
	return rows
}

// Validate checks o's shape against L layers and E experts.
func (o *TokenOrder) Validate(L, E int) error {
	if o.Layers != L || o.Experts != E || len(o.Start) != L || len(o.Rows) != L || o.Ranks < 0 {
		return fmt.Errorf("routing: Order: %d layers × %d experts (%d start rows, %d row lists), stats have %d × %d", o.Layers, o.Experts, len(o.Start), len(o.Rows), L, E)
	}
	for l := range L {
		s := o.Start[l]
		if len(s) != E*o.Ranks+1 || s[0] != 0 || int(s[len(s)-1]) != len(o.Rows[l]) {
			return fmt.Errorf("routing: Order: layer %d: %d offsets for %d experts × %d ranks over %d rows", l, len(s), E, o.Ranks, len(o.Rows[l]))
		}
		for i := 1; i < len(s); i++ {
			if s[i] < s[i-1] {
				return fmt.Errorf("routing: Order: layer %d: offset %d decreases", l, i)
			}
		}
	}
	return nil
}
