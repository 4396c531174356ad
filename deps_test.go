package moetuner

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestImportDirection keeps data flowing one way: internal/torchpt (the
// torch.save reader and writer) imports nothing of ours, routing only
// internal/torchpt, placement those two, baseline those two, costmodel those
// two and internal/stackdispatch, mip
// nothing, mip/highs only mip, the solver's methods (solver/internal/...)
// routing, placement, costmodel and mip, the solver facade all of those
// plus baseline and, in builds with cgo, mip/highs (its default backend),
// replay neither solver
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

// TestBuildsWithoutCgo keeps cgo optional: only mip/highs has cgo files
// (a file with import "C" elsewhere would silently drop out of a build
// without cgo), and without cgo no other package depends on mip/highs or
// HiGHS. Unless -short it also builds every package but mip/highs with
// CGO_ENABLED=0, vets solver and rebalance (tests included) that way, and
// runs the command line so built: plan --strategy eplb writes its plan,
// plan (joint, whose single-copy path needs the ILP) fails naming the
// build requirement, and compare skips the ILP strategies and shows the
// rest.
func TestBuildsWithoutCgo(t *testing.T) {
	const mod = "github.com/moetuner/moetuner/"
	goCmd := func(cgo string, args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := goCmd("1", "list", "-f", `{{.ImportPath}}|{{join .CgoFiles " "}}`, "./...")
	require.NoError(t, err, out)
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, files, _ := strings.Cut(line, "|")
		if name == mod+"mip/highs" || name+"/" == mod {
			continue // mip/highs is the cgo; the module root holds only tests
		}
		pkgs = append(pkgs, name)
		assert.Empty(t, files, "%s has cgo files: only mip/highs may use cgo", name)
	}
	require.NotEmpty(t, pkgs)
	out, err = goCmd("0", append([]string{"list", "-deps", "-f", `{{.ImportPath}}`}, pkgs...)...)
	require.NoError(t, err, out)
	for _, dep := range strings.Fields(out) {
		if strings.Contains(dep, "gohighs") || dep == mod+"mip/highs" {
			t.Errorf("without cgo, some package but mip/highs still depends on %s (go list -deps says so); keep HiGHS behind the cgo build constraint", dep)
		}
	}
	if testing.Short() {
		t.Skip("the builds without cgo take a minute on a busy machine")
	}
	out, err = goCmd("0", append([]string{"build"}, pkgs...)...)
	require.NoError(t, err, "CGO_ENABLED=0 go build: %s", out)
	out, err = goCmd("0", "vet", "./solver", "./rebalance")
	require.NoError(t, err, "CGO_ENABLED=0 go vet: %s", out)

	dir := t.TempDir()
	bin := filepath.Join(dir, "moetuner")
	out, err = goCmd("0", "build", "-o", bin, "./cmd/moetuner")
	require.NoError(t, err, out)
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	plan := filepath.Join(dir, "eplb.json")
	out, err = run("plan", "--strategy", "eplb", "--out", plan, "--quiet")
	require.NoError(t, err, out)
	_, err = os.Stat(plan)
	assert.NoError(t, err, "plan --strategy eplb wrote its plan")
	out, err = run("plan", "--out", filepath.Join(dir, "joint.json"), "--quiet")
	assert.Error(t, err)
	assert.Contains(t, out, "built without cgo")
	assert.Contains(t, out, "CGO_ENABLED=1")
	assert.Contains(t, out, "pass a --strategy that needs no ILP (eplb,")
	assert.NotContains(t, out, "Options.", "the command line names its flags")
	out, err = run("compare", "--effort", "1")
	require.NoError(t, err, out)
	assert.Contains(t, out, "skipping the moetuner strategy")
	assert.Contains(t, out, "skipping the joint strategy")
	assert.Contains(t, out, "eplb")
}
