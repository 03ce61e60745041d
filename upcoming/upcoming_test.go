package upcoming

import (
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/store"
)

// TestUpcoming: the slots listed are the ones the leader fires: no more
// than the runs max_runs leaves after those counted, none past end_at.
func TestUpcoming(t *testing.T) {
	cfg, err := config.Parse("s.yaml", []byte(`entries:
  three: {task: t, cron: "0 * * * *", max_runs: 3}
  ends: {task: t, cron: "0 * * * *", end_at: "2026-11-30T12:00:00Z"}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name, entry string
		runs        uint64
		n, want     int
	}{
		{name: "max_runs, none made", entry: "three", n: 10, want: 3},
		{name: "max_runs, one made", entry: "three", runs: 1, n: 10, want: 2},
		{name: "max_runs, all made", entry: "three", runs: 3, n: 10, want: 0},
		{name: "fewer asked", entry: "three", n: 2, want: 2},
		{name: "end_at (inclusive)", entry: "ends", n: 10, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &store.EntryState{Name: tt.entry, Runs: tt.runs}
			got := Slots(cfg.Entry(tt.entry), st, now, tt.n)
			if len(got) != tt.want {
				t.Fatalf("Slots = %v, want %d slots", got, tt.want)
			}
			for i, s := range got {
				if want := now.Add(time.Duration(i+1) * time.Hour); !s.Equal(want) {
					t.Errorf("slot %d = %v, want %v", i, s, want)
				}
			}
		})
	}
}
