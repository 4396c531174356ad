package mip

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
)

// WriteLP writes m in CPLEX LP format, deterministically (columns and rows
// in index order, %.17g numbers), for debugging a formulation with any LP
// tool (HiGHS reads it back: `highs model.lp`).
func (m *Model) WriteLP(w io.Writer) error {
	bw := bufio.NewWriter(w)
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', 17, 64) }
	// term renders one coefficient: "2.5 x" first, then "+ 2.5 x" or "- 2.5 x".
	term := func(first bool, c float64, name string) string {
		switch {
		case first && c < 0:
			return "-" + num(-c) + " " + name
		case first:
			return num(c) + " " + name
		case c < 0:
			return "- " + num(-c) + " " + name
		}
		return "+ " + num(c) + " " + name
	}
	fmt.Fprintln(bw, "\\ moetuner MIP")
	fmt.Fprintln(bw, "Minimize")
	fmt.Fprint(bw, " obj:")
	first := true
	for j, c := range m.Cost {
		if c == 0 {
			continue
		}
		fmt.Fprint(bw, " ", term(first, c, m.ColName(j)))
		first = false
	}
	if m.Offset != 0 {
		fmt.Fprint(bw, " ", term(first, m.Offset, "__offset"))
		first = false
	}
	if first {
		fmt.Fprint(bw, " 0 ", m.ColName(0))
	}
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "Subject To")
	for i := range m.RowLower {
		lo, hi := m.RowLower[i], m.RowUpper[i]
		var sb []byte
		firstT := true
		for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
			sb = append(sb, ' ')
			sb = append(sb, term(firstT, m.RowValue[k], m.ColName(m.RowIndex[k]))...)
			firstT = false
		}
		if firstT {
			sb = append(sb, " 0 "+m.ColName(0)...)
		}
		name := m.RowName(i)
		switch {
		case lo == hi:
			fmt.Fprintf(bw, " %s:%s = %s\n", name, sb, num(lo))
		case !math.IsInf(lo, -1) && !math.IsInf(hi, 1):
			fmt.Fprintf(bw, " %s_lo:%s >= %s\n", name, sb, num(lo))
			fmt.Fprintf(bw, " %s_hi:%s <= %s\n", name, sb, num(hi))
		case !math.IsInf(lo, -1):
			fmt.Fprintf(bw, " %s:%s >= %s\n", name, sb, num(lo))
		case !math.IsInf(hi, 1):
			fmt.Fprintf(bw, " %s:%s <= %s\n", name, sb, num(hi))
		}
	}
	fmt.Fprintln(bw, "Bounds")
	for j := range m.Cost {
		lo, hi := m.Lower[j], m.Upper[j]
		n := m.ColName(j)
		switch {
		case math.IsInf(lo, -1) && math.IsInf(hi, 1):
			fmt.Fprintf(bw, " %s free\n", n)
		case math.IsInf(hi, 1):
			fmt.Fprintf(bw, " %s >= %s\n", n, num(lo))
		default:
			fmt.Fprintf(bw, " %s <= %s <= %s\n", num(lo), n, num(hi))
		}
	}
	if m.Offset != 0 {
		fmt.Fprintln(bw, " __offset = 1")
	}
	var ints []string
	for j, isInt := range m.Integer {
		if isInt {
			ints = append(ints, m.ColName(j))
		}
	}
	if len(ints) > 0 {
		fmt.Fprintln(bw, "General")
		for _, n := range ints {
			fmt.Fprintln(bw, " "+n)
		}
	}
	fmt.Fprintln(bw, "End")
	return bw.Flush()
}
