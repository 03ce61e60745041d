package console

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/beatd/beatd/broker"
)

// TestTimelineHourCounts checks the compact per-entry record against a
// plain count of the fires in the hour up to now, for entries firing
// rarely (the few kept minutes), often (counts per minute), and an entry
// that crosses from one to the other.
func TestTimelineHourCounts(t *testing.T) {
	tests := []struct {
		name string
		gap  func(r *rand.Rand) time.Duration // between observations
		fail float64                          // share of errors
	}{
		{"hourly", func(*rand.Rand) time.Duration { return time.Hour }, 0},
		{"every 20 min", func(*rand.Rand) time.Duration { return 20 * time.Minute }, 0.1},
		{"every 10 s", func(*rand.Rand) time.Duration { return 10 * time.Second }, 0.1},
		{"bursts and silences", func(r *rand.Rand) time.Duration {
			if r.IntN(10) == 0 {
				return time.Duration(r.IntN(90)) * time.Minute
			}
			return time.Duration(r.IntN(120)) * time.Second
		}, 0.2},
		{"uneven, a few an hour", func(r *rand.Rand) time.Duration { return time.Duration(5+r.IntN(25)) * time.Minute }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			tl := NewTimeline(func() time.Time { return now })
			var fires []time.Time
			for step := 0; step < 400; step++ {
				now = now.Add(tt.gap(r))
				res := broker.ResultOK
				if r.Float64() < tt.fail {
					res = broker.ResultError
				} else {
					fires = append(fires, now)
				}
				tl.Observe(1, "e", now, res, time.Millisecond, false)
				want := 0
				cur := now.Unix() / 60
				for _, f := range fires {
					if m := f.Unix() / 60; m > cur-60 && m <= cur {
						want++
					}
				}
				got := tl.Snapshot([]string{"e"}).Entries["e"]
				if now.Sub(fires[len(fires)-1]) >= time.Hour && res != broker.ResultOK {
					continue // may have been swept; what is left must still be right
				}
				if got.LastHour != want {
					t.Fatalf("step %d at %s: %d fires in the last hour, want %d", step, now.Format(time.TimeOnly), got.LastHour, want)
				}
				if !got.At.Equal(now) || (got.Result == "ok") != (res == broker.ResultOK) {
					t.Fatalf("step %d: last %+v, want at %s, %v", step, got, now, res)
				}
			}
		})
	}
}

// TestTimelineSweep: the records of entries silent for an hour go, so a
// long term with entries coming and going does not grow the map, and the
// others stay.
func TestTimelineSweep(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	tl := NewTimeline(func() time.Time { return now })
	for i := range 1000 {
		tl.Observe(1, fmt.Sprintf("gone-%d", i), now, broker.ResultOK, time.Millisecond, false)
	}
	for range 7 {
		now = now.Add(10 * time.Minute)
		tl.Observe(1, "busy", now, broker.ResultOK, time.Millisecond, false)
	}
	tl.Observe(1, "busy", now, broker.ResultError, time.Millisecond, false)
	if n := len(tl.entries); n != 1 {
		t.Fatalf("%d records after 70 min, want only busy's", n)
	}
	s := tl.Snapshot([]string{"busy", "gone-1"})
	if s.Entries["busy"].LastHour != 6 || s.Entries["busy"].Result != "error" {
		t.Errorf("busy: %+v, want 6 fires in the hour and the error last", s.Entries["busy"])
	}
	if _, ok := s.Entries["gone-1"]; ok {
		t.Error("an entry silent for an hour still has a record")
	}
	// A busy map that empties is copied, not kept at its largest.
	if tl.peak > 1 {
		t.Errorf("peak %d after the sweep, want the map copied at 1", tl.peak)
	}
	// 48 bytes an entry is what a million entries can afford here.
	if n := unsafe.Sizeof(entryStats{}); n > 48 {
		t.Errorf("entryStats is %d bytes, want at most 48", n)
	}
}

// TestTimelineSweepAvoidsMinuteStart: a sweep that falls due with a
// minute's first fires (a crontab burst) waits for the minute's second
// half, and only for so long.
func TestTimelineSweepAvoidsMinuteStart(t *testing.T) {
	start := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		at    time.Duration // after start, of the fire that may sweep
		swept bool
	}{
		{"at a minute's start", 61*time.Minute + 2*time.Second, false},
		{"in a minute's second half", 61*time.Minute + 31*time.Second, true},
		{"at a minute's start, a sweep overdue", 71*time.Minute + time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := start
			tl := NewTimeline(func() time.Time { return now })
			tl.Observe(1, "gone", now, broker.ResultOK, time.Millisecond, false)
			now = start.Add(50*time.Minute + 30*time.Second) // swept here: gone is not an hour old yet
			tl.Observe(1, "busy", now, broker.ResultOK, time.Millisecond, false)
			if _, ok := tl.entries["gone"]; !ok || tl.swept != now.Unix()/60 {
				t.Fatalf("setup: gone kept %v, swept at minute %d", ok, tl.swept)
			}
			now = start.Add(tc.at) // the next sweep is due from minute 60
			tl.Observe(1, "busy", now, broker.ResultOK, time.Millisecond, false)
			if _, kept := tl.entries["gone"]; kept == tc.swept {
				t.Errorf("fire at %s: gone's record kept %v, want swept %v", now.Format(time.TimeOnly), kept, tc.swept)
			}
		})
	}
}

// TestTermSnapshot: a led shard's numbers are its term's. Its timeline
// starts over only at the term's first fire, so until then it still holds
// the fires of an earlier term, which the term must not be credited with.
func TestTermSnapshot(t *testing.T) {
	now := time.Date(2026, 12, 5, 19, 0, 30, 0, time.UTC)
	won := now.Add(-10 * time.Second)
	tl := NewTimeline(func() time.Time { return now })
	for range 3 {
		tl.Observe(5, "e", now, broker.ResultOK, time.Millisecond, false)
	}
	tests := []struct {
		name      string
		term      int64
		since     time.Time
		hasEntry  bool
		wantTerm  int64
		wantFires int
	}{
		{name: "the timeline's term", term: 5, since: now, hasEntry: true, wantTerm: 5, wantFires: 3},
		{name: "a later term with no fire yet", term: 7, since: won, wantTerm: 7, wantFires: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := termSnapshot(LedShard{Shard: 1, Term: tt.term, Elected: won, Timeline: tl}, []string{"e"})
			fires := 0
			for _, m := range s.Minutes {
				fires += m.Fires
			}
			_, has := s.Entries["e"]
			if s.Term != tt.wantTerm || fires != tt.wantFires || !s.Since.Equal(tt.since) || has != tt.hasEntry || len(s.Minutes) != 60 {
				t.Errorf("term %d: term %d, %d fires in %d minutes, since %v, entry listed %v; want term %d, %d fires in 60, since %v, listed %v",
					tt.term, s.Term, fires, len(s.Minutes), s.Since, has, tt.wantTerm, tt.wantFires, tt.since, tt.hasEntry)
			}
		})
	}
}
