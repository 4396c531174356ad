package baseline

import "math/bits"

// kv is one element of PyTorch's CPU sort: a key and its original index,
// moved together.
type kv struct {
	key float32
	idx int
}

// torchArgsortDesc32 is PyTorch's CPU score.argsort(-1, descending=True)
// for a float32 row as PyTorch 1.13 computes it: std::sort over
// (value, index) pairs compared by value alone
// (aten/src/ATen/native/cpu/SortingKernel.cpp, sort_kernel with
// stable=false), which with libstdc++ is an introsort: median-of-three
// partitions down to runs of 16, heapsort past 2·⌊log2 n⌋ levels, then one
// insertion sort. Equal keys therefore do not keep their order beyond 16
// elements. Newer PyTorch builds with x86-simd-sort order equal keys
// otherwise; the order of unequal keys, and so every GPU's load, is the
// same.
func torchArgsortDesc32(score []float32) []int {
	a := make([]kv, len(score))
	for i, x := range score {
		a[i] = kv{x, i}
	}
	less := func(x, y kv) bool { return x.key > y.key } // KeyValueCompDesc
	stdSort(a, less)
	out := make([]int, len(a))
	for i, e := range a {
		out[i] = e.idx
	}
	return out
}

const stdThreshold = 16 // libstdc++ _S_threshold

// stdSort is libstdc++'s std::sort (bits/stl_algo.h): __introsort_loop
// then __final_insertion_sort.
func stdSort(a []kv, less func(x, y kv) bool) {
	if len(a) < 2 {
		return
	}
	introsortLoop(a, 0, len(a), 2*(bits.Len(uint(len(a)))-1), less)
	if len(a) > stdThreshold {
		insertionSort(a, 0, stdThreshold, less)
		for i := stdThreshold; i < len(a); i++ {
			unguardedLinearInsert(a, i, less)
		}
	} else {
		insertionSort(a, 0, len(a), less)
	}
}

func introsortLoop(a []kv, first, last, depth int, less func(x, y kv) bool) {
	for last-first > stdThreshold {
		if depth == 0 {
			heapSort(a[first:last], less)
			return
		}
		depth--
		cut := partitionPivot(a, first, last, less)
		introsortLoop(a, cut, last, depth, less)
		last = cut
	}
}

func partitionPivot(a []kv, first, last int, less func(x, y kv) bool) int {
	mid := first + (last-first)/2
	moveMedianToFirst(a, first, first+1, mid, last-1, less)
	return unguardedPartition(a, first+1, last, first, less)
}

func moveMedianToFirst(a []kv, result, x, y, z int, less func(x, y kv) bool) {
	switch {
	case less(a[x], a[y]):
		switch {
		case less(a[y], a[z]):
			a[result], a[y] = a[y], a[result]
		case less(a[x], a[z]):
			a[result], a[z] = a[z], a[result]
		default:
			a[result], a[x] = a[x], a[result]
		}
	case less(a[x], a[z]):
		a[result], a[x] = a[x], a[result]
	case less(a[y], a[z]):
		a[result], a[z] = a[z], a[result]
	default:
		a[result], a[y] = a[y], a[result]
	}
}

func unguardedPartition(a []kv, first, last, pivot int, less func(x, y kv) bool) int {
	for {
		for less(a[first], a[pivot]) {
			first++
		}
		last--
		for less(a[pivot], a[last]) {
			last--
		}
		if first >= last {
			return first
		}
		a[first], a[last] = a[last], a[first]
		first++
	}
}

func insertionSort(a []kv, first, last int, less func(x, y kv) bool) {
	for i := first + 1; i < last; i++ {
		if less(a[i], a[first]) {
			v := a[i]
			copy(a[first+1:i+1], a[first:i])
			a[first] = v
		} else {
			unguardedLinearInsert(a, i, less)
		}
	}
}

func unguardedLinearInsert(a []kv, last int, less func(x, y kv) bool) {
	v := a[last]
	next := last - 1
	for less(v, a[next]) {
		a[last] = a[next]
		last = next
		next--
	}
	a[last] = v
}

// heapSort is std::__partial_sort(first, last, last): make_heap then
// sort_heap.
func heapSort(a []kv, less func(x, y kv) bool) {
	n := len(a)
	if n < 2 {
		return
	}
	for parent := (n - 2) / 2; ; parent-- {
		adjustHeap(a, parent, n, a[parent], less)
		if parent == 0 {
			break
		}
	}
	for last := n - 1; last > 0; last-- {
		v := a[last]
		a[last] = a[0]
		adjustHeap(a, 0, last, v, less)
	}
}

func adjustHeap(a []kv, hole, n int, v kv, less func(x, y kv) bool) {
	top := hole
	child := hole
	for child < (n-1)/2 {
		child = 2 * (child + 1)
		if less(a[child], a[child-1]) {
			child--
		}
		a[hole] = a[child]
		hole = child
	}
	if n&1 == 0 && child == (n-2)/2 {
		child = 2 * (child + 1)
		a[hole] = a[child-1]
		hole = child - 1
	}
	parent := (hole - 1) / 2
	for hole > top && less(a[parent], v) {
		a[hole] = a[parent]
		hole = parent
		parent = (hole - 1) / 2
	}
	a[hole] = v
}
