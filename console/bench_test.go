package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
)

// BenchmarkTimelineObserve is the console's cost on the leader's hot path,
// per fire, over 100k entries.
func BenchmarkTimelineObserve(b *testing.B) {
	tl := NewTimeline(nil)
	names := make([]string, 100_000)
	for i := range names {
		names[i] = fmt.Sprintf("entry-%06d", i)
	}
	slot := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tl.Observe(1, names[i%len(names)], slot, broker.ResultOK, time.Millisecond, false)
	}
}
