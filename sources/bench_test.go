package sources

import (
	"fmt"
	"strings"
	"testing"

	"github.com/beatd/beatd/config"
)

// BenchmarkMergeOneAPIChange is the cost of applying one runtime entry
// change next to a large schedules.yaml and many runtime entries (the
// scheduler's own Reload comes on top).
func BenchmarkMergeOneAPIChange(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var sb strings.Builder
			sb.WriteString("entries:\n")
			for i := range n {
				fmt.Fprintf(&sb, "  f%d: {task: t, every: %ds}\n", i, 10+i%50)
			}
			file, err := config.Parse("s.yaml", []byte(sb.String()))
			if err != nil {
				b.Fatal(err)
			}
			m := New(Config{ApplyDelta: func(*config.Config, []string) error { return nil }})
			if err := m.SetFile(file); err != nil {
				b.Fatal(err)
			}
			docs := map[string][]byte{}
			for i := range n / 10 {
				docs[fmt.Sprint("a", i)] = []byte(`{"task":"t","every":"30s"}`)
			}
			if err := m.SetSource(API, docs); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				change := map[string][]byte{"a0": fmt.Appendf(nil, `{"task":"t","every":"%ds"}`, 1+i%60)}
				if err := m.UpdateSource(API, change); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
