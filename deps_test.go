package moetuner

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportDirection keeps data flowing one way (STYLE.md): routing
// imports nothing of ours, placement only routing, costmodel routing and
// placement, solver those three, and only solver/highs imports HiGHS.
func TestImportDirection(t *testing.T) {
	allowed := map[string][]string{
		"routing":   {},
		"placement": {"routing"},
		"costmodel": {"routing", "placement"},
		"solver":    {"routing", "placement", "costmodel"},
		"replay":    {"routing", "placement", "costmodel"},
	}
	const mod = "github.com/moetuner/moetuner/"
	for pkg, ok := range allowed {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "./"+pkg).Output()
		if err != nil {
			t.Fatalf("go list ./%s: %v", pkg, err)
		}
		for _, imp := range strings.Fields(string(out)) {
			if strings.Contains(imp, "gohighs") {
				t.Errorf("%s imports %s: only solver/highs may use HiGHS", pkg, imp)
			}
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			found := false
			for _, a := range ok {
				found = found || a == dep
			}
			if !found {
				t.Errorf("%s imports %s, against the direction of data", pkg, dep)
			}
		}
	}
}
