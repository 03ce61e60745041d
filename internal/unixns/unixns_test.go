package unixns

import (
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		t    time.Time
		n    int64
	}{
		{"zero", time.Time{}, 0},
		{"epoch plus one", time.Unix(0, 1), 1},
		{"a slot", time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC), time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC).UnixNano()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := From(tt.t); got != tt.n {
				t.Errorf("From = %d, want %d", got, tt.n)
			}
			if got := Time(tt.n); !got.Equal(tt.t) {
				t.Errorf("Time = %v, want %v", got, tt.t)
			}
		})
	}
}
