package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
)

// fakeDriver records every call and times GEMMs at a synthetic rate of one
// nanosecond per 1000 flops. Every outlierEvery-th Elapsed call adds a
// second, which medians must hide.
type fakeDriver struct {
	devices      int
	free         int64
	outlierEvery int

	calls   []string
	cur     int
	clock   map[int]time.Duration // per device
	events  map[event]time.Duration
	live    map[devPtr]int64
	liveDev map[devPtr]int
	nextPtr devPtr
	nextEv  event
	elapsed int
	gemms   map[int]int // per device
	closed  bool
}

func newFake(devices int, free int64) *fakeDriver {
	return &fakeDriver{devices: devices, free: free, clock: map[int]time.Duration{}, events: map[event]time.Duration{},
		live: map[devPtr]int64{}, liveDev: map[devPtr]int{}, gemms: map[int]int{}, nextPtr: 0x1000, cur: -1}
}

func (f *fakeDriver) log(format string, a ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, a...))
}

func (f *fakeDriver) DeviceCount() (int, error) { return f.devices, nil }
func (f *fakeDriver) Use(d int) error           { f.cur = d; f.log("use %d", d); return nil }
func (f *fakeDriver) MemInfo() (int64, int64, error) {
	var used int64
	for p, b := range f.live {
		if f.liveDev[p] == f.cur {
			used += b
		}
	}
	return f.free - used, f.free, nil
}
func (f *fakeDriver) Alloc(b int64) (devPtr, error) {
	p := f.nextPtr
	f.nextPtr += devPtr(b)
	f.live[p] = b
	f.liveDev[p] = f.cur
	f.log("alloc %d", b)
	return p, nil
}
func (f *fakeDriver) Free(p devPtr) error {
	if _, ok := f.live[p]; !ok {
		return errors.New("double free")
	}
	delete(f.live, p)
	return nil
}
func (f *fakeDriver) Fill(p devPtr, v uint16, n int64) error {
	if f.live[p] != 2*n {
		return fmt.Errorf("fill %d elements of a %d-byte buffer", n, f.live[p])
	}
	return nil
}
func (f *fakeDriver) Gemm(m, n, k int, a, b, c devPtr) error {
	f.clock[f.cur] += time.Duration(2 * m * n * k / 1000)
	f.gemms[f.cur]++
	f.log("gemm %d %d %d", m, n, k)
	return nil
}
func (f *fakeDriver) NewEvent() (event, error) { f.nextEv++; return f.nextEv, nil }
func (f *fakeDriver) Record(ev event) error    { f.events[ev] = f.clock[f.cur]; return nil }
func (f *fakeDriver) Elapsed(s, e event) (time.Duration, error) {
	f.elapsed++
	d := f.events[e] - f.events[s]
	if f.outlierEvery > 0 && f.elapsed%f.outlierEvery == 0 {
		d += time.Second
	}
	return d, nil
}
func (f *fakeDriver) DestroyEvent(ev event) error { delete(f.events, ev); return nil }
func (f *fakeDriver) Close() error                { f.closed = true; return nil }

func TestGPUNoDevice(t *testing.T) {
	w, err := NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{})
	require.NoError(t, err)
	_, err = GPU{drv: newFake(0, 1<<30)}.Run(context.Background(), w, RunOptions{})
	assert.ErrorIs(t, err, ErrNoDevice, "a driver without devices")

	_, err = GPU{Hidden: 64, FFN: 128}.Run(context.Background(), w, RunOptions{})
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("no GPU here: %v", err)
	}
	require.NoError(t, err, "a machine with a CUDA device must run the gpu backend")
}

func TestGPUFakeDriver(t *testing.T) {
	st, c, m := mixtral(t)
	plan := readPlan(t, "mixtral-joint.json")
	w, err := NewWorkload(plan, Input{Stats: st}, WorkloadOptions{BatchTokens: 512, Iterations: 2})
	require.NoError(t, err)
	fake := newFake(1, 80<<30)
	fake.outlierEvery = 3
	meas, err := GPU{drv: fake}.Run(context.Background(), w, RunOptions{Cluster: c, Model: m, Repeats: 3})
	require.NoError(t, err)

	h, f := 4096, 14336 // Mixtral's shape from RunOptions.Model
	// Weights: one set per logical expert (8 × 3 × H×F bf16), then X, gate, up, Y.
	var allocs []string
	for _, call := range fake.calls {
		if len(call) > 5 && call[:5] == "alloc" {
			allocs = append(allocs, call)
		}
	}
	require.Len(t, allocs, 8*3+4)
	assert.Equal(t, fmt.Sprintf("alloc %d", h*f*2), allocs[0])
	maxTok := w.maxSlotTokens()
	assert.Equal(t, fmt.Sprintf("alloc %d", maxTok*h*2), allocs[24])
	assert.Equal(t, fmt.Sprintf("alloc %d", maxTok*f*2), allocs[25])
	assert.Empty(t, fake.live, "every buffer freed")
	assert.Empty(t, fake.events, "every event destroyed")
	assert.True(t, fake.closed)

	// Medians hide the outliers; the times are the GEMMs with true token counts.
	for i := range w.Iterations() {
		for l := range w.Layers() {
			for g, slots := range w.GPUSlots(l) {
				var want time.Duration
				for _, s := range slots {
					n := w.SlotTokens[i][l][s]
					want += 2*time.Duration(2*n*f*h/1000) + time.Duration(2*n*h*f/1000)
				}
				assert.Equal(t, want, meas.GPUTime[i][l][g], "iteration %d layer %d GPU %d", i, l, g)
			}
		}
	}
	// Warm-up runs layer 0 once, then 3 repeats of everything.
	var gemms int
	for i := range w.Iterations() {
		for l := range w.Layers() {
			for _, n := range w.SlotTokens[i][l] {
				if n > 0 {
					gemms += 3
				}
			}
		}
	}
	warm := 0
	for _, n := range w.SlotTokens[0][0] {
		if n > 0 {
			warm += 3
		}
	}
	assert.Equal(t, warm+3*gemms, fake.gemms[0])
	assert.Equal(t, Measured, meas.Compute)
	assert.Equal(t, Modeled, meas.Communication)
	assert.Greater(t, meas.Comm, time.Duration(0))

	data, err := json.Marshal(meas)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(data, &back))
	for _, k := range []string{"backend", "gpu_time_ns", "layers", "tail_ns", "mean_ns", "e2e_ns", "compute", "communication"} {
		assert.Contains(t, back, k)
	}
	assert.Equal(t, "gpu", back["backend"])
}

func TestGPUFakeMemoryAndDevices(t *testing.T) {
	st, _, _ := mixtral(t)
	w, err := NewWorkload(readPlan(t, "mixtral-contiguous.json"), Input{Stats: st}, WorkloadOptions{BatchTokens: 64, Iterations: 1})
	require.NoError(t, err)
	h, f := 1024, 3584
	set := int64(3 * h * f * 2)

	// Room for 3 weight sets only: fall back to 2 (the most experts a GPU holds).
	fake := newFake(2, 3*set+set/2)
	_, err = GPU{Hidden: h, FFN: f, drv: fake, Devices: []int{0, 1}}.Run(context.Background(), w, RunOptions{Repeats: 1, Warmup: -1})
	require.NoError(t, err)
	n := 0
	for _, call := range fake.calls {
		if call == fmt.Sprintf("alloc %d", h*f*2) {
			n++
		}
	}
	assert.Equal(t, 2*2*3, n, "two sets on each of two devices")
	assert.Positive(t, fake.gemms[0])
	assert.Positive(t, fake.gemms[1], "virtual GPUs 1 and 3 run on device 1")

	_, err = GPU{Hidden: h, FFN: f, drv: newFake(1, set/2)}.Run(context.Background(), w, RunOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exceed")
	_, err = GPU{drv: newFake(1, 1<<40), Devices: []int{3}}.Run(context.Background(), w, RunOptions{})
	assert.ErrorContains(t, err, "device 3 out of range")
	_, err = GPU{drv: newFake(1, 1<<40)}.Run(context.Background(), w, RunOptions{Cluster: costmodel.Cluster{Nodes: 1, GPUsPerNode: 8}})
	assert.ErrorContains(t, err, "cluster has 8 GPUs")
}
