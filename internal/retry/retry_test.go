package retry

import (
	"testing"
	"time"
)

func TestBackoffGrowsToMaxWithJitter(t *testing.T) {
	b := Backoff(100*time.Millisecond, time.Second)
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		got := b.NextBackOff()
		if got < want*8/10 || got > want*12/10 {
			t.Errorf("attempt %d: %v, want %v ±20%%", i, got, want)
		}
	}
	b.Reset()
	if got := b.NextBackOff(); got > 120*time.Millisecond {
		t.Errorf("after Reset: %v", got)
	}
}
