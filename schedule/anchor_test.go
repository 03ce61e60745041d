package schedule

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
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
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseDuration(%q) = %s, want an error", tt.in, got)
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
