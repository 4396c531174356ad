package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/moetuner/moetuner/replay"
)

// replayFile is the part of what 'moetuner replay --json' writes that a
// report shows.
type replayFile struct {
	Backend string `json:"backend"`
	Mode    string `json:"mode"`
	Plans   []struct {
		File        string              `json:"file"`
		Measurement *replay.Measurement `json:"measurement"`
	} `json:"plans"`
	Comparison *replay.Comparison `json:"comparison"`
}

// ReadReplay reads the measurements from the JSON 'moetuner replay --json'
// writes ({"backend", "mode", "plans": [{"file", "measurement"}],
// "comparison"}), naming them with PlanNames. It returns an error naming
// the field when the data are not such a file or are inconsistent (no
// plans, a plan without measured layers, a difference count that does not
// match).
func ReadReplay(data []byte) (*Replay, error) {
	var r replayFile
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("report: replay: %w", err)
	}
	if len(r.Plans) == 0 {
		return nil, errors.New("report: replay: no plans; want the file 'moetuner replay --json' writes")
	}
	var files []string
	for _, pl := range r.Plans {
		files = append(files, pl.File)
	}
	out := &Replay{Names: PlanNames(files)}
	for k, pl := range r.Plans {
		m := pl.Measurement
		if m == nil || len(m.Layers) == 0 {
			return nil, fmt.Errorf("report: replay: plans[%d] (%q) has no measured layers; want the file 'moetuner replay --json' writes", k, pl.File)
		}
		out.Measurements = append(out.Measurements, m)
	}
	m0 := out.Measurements[0]
	out.Note = fmt.Sprintf("backend %s, mode %s; compute %s (%s); communication %s", r.Backend, r.Mode, m0.Compute, m0.ComputeNote, m0.Communication)
	if c := r.Comparison; c != nil {
		if len(c.Diffs) != len(out.Measurements)-1 {
			return nil, fmt.Errorf("report: replay: comparison.diffs has %d entries for %d plans; want one per plan after the first", len(c.Diffs), len(out.Measurements))
		}
		out.Diffs, out.Rounds = c.Diffs, c.Rounds
		out.Note += fmt.Sprintf("; %d interleaved rounds, stopped: %s", c.Rounds, c.Stop)
	}
	return out, nil
}

// ReadBacktest reads a Backtest from JSON ({"title", "unit", "windows",
// "series": [{"name", "values"}], "note"}) and validates it.
func ReadBacktest(data []byte) (*Backtest, error) {
	var b Backtest
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("report: backtest: %w", err)
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return &b, nil
}

// PlanNames labels plan files by their base names, or by their paths
// where two share a base name.
func PlanNames(paths []string) []string {
	count := map[string]int{}
	for _, p := range paths {
		count[filepath.Base(p)]++
	}
	out := make([]string, len(paths))
	for k, p := range paths {
		out[k] = filepath.Base(p)
		if count[out[k]] > 1 {
			out[k] = filepath.ToSlash(p)
		}
	}
	return out
}
