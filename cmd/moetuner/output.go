package main

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/placement"
)

func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return placement.WriteFileAtomic(path, append(data, '\n'))
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	}
}

func fmtSec(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return dur(time.Duration(s * 1e9))
}

func bytesStr(b float64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2fGB", b/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.2fMB", b/1e6)
	case b >= 1e3:
		return fmt.Sprintf("%.1fkB", b/1e3)
	}
	return fmt.Sprintf("%.0fB", b)
}
