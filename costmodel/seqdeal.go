package costmodel

import (
	"fmt"
	"slices"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
)

// SequentialDeal deals SGLang's per-rank table (DealtPerRank) of a plan
// one MoE layer at a time, in the order SGLang deals them, for a search
// that settles the layers in that order: once the layers before l are
// settled, where every rank's stream stands before l is known, so any
// copies of layer l, those that move ranks' streams included, are dealt
// exactly, and a Splitter bound to them (Bind, Splitter) prices layer l
// exactly. What a layer's copies do to the streams of the layers
// after it is what Commit carries on: those layers are dealt from where
// the streams then stand, not from where the bound plan left them.
//
// It is not safe for concurrent use.
type SequentialDeal struct {
	split   *dealSplit
	dealer  *stackdispatch.Dealer
	cands   [][][]int32 // per SGLang row: its candidate lists (MoE rows: as last bound)
	moeRows []int
	S       int   // the plan's slots per GPU (physical id = GPU·S + slot)
	row     int   // the rows before it are dealt for good
	pos     []int // every rank's stream position before row
	work    []int // scratch positions
	rows    [][]int32
	// bound is the row Bind last dealt (-1: none since it was committed),
	// and after every rank's position after it.
	bound int
	after []int
}

// NewSequentialDeal starts the sequential deal of plan for dispatch d
// (which must deal per rank: DealtPerRank(d, plan)) on G GPUs in nodes of
// gpusPerNode, the plan's layers sitting as layout says (NewSplitter). Its
// Splitter starts as NewSplitter's for plan.
func NewSequentialDeal(d placement.Dispatch, plan *placement.Plan, G, gpusPerNode int, layout placement.Layout) (*SequentialDeal, error) {
	if !DealtPerRank(d, plan) {
		return nil, fmt.Errorf("costmodel: %s dispatch does not deal per rank; a sequential deal is only for SGLang's node and GPU-only trees dealing a map loaded from a file", d)
	}
	sp, err := NewSplitter(d, plan, G, gpusPerNode, layout)
	if err != nil {
		return nil, err
	}
	split := sp.(*dealSplit)
	if layout.ModelLayers > 0 && len(layout.LayerIDs) == 0 && layout.ModelLayers != len(plan.Layers) {
		layout.ModelLayers = 0 // as newDealSplit reads it
	}
	rows, moeRows, err := placement.SGLangRows(plan, layout)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", d, err)
	}
	phy := make([][]int32, len(rows))
	for r, row := range rows {
		phy[r] = make([]int32, len(row))
		for i, e := range row {
			phy[r][i] = int32(e)
		}
	}
	cands, err := stackdispatch.CandidatesFromPhy2Log(phy, plan.Experts)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", d, err)
	}
	S := max(len(rows[0])/G, 1)
	dealer, err := stackdispatch.NewDealer(nil, G, S, gpusPerNode, split.v, stackdispatch.SGLangInitByMapping)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", d, err)
	}
	q := &SequentialDeal{split: split, dealer: dealer, cands: cands, moeRows: moeRows, S: S, pos: dealer.Start(),
		rows: make([][]int32, G), bound: -1}
	for r := range q.rows {
		q.rows[r] = make([]int32, plan.Experts)
	}
	return q, nil
}

// Splitter returns the splitter the deal keeps: exact, for every layer
// bound since the layers before it were committed, for the copies it was
// bound to (and for moves that leave its deal as it is); for the other
// layers as NewSplitter's for the plan.
func (q *SequentialDeal) Splitter() Splitter { return q.split }

// Bind deals MoE layer l for copies (per expert, its GPUs; an expert may
// hold several slots of one GPU) from where the layers before it, as
// committed, left every rank's stream, and binds the splitter's layer l
// to that deal. l must not be before a committed layer.
func (q *SequentialDeal) Bind(l int, copies [][]int32) error {
	if err := q.advance(l); err != nil {
		return err
	}
	cands, err := q.layerCands(copies)
	if err != nil {
		return fmt.Errorf("costmodel: sequential deal: layer %d: %w", l, err)
	}
	row := q.moeRows[l]
	if row == q.bound && slices.EqualFunc(cands, q.cands[row], slices.Equal) {
		return nil // bound to these copies already
	}
	q.cands[row] = cands
	q.work = append(q.work[:0], q.pos...)
	q.dealer.DealLayer(cands, q.work, q.rows)
	q.bound, q.after = row, append(q.after[:0], q.work...)
	d := q.split
	for e, c := range cands {
		i := l*d.E + e
		d.n[i] = int32(len(c))
		d.dealt[i] = stackdispatch.SGLangDealtRanks(c, d.G, q.S, d.P, d.v, d.dealt[i][:0])
		d.pos[i] = d.pos[i][:0]
		for _, r := range d.dealt[i] {
			d.pos[i] = append(d.pos[i], int32(slices.Index(c, q.rows[r][e])))
		}
	}
	return nil
}

// Commit settles the layers up to and including l as last bound (those
// never bound as the plan has them): the streams move past them.
func (q *SequentialDeal) Commit(l int) error {
	if l < 0 || l >= len(q.moeRows) {
		return fmt.Errorf("costmodel: sequential deal: layer %d outside [0,%d)", l, len(q.moeRows))
	}
	return q.dealTo(q.moeRows[l] + 1)
}

// advance deals the rows before MoE layer l for good.
func (q *SequentialDeal) advance(l int) error {
	if l < 0 || l >= len(q.moeRows) {
		return fmt.Errorf("costmodel: sequential deal: layer %d outside [0,%d)", l, len(q.moeRows))
	}
	if q.moeRows[l] < q.row {
		return fmt.Errorf("costmodel: sequential deal: layer %d is already committed", l)
	}
	return q.dealTo(q.moeRows[l])
}

func (q *SequentialDeal) dealTo(row int) error {
	for ; q.row < row; q.row++ {
		if q.row == q.bound {
			copy(q.pos, q.after) // dealt when it was bound
			q.bound = -1
			continue
		}
		q.dealer.DealLayer(q.cands[q.row], q.pos, q.rows)
	}
	return nil
}

// layerCands is SGLang's candidate lists for a layer holding copies:
// each expert's physical ids GPU·S + j, ascending.
func (q *SequentialDeal) layerCands(copies [][]int32) ([][]int32, error) {
	if len(copies) != q.split.E {
		return nil, fmt.Errorf("%d experts, the plan has %d", len(copies), q.split.E)
	}
	out := make([][]int32, len(copies))
	for e, gs := range copies {
		if len(gs) == 0 {
			return nil, fmt.Errorf("expert %d has no copy", e)
		}
		c := make([]int32, 0, len(gs))
		for _, g := range gs {
			if g < 0 || int(g) >= q.split.G {
				return nil, fmt.Errorf("expert %d: GPU %d outside [0,%d)", e, g, q.split.G)
			}
			j := int32(0)
			for _, x := range c {
				if x/int32(q.S) == g {
					j++
				}
			}
			if j >= int32(q.S) {
				return nil, fmt.Errorf("expert %d holds more than %d slots of GPU %d", e, q.S, g)
			}
			c = append(c, g*int32(q.S)+j)
		}
		slices.Sort(c)
		out[e] = c
	}
	return out, nil
}
