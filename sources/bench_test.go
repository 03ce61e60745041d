package sources

import (
	"fmt"
	"strings"
	"testing"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
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

// BenchmarkShardPartLoad is what a sharded replica's cold start allocates
// to load its share: 6 of 16 shards' runtime entries, of 160,000
// tenant-style documents (~60,000), one part after another. What a load
// allocates while the collector marks the replica's heap is what the
// replica's peak RSS holds above its live heap.
func BenchmarkShardPartLoad(b *testing.B) {
	shardOf := func(name string) int { return keys.ShardOf(name, 16) }
	parts := make([]map[string][]byte, 16)
	for i := range parts {
		parts[i] = map[string][]byte{}
	}
	for i := range 160000 {
		name := fmt.Sprintf("tenant-%07d", i)
		var doc []byte
		switch i % 10 {
		case 0, 1, 2, 3, 4, 5:
			doc = fmt.Appendf(nil, `{"task":"tasks.sync","every":"3600s","start_at":"2026-01-01T05:17:%02dZ","args":[%d]}`, i%60, i)
		case 6, 7, 8:
			doc = fmt.Appendf(nil, `{"task":"tasks.report","crontab":{"minute":"%d","hour":"*/6"},"timezone":"Europe/Berlin","kwargs":{"tenant":%d}}`, i%60, i)
		default:
			doc = fmt.Appendf(nil, `{"task":"tasks.remind","at":"2027-03-12T05:00:00Z","args":[%d]}`, i)
		}
		parts[shardOf(name)][name] = doc
	}
	b.ReportAllocs()
	for b.Loop() {
		m := New(Config{Validate: config.CheckEntry, ShardOf: shardOf, ApplyDelta: func(*config.Config, []string) error { return nil }})
		if err := m.SetFile(nil); err != nil {
			b.Fatal(err)
		}
		for i := range 6 {
			p := m.ShardPart(i)
			p.Hold()
			if err := p.SetSource(API, parts[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
