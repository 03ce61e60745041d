package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestClockOffset: against an "etcd" whose Date headers run skew ahead,
// probes at several fractions of a second bound this replica's offset
// to within ~the spacing of the probes, warn past the threshold, and
// follow a step of etcd's clock at the next probe.
func TestClockOffset(t *testing.T) {
	var skew atomic.Int64
	// Both clocks are one fake clock, etcd's ahead by skew: the probes
	// are spread over the fractions of a second by moving it, not by
	// sleeping.
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", clock.Now().Add(time.Duration(skew.Load())).UTC().Format(http.TimeFormat))
		_, _ = w.Write([]byte(`{"etcdserver":"3.5"}`))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		skew time.Duration
		warn bool
	}{
		{"in step", 0, false},
		{"etcd 5 s ahead", 5 * time.Second, true},
		{"etcd 2.5 s behind", -2500 * time.Millisecond, true},
		{"within the threshold", 600 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skew.Store(int64(tc.skew))
			c := newClockOffset(clock, []string{srv.URL}, nil, time.Second, slog.New(slog.DiscardHandler))
			for range offsetSamples {
				c.probe(context.Background())
				clock.Advance(130 * time.Millisecond) // the next lands at another fraction of a second
			}
			st := c.status()
			if st.OffsetSeconds == nil {
				t.Fatalf("no estimate: %s", st.Warning)
			}
			want := -tc.skew.Seconds() // local minus etcd
			if d := *st.OffsetSeconds - want; d > st.UncertaintySeconds+0.05 || d < -st.UncertaintySeconds-0.05 {
				t.Errorf("offset %.3f ± %.3f s, want %.3f", *st.OffsetSeconds, st.UncertaintySeconds, want)
			}
			if st.UncertaintySeconds > 0.25 {
				t.Errorf("uncertainty %.3f s after %d probes spread over a second", st.UncertaintySeconds, offsetSamples)
			}
			if got := st.Warning != ""; got != tc.warn {
				t.Errorf("warning %q, want one: %v", st.Warning, tc.warn)
			}
			// etcd's clock steps 3 s: the next probe disagrees with the old
			// ones, and the estimate follows it.
			skew.Store(int64(tc.skew + 3*time.Second))
			c.probe(context.Background())
			if st := c.status(); *st.OffsetSeconds > want-2.4 {
				t.Errorf("after a 3 s step the estimate is %.3f s, want about %.3f", *st.OffsetSeconds, want-3)
			}
		})
	}
	// An etcd that does not answer: unknown, and said why.
	c := newClockOffset(clockwork.NewRealClock(), []string{"http://127.0.0.1:1"}, nil, time.Second, slog.New(slog.DiscardHandler))
	c.probe(context.Background())
	if st := c.status(); st.OffsetSeconds != nil || !strings.Contains(st.Warning, "clock offset unknown") {
		t.Errorf("no etcd: %+v", st)
	}
}
