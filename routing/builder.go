package routing

import (
	"runtime"
	"sync"
)

// maxCountWorkers caps the goroutines that count one trace: each holds
// its own counts (30 MiB for DeepSeek-V3's 58 layers × 256² experts).
const maxCountWorkers = 4

// chunk is a run of tokens in trace layout: ids n × L × K (every id below
// maxID+1), src and step per token or nil, tok0 the trace index of the
// first token. release, when set, is called once the chunk is counted.
type chunk struct {
	ids       []int16
	n         int
	src, step []int32
	tok0      int64
	maxID     int
	release   func()
}

// statsBuilder turns chunks of a per-token trace into Stats: the exact
// counts on up to GOMAXPROCS counters in parallel (integer counts, so the
// order of adding does not matter), the path sample in the caller's
// goroutine (it depends on the token indices only). The result does not
// depend on the number of workers.
type statsBuilder struct {
	L, K    int
	experts int
	opts    StatsOptions
	sampler *pathSampler
	counted []*counter
	jobs    chan chunk
	wg      sync.WaitGroup
	// inline counts in the caller's goroutine (one worker).
	inline *counter
}

// newStatsBuilder starts counting a trace of L layers and top-k K;
// experts is the number of experts (0: the largest id + 1) and tokens the
// trace length when known (0: unknown), which sizes the path sample.
// chunks is the number of chunks expected (0: unknown), so that short
// traces are counted without goroutines.
func newStatsBuilder(L, K, experts int, tokens int64, chunks int, opts StatsOptions) *statsBuilder {
	b := &statsBuilder{L: L, K: K, experts: experts, opts: opts}
	if capacity := sampleCapacity(tokens, L, K, opts); capacity != 0 {
		b.sampler = newPathSampler(L, K, capacity)
		b.sampler.presize(tokens)
	}
	workers := min(runtime.GOMAXPROCS(0), maxCountWorkers)
	if chunks > 0 {
		workers = min(workers, chunks)
	}
	if workers <= 1 {
		b.inline = newCounter(L, K, experts, opts.Transitions, 0)
		return b
	}
	b.jobs = make(chan chunk, workers)
	for range workers {
		c := newCounter(L, K, experts, opts.Transitions, 0)
		b.counted = append(b.counted, c)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for ch := range b.jobs {
				c.grow(ch.maxID)
				c.add(ch.ids, ch.n, ch.src, ch.step, ch.tok0)
				if ch.release != nil {
					ch.release()
				}
			}
		}()
	}
	return b
}

// add offers the chunk's paths to the sample and queues it for counting.
func (b *statsBuilder) add(ch chunk) {
	if ch.n == 0 {
		if ch.release != nil {
			ch.release()
		}
		return
	}
	if b.sampler != nil {
		LK := b.L * b.K
		for t := range ch.n {
			src := int32(-1)
			if ch.src != nil {
				src = ch.src[t]
			}
			b.sampler.offer(ch.tok0+int64(t), src, ch.ids[t*LK:(t+1)*LK])
		}
	}
	if b.inline != nil {
		b.inline.grow(ch.maxID)
		b.inline.add(ch.ids, ch.n, ch.src, ch.step, ch.tok0)
		if ch.release != nil {
			ch.release()
		}
		return
	}
	b.jobs <- ch
}

// wait stops the workers and returns the merged counter.
func (b *statsBuilder) wait() *counter {
	if b.inline != nil {
		return b.inline
	}
	close(b.jobs)
	b.wg.Wait()
	total := b.counted[0]
	for _, c := range b.counted[1:] {
		total.merge(c)
	}
	b.inline, b.counted = total, nil
	return total
}

// stats finishes counting and returns the statistics for experts experts
// (0: the builder's, or the largest id + 1).
func (b *statsBuilder) stats(experts int) *Stats {
	c := b.wait()
	if experts == 0 {
		experts = b.experts
	}
	c.sampler = b.sampler
	return c.stats(experts, b.opts.PathError)
}

// abort stops the workers without building stats (after a read error).
func (b *statsBuilder) abort() {
	if b.inline == nil {
		close(b.jobs)
		b.wg.Wait()
		b.inline = &counter{}
	}
}

// workers is the number of goroutines counting (1 when inline).
func (b *statsBuilder) workers() int { return max(len(b.counted), 1) }
