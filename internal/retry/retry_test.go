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

func TestGRPCConnectBoundsRedials(t *testing.T) {
	p := GRPCConnect(250*time.Millisecond, 2*time.Second, 3*time.Second)
	if p.Backoff.BaseDelay != 250*time.Millisecond || p.Backoff.MaxDelay != 2*time.Second || p.MinConnectTimeout != 3*time.Second {
		t.Errorf("connect params %+v", p)
	}
	if p.Backoff.Multiplier != 2 || p.Backoff.Jitter != 0.2 {
		t.Errorf("not the one policy (doubling, ±20%%): %+v", p.Backoff)
	}
}
