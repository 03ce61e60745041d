package schedule

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in       string
		want     time.Duration
		bad      bool
		overflow bool
	}{
		{in: "30s", want: 30 * time.Second},
		{in: "1d", want: 24 * time.Hour},
		{in: "2w", want: 14 * 24 * time.Hour},
		{in: "1w2d12h30m", want: (9*24+12)*time.Hour + 30*time.Minute},
		{in: "1.5d", want: 36 * time.Hour},
		{in: "0", want: 0},
		{in: "-1d", want: -24 * time.Hour},
		{in: "", bad: true},
		{in: "d", bad: true},
		{in: "1x", bad: true},
		{in: "1d-3h", bad: true},
		{in: "1h1d", bad: true}, // days lead, as timedelta's largest unit
		// Beyond time.Duration: refused as out of range, never wrapped.
		{in: "3000000h", bad: true, overflow: true},
		{in: "50000d50000d50000d50000d50000d", bad: true, overflow: true},
		{in: "100000w", bad: true, overflow: true},
		{in: "106751d24h", bad: true, overflow: true},
		{in: "106751d23h", want: (106751*24 + 23) * time.Hour},
		{in: "1.2.3h", bad: true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseDuration(%q) = %s, want an error", tt.in, got)
			}
			if errors.Is(err, ErrDurationRange) != tt.overflow {
				t.Errorf("ParseDuration(%q): %v; out of range: %v, want %v", tt.in, err, errors.Is(err, ErrDurationRange), tt.overflow)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestEveryAnchoredAt(t *testing.T) {
	since := time.Date(2026, 11, 30, 10, 0, 3, 400e6, time.UTC)
	plain, _ := NewEvery(10*time.Second, time.Time{})
	a := plain.AnchoredAt(since)
	if got := a.Next(since); !got.Equal(time.Date(2026, 11, 30, 10, 0, 13, 0, time.UTC)) {
		t.Errorf("anchored Next = %s, want 10:00:13 (anchor rounded down to the second)", got)
	}
	if plain.Anchor.IsZero() == false {
		t.Error("AnchoredAt modified its receiver")
	}
	if b := a.AnchoredAt(since.Add(time.Second)); !b.Anchor.Equal(since.Add(time.Second).Truncate(time.Second)) {
		t.Errorf("re-anchoring kept %s", b.Anchor)
	}
	if got := a.Prev(since.Add(25 * time.Second)); !got.Equal(time.Date(2026, 11, 30, 10, 0, 23, 0, time.UTC)) {
		t.Errorf("Prev = %s, want 10:00:23", got)
	}
	rel := &Every{Interval: time.Hour, Relative: true}
	if rel.AnchoredAt(since) != rel {
		t.Error("a relative interval was anchored")
	}
	start := time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC)
	fixed, _ := NewEvery(time.Hour, start)
	if fixed.AnchoredAt(since) != fixed {
		t.Error("start_at did not win over the anchor")
	}
	if Anchor(plain, time.Time{}) != Schedule(plain) {
		t.Error("a zero since anchored the grid")
	}
}

// TestEveryNextAfter holds Every.Next to its contract at the edges of
// what time arithmetic represents: a slot is strictly after the time
// asked about, or the zero time ("never"), whatever the interval, anchor
// and time.
func TestEveryNextAfter(t *testing.T) {
	t.Parallel()
	const year = 365 * 24 * time.Hour
	times := []time.Time{
		{},
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1677, 9, 21, 0, 12, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC),
		time.Date(2199, 12, 31, 0, 0, 0, 0, time.UTC),
		time.Date(2262, 4, 11, 23, 47, 16, 0, time.UTC),
		time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	tests := []struct {
		name     string
		interval time.Duration
		anchor   time.Time
	}{
		{name: "1ns, epoch", interval: 1},
		{name: "2400000h, epoch", interval: 2400000 * time.Hour},
		{name: "2400000h, anchored now", interval: 2400000 * time.Hour, anchor: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)},
		{name: "ten years, anchored 2199", interval: 10 * year, anchor: time.Date(2199, 1, 1, 0, 0, 0, 0, time.UTC)},
		{name: "max duration, anchored 1700", interval: math.MaxInt64, anchor: time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)},
		{name: "1s, anchored 1678", interval: time.Second, anchor: time.Date(1678, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEvery(tt.interval, tt.anchor)
			if err != nil {
				t.Fatal(err)
			}
			for _, from := range times {
				at := from
				for range 3 {
					next := e.Next(at)
					if next.IsZero() {
						break
					}
					if !next.After(at) {
						t.Fatalf("Next(%s) = %s, not after it", at.Format(time.RFC3339Nano), next.Format(time.RFC3339Nano))
					}
					at = next
				}
				if p := e.Prev(from); !tt.anchor.IsZero() && from.After(tt.anchor) && p.After(from) {
					t.Errorf("Prev(%s) = %s, after it", from.Format(time.RFC3339), p.Format(time.RFC3339))
				}
			}
		})
	}
	if _, err := NewEvery(time.Second, time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Error("NewEvery with an anchor in 2300: want an error")
	}
}
