package election

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
)

// TestLeaseTimingIsMonotonic: the lease keepalive, the local step-down
// and the leader loop read time only through the injected clock, and the
// real clock's readings carry Go's monotonic clock, so the durations they
// measure (keepalive deadlines, TTL − margin, backoffs) do not move when
// NTP or a VM resume steps the wall clock. A direct time.Now, time.Since,
// timer or ticker in these packages would measure by a clock that the
// tests cannot step and a wall step can move; this test fails on one.
func TestLeaseTimingIsMonotonic(t *testing.T) {
	now := clockwork.NewRealClock().Now()
	if !strings.Contains(now.String(), " m=") {
		t.Fatalf("the real clock's Now has no monotonic reading: %s", now)
	}
	banned := map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
		"NewTimer": true, "NewTicker": true, "Tick": true, "Sleep": true}
	for _, dir := range []string{".", "../leader"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && banned[sel.Sel.Name] {
					t.Errorf("%s: time.%s: read time through the injected clock (Config.Clock)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
}
