package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/store"
)

func TestPlanCatchup(t *testing.T) {
	// Elected at 10:59:30; a minute cron unless the entry says otherwise.
	now := t0.Add(59*time.Minute + 30*time.Second)
	at := func(hm string) time.Time {
		tm, err := time.Parse("15:04:05", hm)
		if err != nil {
			t.Fatal(err)
		}
		return time.Date(2026, 11, 30, tm.Hour(), tm.Minute(), tm.Second(), 0, time.UTC)
	}
	tests := []struct {
		name    string
		entry   string // flow-mapping fields after task
		state   *store.EntryState
		fire    string // slots as HH:MM:SS, comma-separated
		dropped string // reason=count, in order
		next    string
	}{
		{name: "new entry: nothing owed", entry: "cron: '* * * * *'", state: nil,
			next: "11:00:00"},
		{name: "since baseline, nothing missed", entry: "cron: '* * * * *'", state: &store.EntryState{Since: now},
			next: "11:00:00"},
		{name: "once: the latest missed slot", entry: "cron: '* * * * *', catchup_window: 10m", state: &store.EntryState{LastSlot: t0},
			fire: "10:59:00", dropped: "catchup_window=49,catchup_once=9", next: "11:00:00"},
		{name: "all: capped by max_catchup", entry: "cron: '* * * * *', catchup_window: 10m, catchup: all, max_catchup: 3", state: &store.EntryState{LastSlot: t0},
			fire: "10:57:00,10:58:00,10:59:00", dropped: "catchup_window=49,max_catchup=7", next: "11:00:00"},
		{name: "all within the window", entry: "cron: '* * * * *', catchup: all", state: &store.EntryState{LastSlot: at("10:56:00")},
			fire: "10:57:00,10:58:00,10:59:00", next: "11:00:00"},
		{name: "skip", entry: "cron: '* * * * *', catchup: skip", state: &store.EntryState{LastSlot: at("10:56:00")},
			dropped: "catchup_skip=3", next: "11:00:00"},
		{name: "since after the last slot counts from since", entry: "cron: '* * * * *', catchup: all", state: &store.EntryState{LastSlot: t0, Since: at("10:57:30")},
			fire: "10:58:00,10:59:00", next: "11:00:00"},
		{name: "paused: missed slots dropped", entry: "cron: '* * * * *'", state: &store.EntryState{LastSlot: at("10:57:00"), Paused: true},
			dropped: "paused=2", next: "11:00:00"},
		{name: "start_at backfill of a new entry", entry: "every: 10m, start_at: '2026-11-30T10:00:00Z', catchup: all", state: nil,
			fire: "10:00:00,10:10:00,10:20:00,10:30:00,10:40:00,10:50:00", next: "11:00:00"},
		{name: "start_at without catchup all does not backfill", entry: "every: 10m, start_at: '2026-11-30T10:00:00Z'", state: nil,
			next: "11:00:00"},
		{name: "slot due during start-up is a regular slot", entry: "every: 1s, catchup: all", state: &store.EntryState{LastSlot: at("10:59:27")},
			fire: "10:59:28,10:59:29,10:59:30", next: "10:59:31"},
		{name: "a past one-off has no next slot", entry: "at: '2026-11-30T10:30:00Z', catchup: skip", state: &store.EntryState{Since: t0},
			dropped: "catchup_skip=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustConfig(t, "entries:\n  e: {task: t, "+tt.entry+"}\n")
			p := planCatchup(cfg.Entries[0], Anchored(cfg.Entries[0], tt.state, now), tt.state, now)
			var fire, dropped []string
			for _, s := range p.fire {
				fire = append(fire, s.UTC().Format("15:04:05"))
			}
			for _, d := range p.dropped {
				dropped = append(dropped, fmt.Sprintf("%s=%d", d.reason, d.count))
			}
			next := ""
			if !p.next.IsZero() {
				next = p.next.UTC().Format("15:04:05")
			}
			if got := strings.Join(fire, ","); got != tt.fire {
				t.Errorf("fire %s, want %s", got, tt.fire)
			}
			if got := strings.Join(dropped, ","); got != tt.dropped {
				t.Errorf("dropped %s, want %s", got, tt.dropped)
			}
			if next != tt.next {
				t.Errorf("next %s, want %s", next, tt.next)
			}
		})
	}
}

// TestPlanCatchupJitterAhead: a missed slot whose jittered due time is
// still ahead of the election is not missed: it is the next slot.
func TestPlanCatchupJitterAhead(t *testing.T) {
	cfg := mustConfig(t, "entries:\n  e: {task: t, every: 1m, jitter: 59s, catchup: all}\n")
	e := cfg.Entries[0]
	for off := time.Duration(0); off < 60*time.Second; off += 7 * time.Second {
		now := t0.Add(5*time.Minute + off)
		st := &store.EntryState{LastSlot: t0.Add(3 * time.Minute)}
		p := planCatchup(e, Anchored(e, st, now), st, now)
		slot := t0.Add(5 * time.Minute)
		ahead := slot.Add(jitter(e, slot)).After(now)
		if ahead && (!p.next.Equal(slot) || len(p.fire) != 1) {
			t.Errorf("at +%s: slot 5 due later, plan %+v", off, p)
		}
		if !ahead && (len(p.fire) != 2 || !p.next.Equal(t0.Add(6*time.Minute))) {
			t.Errorf("at +%s: slot 5 due already, plan %+v", off, p)
		}
	}
}
