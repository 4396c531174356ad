package moetuner

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportDirection keeps data flowing one way: internal/torchpt (the
// torch.save reader and writer) imports nothing of ours, routing only
// internal/torchpt, placement those two, baseline those two, costmodel those
// two and internal/stackdispatch, mip
// nothing, mip/highs only mip, the solver's methods (solver/internal/...)
// routing, placement, costmodel and mip, the solver facade all of those
// plus baseline and mip/highs (its default backend), replay neither solver
// nor baseline (the check must not share code with what it checks), report
// at most those and replay (it shows what the solver made but must not
// import it), the rebalancer the solver and what it uses, internal/assign
// (the Hungarian method the solver's methods and the rebalancer share)
// nothing of ours, internal/sharedfiles (tests' lookup of the data beside
// the repository) nothing of ours, internal/pyrand (CPython's random)
// nothing of ours, internal/stackdispatch (the stacks' dispatch rules, which
// costmodel scores by) only internal/pyrand, the experiments harness
// (solver/internal/experiments, a command) the methods and what they use
// plus baseline and internal/sharedfiles, and only mip/highs imports
// HiGHS.
func TestImportDirection(t *testing.T) {
	allowed := map[string][]string{
		"internal/torchpt":       {},
		"routing":                {"internal/torchpt"},
		"placement":              {"routing", "internal/torchpt"},
		"baseline":               {"routing", "placement"},
		"costmodel":              {"routing", "placement", "internal/stackdispatch"},
		"mip":                    {},
		"mip/highs":              {"mip"},
		"solver":                 {"routing", "placement", "baseline", "costmodel", "mip", "mip/highs", "solver/internal/"},
		"solver/internal/...":    {"routing", "placement", "costmodel", "mip", "solver/internal/", "internal/assign"},
		"replay":                 {"routing", "placement", "costmodel"},
		"solvertest":             {"routing", "placement", "costmodel", "solver"},
		"report":                 {"routing", "placement", "costmodel", "replay"},
		"rebalance":              {"routing", "placement", "costmodel", "baseline", "solver", "internal/assign"},
		"internal/series":        {"routing", "placement"},
		"internal/assign":        {},
		"internal/pyrand":        {},
		"internal/stackdispatch": {"internal/pyrand"},
		"internal/sharedfiles":   {},

		// The harness starts from EPLB's plans on the shared traces.
		"solver/internal/experiments": {"routing", "placement", "costmodel", "baseline", "solver/internal/", "internal/sharedfiles"},
	}
	const mod = "github.com/moetuner/moetuner/"
	for pkg, ok := range allowed {
		out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "./"+pkg).Output()
		if err != nil {
			t.Fatalf("go list ./%s: %v", pkg, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			name, imports, _ := strings.Cut(line, ": ")
			if pkg == "solver/internal/..." && name == mod+"solver/internal/experiments" {
				continue // checked under its own entry
			}
			for _, imp := range strings.Fields(imports) {
				if strings.Contains(imp, "gohighs") && name != mod+"mip/highs" {
					t.Errorf("%s imports %s: only mip/highs may use HiGHS", name, imp)
				}
				if !strings.HasPrefix(imp, mod) {
					continue
				}
				dep := strings.TrimPrefix(imp, mod)
				found := false
				for _, a := range ok {
					found = found || a == dep || (strings.HasSuffix(a, "/") && strings.HasPrefix(dep, a))
				}
				if !found {
					t.Errorf("%s imports %s, against the direction of data", name, dep)
				}
			}
		}
	}
}
