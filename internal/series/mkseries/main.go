// Command mkseries writes the benchmark series of `moetuner backtest` (see
// BENCHMARKS.md): the shifting traffic mix of SGLang's eight DeepSeek-V3
// prefill workloads as an SGLang logical_count [steps][61][256] JSON.
//
//	go run ./internal/series/mkseries -in DIR -out FILE [-steps 1000] [-tokens 4096] [-seed 1]
//
// DIR holds the prefill_in*.json logical_count files; they are ordered by
// input length (the number after "in"), so the mix turns from short to
// long prompts and back.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/moetuner/moetuner/internal/series"
	"github.com/moetuner/moetuner/routing"
)

func main() {
	in := flag.String("in", "", "directory of prefill_in*.json logical_count files")
	out := flag.String("out", "", "series file to write")
	steps := flag.Int("steps", 1000, "steps")
	tokens := flag.Int("tokens", 4096, "tokens per step")
	period := flag.Int("period", 0, "steps per turn of the mix (default steps/2)")
	seed := flag.Uint64("seed", 1, "seed of the draws")
	flag.Parse()
	if err := run(*in, *out, *steps, *tokens, *period, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "mkseries:", err)
		os.Exit(1)
	}
}

var inLen = regexp.MustCompile(`_in(\d+)`)

func run(in, out string, steps, tokens, period int, seed uint64) error {
	if in == "" || out == "" {
		return fmt.Errorf("want -in DIR and -out FILE")
	}
	files, err := filepath.Glob(filepath.Join(in, "prefill_in*.json"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no prefill_in*.json in %s", in)
	}
	length := func(f string) int {
		m := inLen.FindStringSubmatch(filepath.Base(f))
		n, _ := strconv.Atoi(m[1])
		return n
	}
	slices.SortStableFunc(files, func(a, b string) int { return length(a) - length(b) })
	var ws []*routing.Stats
	for _, f := range files {
		src, err := routing.Load(f, routing.LoadOptions{TopK: 8})
		if err != nil {
			return err
		}
		ws = append(ws, src.Stats)
		fmt.Fprintf(os.Stderr, "workload %d: %s\n", len(ws)-1, filepath.Base(f))
	}
	s, err := series.Mix(ws, series.MixOptions{Steps: steps, TokensPerStep: tokens, Period: period, Seed: seed})
	if err != nil {
		return err
	}
	if err := series.WriteLogicalCount(out, s, ws[0].LayerNames, ws[0].ModelLayers); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s: %d steps × %d MoE layers × %d experts\n", out, steps, ws[0].Layers, ws[0].Experts)
	return nil
}
