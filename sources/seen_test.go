package sources

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
)

// TestFirstSeen: the names a file or django-celery-beat gains while the
// replica runs are first seen when their set is; those of a source's
// first set are not new, a name kept keeps its time, and a name removed
// and added again is seen anew. So on an unsharded merger as on a sharded
// one (whose file and dcb are indexed whole, held or not).
func TestFirstSeen(t *testing.T) {
	t.Parallel()
	file := func(names ...string) *config.Config {
		var y strings.Builder
		y.WriteString("entries:\n")
		for _, n := range names {
			fmt.Fprintf(&y, "  %s: {task: t.%s, every: 10s}\n", n, n)
		}
		return mustParse(t, y.String())
	}
	rows := func(names ...string) map[string][]byte {
		out := map[string][]byte{}
		for _, n := range names {
			out[n] = []byte(`{"task":"t.` + n + `","every":"10s"}`)
		}
		return out
	}
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, sharded := range []bool{false, true} {
		t.Run(fmt.Sprint("sharded=", sharded), func(t *testing.T) {
			now := t0
			c := Config{Now: func() time.Time { return now }}
			if sharded {
				c.ShardOf = func(name string) int { return keys.ShardOf(name, 4) }
			}
			m := New(c)
			if sharded {
				m.ShardPart(0).Hold() // the others' names are indexed alone
			}
			step := func(f *config.Config, dcb map[string][]byte) {
				t.Helper()
				now = now.Add(time.Minute)
				if f != nil {
					if err := m.SetFile(f); err != nil {
						t.Fatal(err)
					}
				}
				if dcb != nil {
					if err := m.SetSource(DCB, dcb); err != nil {
						t.Fatal(err)
					}
				}
			}
			check := func(when string, want map[string]time.Time) {
				t.Helper()
				for name, at := range want {
					if got := m.FirstSeen(name); !got.Equal(at) {
						t.Errorf("%s: FirstSeen(%s) = %v, want %v", when, name, got, at)
					}
				}
			}
			step(file("a", "b"), rows("d1"))                 // 10:01: the first sets
			step(file("a", "b", "c", "e"), rows("d1", "d2")) // 10:02: c, e and d2 are new
			step(file("a", "c", "e", "f"), rows("d2"))       // 10:03: f is new, b gone
			step(file("a", "e", "f"), rows("d2", "d3"))      // 10:04: c gone, d3 new
			step(file("a", "c", "e", "f"), nil)              // 10:05: c again
			check("after the sets", map[string]time.Time{
				"a": {}, "b": {}, "d1": {}, // in the first sets
				"e":  t0.Add(2 * time.Minute),
				"d2": t0.Add(2 * time.Minute),
				"f":  t0.Add(3 * time.Minute),
				"d3": t0.Add(4 * time.Minute),
				"c":  t0.Add(5 * time.Minute),
			})
			// A set the merge refuses changes nothing.
			m.c.Apply = func(*config.Config) error { return fmt.Errorf("refused") }
			now = now.Add(time.Minute)
			if err := m.SetFile(file("a", "g")); err == nil {
				t.Fatal("the refused set was applied")
			}
			check("after a refused set", map[string]time.Time{"g": {}, "e": t0.Add(2 * time.Minute), "c": t0.Add(5 * time.Minute)})
		})
	}
}
