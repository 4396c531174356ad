#!/usr/bin/env bash
# Runs every fuzz target of the module for a given time each (default 5m),
# one at a time with one worker, and prints one line per target. Crashers
# land in the package's testdata/fuzz/<Target>/ (commit them: they become
# regression cases of `go test`); with KEEP=N the first N inputs of the
# corpus the fuzzer grew in the Go cache are copied there as well.
#   scripts/fuzz.sh [duration] [package-pattern]
set -uo pipefail
cd "$(dirname "$0")/.."
time=${1:-5m}
pattern=${2:-./...}
keep=${KEEP:-0}
cache=$(go env GOCACHE)/fuzz
status=0
for pkg in $(go list "$pattern"); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		start=$(date +%s)
		out=$(go test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -fuzzminimizetime 10s -parallel 1 2>&1)
		rc=$?
		execs=$(printf '%s\n' "$out" | grep -o 'execs: [0-9]*' | tail -1 | cut -d' ' -f2)
		verdict=ok
		if [ $rc -ne 0 ]; then
			verdict="FAIL: $(printf '%s\n' "$out" | grep -m1 -A2 -- '--- FAIL' | tr '\n' ' ')"
			status=1
		fi
		if [ "$keep" -gt 0 ] && [ -d "$cache/$pkg/$target" ]; then
			mkdir -p "$dir/testdata/fuzz/$target"
			ls "$cache/$pkg/$target" | head -n "$keep" | while read -r f; do
				cp -n "$cache/$pkg/$target/$f" "$dir/testdata/fuzz/$target/"
			done
		fi
		echo "$(date -u +%H:%M:%S) ${pkg#github.com/moetuner/moetuner/} $target $(( $(date +%s) - start ))s execs=${execs:-0} $verdict"
	done
done
exit $status
