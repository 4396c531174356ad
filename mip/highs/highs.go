package highs

/*
#cgo CFLAGS: -I${SRCDIR}/include

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "highs_c_api.h"

// mt_watch is shared between HiGHS's callback (any HiGHS thread) and Go
// (the watchdog and progress goroutine). It lives in C memory; every field
// is read and written with __atomic builtins.
typedef struct {
	int interrupt;      // nonzero: ask HiGHS to stop at its next check
	uint64_t objective; // bits of the latest incumbent objective (+inf: none)
	uint64_t bound;     // bits of the latest dual bound (-inf: none)
	uint64_t seq;       // bumped after each change of objective or bound
} mt_watch;

static void mt_store(uint64_t* p, double v) {
	uint64_t b;
	memcpy(&b, &v, sizeof b);
	__atomic_store_n(p, b, __ATOMIC_RELAXED);
}

static double mt_load(uint64_t* p) {
	uint64_t b = __atomic_load_n(p, __ATOMIC_RELAXED);
	double v;
	memcpy(&v, &b, sizeof v);
	return v;
}

static mt_watch* mt_watch_new(void) {
	mt_watch* w = (mt_watch*)calloc(1, sizeof(mt_watch));
	if (w != NULL) {
		mt_store(&w->objective, HUGE_VAL);
		mt_store(&w->bound, -HUGE_VAL);
	}
	return w;
}

static void mt_watch_interrupt(mt_watch* w) {
	__atomic_store_n(&w->interrupt, 1, __ATOMIC_RELEASE);
}

static uint64_t mt_watch_seq(mt_watch* w) {
	return __atomic_load_n(&w->seq, __ATOMIC_ACQUIRE);
}

static double mt_watch_objective(mt_watch* w) { return mt_load(&w->objective); }
static double mt_watch_bound(mt_watch* w) { return mt_load(&w->bound); }

static void mt_watch_update(mt_watch* w, double objective, double bound) {
	if (objective == mt_load(&w->objective) && bound == mt_load(&w->bound)) {
		return;
	}
	mt_store(&w->objective, objective);
	mt_store(&w->bound, bound);
	__atomic_add_fetch(&w->seq, 1, __ATOMIC_RELEASE);
}

static void mt_callback(int type, const char* message,
                        const HighsCallbackDataOut* out, HighsCallbackDataIn* in,
                        void* user) {
	(void)message;
	mt_watch* w = (mt_watch*)user;
	if (w == NULL) {
		return;
	}
	switch (type) {
	case kHighsCallbackMipImprovingSolution:
		if (out != NULL) {
			mt_watch_update(w, out->objective_function_value, out->mip_dual_bound);
		}
		break;
	case kHighsCallbackMipInterrupt:
		if (out != NULL) {
			mt_watch_update(w, out->mip_primal_bound, out->mip_dual_bound);
		}
		break;
	}
	switch (type) {
	case kHighsCallbackSimplexInterrupt:
	case kHighsCallbackIpmInterrupt:
	case kHighsCallbackMipInterrupt:
		if (in != NULL && __atomic_load_n(&w->interrupt, __ATOMIC_ACQUIRE)) {
			in->user_interrupt = 1;
		}
		break;
	}
}

// mt_install registers mt_callback with w as its data and starts the
// interrupt callbacks, plus the improving-solution one when progress is set.
static HighsInt mt_install(void* highs, mt_watch* w, int progress) {
	HighsInt st = Highs_setCallback(highs, mt_callback, w);
	if (st == kHighsStatusError) return st;
	if (Highs_startCallback(highs, kHighsCallbackSimplexInterrupt) == kHighsStatusError) return kHighsStatusError;
	if (Highs_startCallback(highs, kHighsCallbackIpmInterrupt) == kHighsStatusError) return kHighsStatusError;
	if (Highs_startCallback(highs, kHighsCallbackMipInterrupt) == kHighsStatusError) return kHighsStatusError;
	if (progress && Highs_startCallback(highs, kHighsCallbackMipImprovingSolution) == kHighsStatusError) return kHighsStatusError;
	return kHighsStatusOk;
}

// mt_run solves and then shuts down this OS thread's HiGHS task scheduler in
// the same cgo call. HiGHS keeps its scheduler in a thread-local and refuses
// a later run with a different "threads" option on that thread; Go reuses OS
// threads across goroutines, so each solve starts from a fresh scheduler.
static HighsInt mt_run(void* highs) {
	HighsInt st = Highs_run(highs);
	Highs_resetGlobalScheduler(1);
	return st;
}
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	// Blank import for its #cgo LDFLAGS: they link the static libhighs.a
	// (HiGHS 1.12) that this package's vendored headers describe.
	_ "github.com/bartolsthoorn/gohighs/highs"

	"github.com/moetuner/moetuner/mip"
)

// Backend solves MIPs with HiGHS. The zero value is ready to use and safe
// for concurrent use: every Solve call runs its own HiGHS instance.
type Backend struct {
	// Verbose turns HiGHS's log on (to standard output).
	Verbose bool
}

var _ mip.Backend = Backend{}

// progressPoll is how often the progress goroutine reads the callback data.
const progressPoll = 200 * time.Millisecond

// absGap is HiGHS's mip_abs_gap: small, so that RelGap decides optimality.
const absGap = 1e-9

// Why the watchdog interrupted HiGHS.
const (
	stopNone int32 = iota
	stopContext
	stopWatchdog
)

// Solve solves m with HiGHS under opts.
//
// The returned error is non-nil when the model is malformed or HiGHS fails
// (then the solution, if any, has Status MIPError), and when ctx ends the
// solve early: then the solution holds the best incumbent found so far
// (MIPFeasible or MIPNoSolution, TimedOut set) and the error is ctx.Err().
// Progress, if set, is called from another goroutine, never concurrently
// with itself, and never after Solve returns; its objective is +Inf
// until HiGHS has an incumbent.
func (b Backend) Solve(ctx context.Context, m *mip.Model, opts mip.Options) (*mip.Solution, error) {
	if err := validate(m); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(m.Cost) == 0 {
		return solveEmpty(m), nil
	}

	h := C.Highs_create()
	if h == nil {
		return nil, fmt.Errorf("highs: Highs_create failed")
	}
	defer C.Highs_destroy(h)

	if err := b.setOptions(h, opts); err != nil {
		return nil, err
	}
	if err := passMip(h, m); err != nil {
		return nil, err
	}
	if opts.Start != nil {
		// An infeasible start is skipped: HiGHS would reject it anyway.
		if x, act, ok := cleanStart(m, opts.Start); ok {
			if st := C.Highs_setSolution(h, f64ptr(x), f64ptr(act), nil, nil); st == C.kHighsStatusError {
				return nil, fmt.Errorf("highs: Highs_setSolution failed")
			}
		}
	}

	w := C.mt_watch_new()
	if w == nil {
		return nil, fmt.Errorf("highs: out of memory")
	}
	defer C.free(unsafe.Pointer(w))
	progress := C.int(0)
	if opts.Progress != nil {
		progress = 1
	}
	if st := C.mt_install(h, w, progress); st == C.kHighsStatusError {
		return nil, fmt.Errorf("highs: installing the callback failed")
	}

	// The watchdog interrupts HiGHS when ctx ends or the wall clock passes
	// the time limit by a margin; it also relays progress.
	var stop atomic.Int32
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var deadline <-chan time.Time
		if opts.TimeLimitSec > 0 {
			t := time.NewTimer(time.Duration((opts.TimeLimitSec*1.1 + 1) * float64(time.Second)))
			defer t.Stop()
			deadline = t.C
		}
		var tick <-chan time.Time
		if opts.Progress != nil {
			t := time.NewTicker(progressPoll)
			defer t.Stop()
			tick = t.C
		}
		ctxDone := ctx.Done()
		var seen C.uint64_t
		for {
			select {
			case <-done:
				return
			case <-ctxDone:
				stop.CompareAndSwap(stopNone, stopContext)
				C.mt_watch_interrupt(w)
				ctxDone = nil
			case <-deadline:
				stop.CompareAndSwap(stopNone, stopWatchdog)
				C.mt_watch_interrupt(w)
				deadline = nil
			case <-tick:
				seen = relayProgress(w, seen, opts.Progress)
			}
		}
	}()

	runStatus := C.mt_run(h)
	close(done)
	wg.Wait()
	if opts.Progress != nil {
		relayProgress(w, 0, opts.Progress)
	}

	sol, err := readSolution(h, m, runStatus)
	if err == nil && stop.Load() == stopContext && sol.Status != mip.Optimal && sol.Status != mip.Infeasible {
		err = ctx.Err()
	}
	return sol, err
}

// relayProgress calls progress if the callback data changed since seen.
func relayProgress(w *C.mt_watch, seen C.uint64_t, progress func(objective, bound float64)) C.uint64_t {
	seq := C.mt_watch_seq(w)
	if seq == seen {
		return seen
	}
	progress(float64(C.mt_watch_objective(w)), float64(C.mt_watch_bound(w)))
	return seq
}

// setOptions applies opts to h.
func (b Backend) setOptions(h unsafe.Pointer, opts mip.Options) error {
	threads := opts.Threads
	if threads <= 0 {
		threads = 1
	}
	seed := opts.Seed
	if seed < 0 || seed > maxHighsInt {
		seed = int(uint32(seed) & maxHighsInt)
	}
	if err := setBool(h, "output_flag", b.Verbose); err != nil {
		return err
	}
	if opts.TimeLimitSec > 0 {
		if err := setDouble(h, "time_limit", opts.TimeLimitSec); err != nil {
			return err
		}
	}
	if opts.RelGap > 0 {
		if err := setDouble(h, "mip_rel_gap", opts.RelGap); err != nil {
			return err
		}
	}
	if opts.NodeLimit > 0 {
		if err := setInt(h, "mip_max_nodes", min(opts.NodeLimit, maxHighsInt)); err != nil {
			return err
		}
	}
	if opts.IterationLimit > 0 {
		if err := setInt(h, "simplex_iteration_limit", min(opts.IterationLimit, maxHighsInt)); err != nil {
			return err
		}
	}
	if err := setDouble(h, "mip_abs_gap", absGap); err != nil {
		return err
	}
	if err := setInt(h, "threads", threads); err != nil {
		return err
	}
	if opts.NoPresolve {
		if err := setString(h, "presolve", "off"); err != nil {
			return err
		}
	}
	return setInt(h, "random_seed", seed)
}

// passMip hands m to h in one Highs_passMip call (row-wise matrix).
func passMip(h unsafe.Pointer, m *mip.Model) error {
	n, rows := len(m.Cost), len(m.RowLower)
	start := make([]C.HighsInt, rows+1)
	if rows > 0 {
		for i, s := range m.RowStart {
			start[i] = C.HighsInt(s)
		}
	}
	index := make([]C.HighsInt, len(m.RowIndex))
	for k, j := range m.RowIndex {
		index[k] = C.HighsInt(j)
	}
	var integrality *C.HighsInt
	if hasInteger(m) {
		integ := make([]C.HighsInt, n)
		for j, b := range m.Integer {
			if b {
				integ[j] = C.kHighsVarTypeInteger
			} else {
				integ[j] = C.kHighsVarTypeContinuous
			}
		}
		integrality = &integ[0]
	}
	st := C.Highs_passMip(h, C.HighsInt(n), C.HighsInt(rows), C.HighsInt(len(m.RowValue)),
		C.kHighsMatrixFormatRowwise, C.kHighsObjSenseMinimize, C.double(m.Offset),
		f64ptr(m.Cost), f64ptr(m.Lower), f64ptr(m.Upper),
		f64ptr(m.RowLower), f64ptr(m.RowUpper),
		intptr(start), intptr(index), f64ptr(m.RowValue), integrality)
	if st == C.kHighsStatusError {
		return fmt.Errorf("highs: Highs_passMip rejected the model")
	}
	return nil
}

// readSolution copies the outcome of a run out of h.
func readSolution(h unsafe.Pointer, m *mip.Model, runStatus C.HighsInt) (*mip.Solution, error) {
	n, rows := len(m.Cost), len(m.RowLower)
	model := C.Highs_getModelStatus(h)
	primal, _ := getIntInfo(h, "primal_solution_status")
	hasX := primal == C.kHighsSolutionStatusFeasible

	sol := &mip.Solution{Objective: math.Inf(1), Bound: math.Inf(-1), Gap: math.Inf(1)}
	var rowDual []float64
	if hasX {
		x := make([]float64, n)
		colDual := make([]float64, n)
		rowValue := make([]float64, rows)
		rowDual = make([]float64, rows)
		C.Highs_getSolution(h, f64ptr(x), f64ptr(colDual), f64ptr(rowValue), f64ptr(rowDual))
		sol.X = x
		sol.Objective = float64(C.Highs_getObjectiveValue(h))
	}
	if hasInteger(m) {
		if v, ok := getDoubleInfo(h, "mip_dual_bound"); ok {
			sol.Bound = v
		}
		if v, ok := getDoubleInfo(h, "mip_gap"); ok {
			sol.Gap = v
		}
	}

	var err error
	switch model {
	case C.kHighsModelStatusOptimal, C.kHighsModelStatusModelEmpty:
		sol.Status = mip.Optimal
		if !hasInteger(m) {
			sol.Bound, sol.Gap = sol.Objective, 0
			sol.RowDual = rowDual
		}
		if !hasX {
			sol.Status = mip.Error
			err = fmt.Errorf("highs: optimal status without a primal solution")
		}
	case C.kHighsModelStatusTimeLimit, C.kHighsModelStatusInterrupt,
		C.kHighsModelStatusIterationLimit, C.kHighsModelStatusSolutionLimit,
		C.kHighsModelStatusObjectiveBound, C.kHighsModelStatusObjectiveTarget:
		sol.TimedOut = model == C.kHighsModelStatusTimeLimit || model == C.kHighsModelStatusInterrupt
		sol.Status = mip.NoSolution
		if hasX {
			sol.Status = mip.Feasible
		}
	case C.kHighsModelStatusInfeasible:
		sol.Status = mip.Infeasible
		sol.X, sol.Objective, sol.Bound = nil, math.Inf(1), math.Inf(1)
	case C.kHighsModelStatusUnbounded, C.kHighsModelStatusUnboundedOrInfeasible:
		sol.Status = mip.Error
		err = fmt.Errorf("highs: model is unbounded or infeasible (HiGHS model status %d)", int(model))
	default:
		sol.Status = mip.Error
		err = fmt.Errorf("highs: solve failed (run status %d, model status %d)", int(runStatus), int(model))
	}
	if sol.Status == mip.NoSolution || sol.Status == mip.Error {
		sol.X, sol.Objective = nil, math.Inf(1)
	}
	return sol, err
}

// WriteModel writes m to path in the format its extension names: ".lp"
// (CPLEX LP) or ".mps" (free MPS). Column and row names come from m; empty
// or missing ones become c<j> and r<i>.
func WriteModel(m *mip.Model, path string) error {
	ext := filepath.Ext(path)
	if ext != ".lp" && ext != ".mps" {
		return fmt.Errorf("highs: WriteModel: extension %q is neither .lp nor .mps", ext)
	}
	if err := validate(m); err != nil {
		return err
	}
	h := C.Highs_create()
	if h == nil {
		return fmt.Errorf("highs: Highs_create failed")
	}
	defer C.Highs_destroy(h)
	if err := setBool(h, "output_flag", false); err != nil {
		return err
	}
	if err := passMip(h, m); err != nil {
		return err
	}
	for j := range m.Cost {
		name := fmt.Sprintf("c%d", j)
		if m.Names != nil && m.Names[j] != "" {
			name = m.Names[j]
		}
		if err := passName(h, true, j, name); err != nil {
			return err
		}
	}
	for i := range m.RowLower {
		name := fmt.Sprintf("r%d", i)
		if m.RowNames != nil && m.RowNames[i] != "" {
			name = m.RowNames[i]
		}
		if err := passName(h, false, i, name); err != nil {
			return err
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if st := C.Highs_writeModel(h, cpath); st != C.kHighsStatusOk {
		return fmt.Errorf("highs: writing %s failed (status %d)", path, int(st))
	}
	return nil
}

func passName(h unsafe.Pointer, col bool, i int, name string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var st C.HighsInt
	if col {
		st = C.Highs_passColName(h, C.HighsInt(i), cname)
	} else {
		st = C.Highs_passRowName(h, C.HighsInt(i), cname)
	}
	if st == C.kHighsStatusError {
		return fmt.Errorf("highs: name %q rejected", name)
	}
	return nil
}

// f64ptr points at s's first element, or at a dummy for an empty s: HiGHS
// gets a valid pointer either way and reads nothing through it. The memory
// is Go's and holds no pointers; C keeps it only for the call.
func f64ptr(s []float64) *C.double {
	if len(s) == 0 {
		return new(C.double)
	}
	return (*C.double)(unsafe.Pointer(&s[0]))
}

func intptr(s []C.HighsInt) *C.HighsInt {
	if len(s) == 0 {
		return new(C.HighsInt)
	}
	return &s[0]
}

func setBool(h unsafe.Pointer, name string, v bool) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var iv C.HighsInt
	if v {
		iv = 1
	}
	if C.Highs_setBoolOptionValue(h, cname, iv) == C.kHighsStatusError {
		return fmt.Errorf("highs: option %s=%v rejected", name, v)
	}
	return nil
}

func setString(h unsafe.Pointer, name, v string) error {
	cname, cv := C.CString(name), C.CString(v)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cv))
	if C.Highs_setStringOptionValue(h, cname, cv) == C.kHighsStatusError {
		return fmt.Errorf("highs: option %s=%s rejected", name, v)
	}
	return nil
}

func setInt(h unsafe.Pointer, name string, v int) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if C.Highs_setIntOptionValue(h, cname, C.HighsInt(v)) == C.kHighsStatusError {
		return fmt.Errorf("highs: option %s=%d rejected", name, v)
	}
	return nil
}

func setDouble(h unsafe.Pointer, name string, v float64) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if C.Highs_setDoubleOptionValue(h, cname, C.double(v)) == C.kHighsStatusError {
		return fmt.Errorf("highs: option %s=%g rejected", name, v)
	}
	return nil
}

func getIntInfo(h unsafe.Pointer, name string) (C.HighsInt, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var v C.HighsInt
	ok := C.Highs_getIntInfoValue(h, cname, &v) != C.kHighsStatusError
	return v, ok
}

func getDoubleInfo(h unsafe.Pointer, name string) (float64, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var v C.double
	ok := C.Highs_getDoubleInfoValue(h, cname, &v) != C.kHighsStatusError
	return float64(v), ok
}
