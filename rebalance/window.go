package rebalance

import "math"

// window keeps one phase's recent steps: the last size of them (size > 0),
// each weighted decay^age (age 0 for the newest step), or with size 0 an
// exponentially decayed sum over every step seen, as TensorRT-LLM's online
// load balancer keeps its statistics.
type window struct {
	layers, experts int
	size            int
	decay           float64 // in (0, 1]
	// ring holds the last size steps (size > 0); ring[head] is the oldest
	// once it is full.
	ring  [][][]float64
	head  int
	count int // steps seen
	// sum is, with decay 1 and size > 0, the exact sum of ring (integer
	// counts stay exact in float64); with size 0, the decayed sum of every
	// step, and wsum the sum of its weights.
	sum  [][]float64
	wsum float64
}

func newWindow(layers, experts, size int, decay float64) *window {
	w := &window{layers: layers, experts: experts, size: size, decay: decay}
	w.sum = matrix(layers, experts)
	return w
}

func matrix(rows, cols int) [][]float64 {
	back := make([]float64, rows*cols)
	m := make([][]float64, rows)
	for i := range m {
		m[i] = back[i*cols : (i+1)*cols : (i+1)*cols]
	}
	return m
}

func cloneMatrix(m [][]float64) [][]float64 {
	out := matrix(len(m), len(m[0]))
	for i, row := range m {
		copy(out[i], row)
	}
	return out
}

// add appends one step (copied).
func (w *window) add(load [][]float64) {
	w.count++
	if w.size == 0 {
		for l, row := range load {
			for e, v := range row {
				w.sum[l][e] = w.decay*w.sum[l][e] + v
			}
		}
		w.wsum = w.decay*w.wsum + 1
		return
	}
	// A kept step is never written again, so a snapshot may share it.
	slot := cloneMatrix(load)
	if len(w.ring) < w.size {
		w.ring = append(w.ring, slot)
	} else {
		if w.decay == 1 {
			for l, row := range w.ring[w.head] {
				for e, v := range row {
					w.sum[l][e] -= v
				}
			}
		}
		w.ring[w.head] = slot
		w.head = (w.head + 1) % w.size
	}
	if w.decay == 1 {
		for l, row := range slot {
			for e, v := range row {
				w.sum[l][e] += v
			}
		}
	}
}

// covered is the number of steps the window's load covers: the kept ones,
// or with no limit every step seen.
func (w *window) covered() int {
	if w.size == 0 {
		return w.count
	}
	return len(w.ring)
}

// steps returns the kept steps oldest first with their weights (shared:
// kept steps are never written); nil for a window without steps (size 0).
func (w *window) steps() ([][][]float64, []float64) {
	if w.size == 0 {
		return nil, nil
	}
	n := len(w.ring)
	out := make([][][]float64, n)
	wt := make([]float64, n)
	for i := range n {
		out[i] = w.ring[(w.head+i)%n]
		wt[i] = math.Pow(w.decay, float64(n-1-i))
	}
	return out, wt
}

// load returns the window's weighted load (a new matrix) and the sum of
// the weights (the number of steps without decay).
func (w *window) load() ([][]float64, float64) {
	if w.size == 0 || w.decay == 1 {
		total := w.wsum
		if w.size > 0 {
			total = float64(len(w.ring))
		}
		return cloneMatrix(w.sum), total
	}
	out := matrix(w.layers, w.experts)
	steps, wt := w.steps()
	total := 0.0
	for i, m := range steps {
		total += wt[i]
		for l, row := range m {
			for e, v := range row {
				out[l][e] += wt[i] * v
			}
		}
	}
	return out, total
}
