package schedule

import (
	"testing"
	"time"
)

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustCrontab(t testing.TB, minute, hour, dow, dom, moy string, loc *time.Location) *Crontab {
	t.Helper()
	var masks [5]uint64
	for i, s := range []string{minute, hour, dow, dom, moy} {
		m, err := ParseCrontabField(CrontabField(i), s)
		if err != nil {
			t.Fatal(err)
		}
		masks[i] = m
	}
	c, err := NewCrontab(masks, loc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCrontabCeleryTable holds section A of celery-protocol.md: Celery's own
// unit-test vectors (UTC app, next after last_run_at = now).
func TestCrontabCeleryTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                   string
		minute, hour, dow, dom string
		moy, from, want        string
	}{
		{name: "A1", minute: "*", hour: "*", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-11T14:31:00Z"},
		{name: "A2", minute: "*", hour: "*", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:59:15Z", want: "2010-09-11T15:00:00Z"},
		{name: "A3", minute: "5,42", hour: "*", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-11T14:42:00Z"},
		{name: "A4", minute: "5,10,15", hour: "*", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-11T15:05:00Z"},
		{name: "A5", minute: "5,42", hour: "12,17", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-11T17:05:00Z"},
		{name: "A6", minute: "5,42", hour: "12", dow: "*", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-12T12:05:00Z"},
		{name: "A7", minute: "30", hour: "14", dow: "sat", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-18T14:30:00Z"},
		{name: "A8", minute: "5,42", hour: "*", dow: "mon-fri", dom: "*", moy: "*", from: "2010-09-11T14:30:15Z", want: "2010-09-13T00:05:00Z"},
		{name: "A9", minute: "30", hour: "14", dow: "*", dom: "18", moy: "oct", from: "2010-09-11T14:30:15Z", want: "2010-10-18T14:30:00Z"},
		{name: "A10", minute: "5,42", hour: "*", dow: "*", dom: "13", moy: "nov-dec", from: "2010-09-11T14:30:15Z", want: "2010-11-13T00:05:00Z"},
		{name: "A13 AND of dow and dom", minute: "30", hour: "14", dow: "mon", dom: "18", moy: "*", from: "2010-01-18T14:30:15Z", want: "2010-10-18T14:30:00Z"},
		{name: "A17 leap year", minute: "30", hour: "14", dow: "*", dom: "29", moy: "*", from: "2012-01-29T14:30:15Z", want: "2012-02-29T14:30:00Z"},
		{name: "A18 no Feb 29", minute: "30", hour: "14", dow: "*", dom: "29", moy: "*", from: "2010-01-29T14:30:15Z", want: "2010-03-29T14:30:00Z"},
		{name: "A20", minute: "5,42", hour: "*", dow: "wed,thu", dom: "29", moy: "1,4,7", from: "2010-01-29T14:30:15Z", want: "2010-04-29T00:05:00Z"},
		{name: "A28 Feb 29 only", minute: "30", hour: "14", dow: "*", dom: "29", moy: "2", from: "2012-02-29T14:30:00Z", want: "2016-02-29T14:30:00Z"},
		{name: "H6 Friday 13th", minute: "0", hour: "0", dow: "fri", dom: "13", moy: "*", from: "2024-01-01T00:00:00Z", want: "2024-09-13T00:00:00Z"},
		{name: "wrapping minute range", minute: "55-5", hour: "*", dow: "*", dom: "*", moy: "*", from: "2024-01-01T10:05:00Z", want: "2024-01-01T10:55:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustCrontab(t, tt.minute, tt.hour, tt.dow, tt.dom, tt.moy, time.UTC)
			got := c.Next(mustTime(t, tt.from))
			if want := mustTime(t, tt.want); !got.Equal(want) {
				t.Errorf("Next(%s) = %s, want %s", tt.from, got, want)
			}
		})
	}
}

func TestCrontabNeverFires(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ dom, moy string }{{"31", "4"}, {"30,31", "feb"}, {"31", "2,4,6,9,11"}} {
		var masks [5]uint64
		masks[Minute], _ = ParseCrontabField(Minute, "0")
		masks[Hour], _ = ParseCrontabField(Hour, "0")
		masks[DayOfWeek], _ = ParseCrontabField(DayOfWeek, "*")
		masks[DayOfMonth], _ = ParseCrontabField(DayOfMonth, tt.dom)
		masks[MonthOfYear], _ = ParseCrontabField(MonthOfYear, tt.moy)
		if _, err := NewCrontab(masks, time.UTC); err == nil {
			t.Errorf("dom %s moy %s: want a never-fires error", tt.dom, tt.moy)
		}
	}
}

func TestParseCrontabField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		field   CrontabField
		spec    string
		want    []int
		wantErr bool
	}{
		{field: Hour, spec: "*", want: rangeOf(0, 23)},
		{field: Minute, spec: "1-10", want: rangeOf(1, 10)},
		{field: Minute, spec: "*/15", want: []int{0, 15, 30, 45}},
		{field: Minute, spec: "2-9/5", want: []int{2, 7}},
		{field: Minute, spec: "2-4/3,*/5,0-21/4", want: []int{0, 2, 4, 5, 8, 10, 12, 15, 16, 20, 25, 30, 35, 40, 45, 50, 55}},
		{field: DayOfMonth, spec: "*/5", want: []int{1, 6, 11, 16, 21, 26, 31}},
		{field: DayOfMonth, spec: "2-4/3,*/5,1-21/4", want: []int{1, 2, 5, 6, 9, 11, 13, 16, 17, 21, 26, 31}},
		{field: DayOfWeek, spec: "fri-mon", want: []int{0, 1, 5, 6}},
		{field: DayOfWeek, spec: "tuesday,sunday,fri", want: []int{0, 2, 5}},
		{field: DayOfWeek, spec: "jan", want: []int{1}}, // Celery tries month names first
		{field: MonthOfYear, spec: "aug-oct", want: []int{8, 9, 10}},
		{field: MonthOfYear, spec: "2-12/2", want: []int{2, 4, 6, 8, 10, 12}},
		{field: Minute, spec: "1-5-7", want: rangeOf(1, 5)}, // Celery's start-anchored match
		{field: DayOfWeek, spec: "1, 2", want: []int{1, 2}},
		{field: Minute, spec: "", wantErr: true},
		{field: Minute, spec: "1,,2", wantErr: true},
		{field: Minute, spec: "*/", wantErr: true},
		{field: Minute, spec: "-20", wantErr: true},
		{field: Minute, spec: "*/0", wantErr: true},
		{field: Minute, spec: "60", wantErr: true},
		{field: Hour, spec: "0-30", wantErr: true},
		{field: DayOfWeek, spec: "7", wantErr: true},
		{field: DayOfWeek, spec: "fooday-barday", wantErr: true},
		{field: DayOfMonth, spec: "0-10", wantErr: true},
		{field: MonthOfYear, spec: "sebtember", wantErr: true},
		{field: Minute, spec: "5/15", wantErr: true},
		{field: DayOfMonth, spec: "L", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.field.String()+" "+tt.spec, func(t *testing.T) {
			got, err := ParseCrontabField(tt.field, tt.spec)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("want an error, got %b", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := maskOf(tt.want); got != want {
				t.Errorf("got %b, want %b", got, want)
			}
		})
	}
}

func TestCronVixie(t *testing.T) {
	t.Parallel()
	tests := []struct {
		expr, zone, from, want string
	}{
		{expr: "15 3 * * 1-5", zone: "UTC", from: "2026-11-28T00:00:00Z", want: "2026-11-30T03:15:00Z"},
		// dom OR dow: the 13th, or any Friday.
		{expr: "0 0 13 * 5", zone: "UTC", from: "2024-01-01T00:00:00Z", want: "2024-01-05T00:00:00Z"},
		{expr: "0 0 13 * 5", zone: "UTC", from: "2024-01-12T00:00:00Z", want: "2024-01-13T00:00:00Z"},
		{expr: "30 * * * * *", zone: "UTC", from: "2024-01-01T00:00:00Z", want: "2024-01-01T00:00:30Z"},
		{expr: "@daily", zone: "Europe/Berlin", from: "2024-01-01T12:00:00Z", want: "2024-01-02T00:00:00+01:00"},
		{expr: "@hourly", zone: "UTC", from: "2024-01-01T12:00:00Z", want: "2024-01-01T13:00:00Z"},
		{expr: "@weekly", zone: "UTC", from: "2024-01-01T12:00:00Z", want: "2024-01-07T00:00:00Z"},
		{expr: "@monthly", zone: "UTC", from: "2024-01-01T12:00:00Z", want: "2024-02-01T00:00:00Z"},
		{expr: "@yearly", zone: "UTC", from: "2024-01-01T12:00:00Z", want: "2025-01-01T00:00:00Z"},
		// Spring forward in Berlin: 02:30 does not exist, fires at 03:00.
		{expr: "30 2 * * *", zone: "Europe/Berlin", from: "2024-03-30T12:00:00+01:00", want: "2024-03-31T03:00:00+02:00"},
		// Fall back: 02:30 happens twice, fires at the first.
		{expr: "30 2 * * *", zone: "Europe/Berlin", from: "2024-10-26T12:00:00+02:00", want: "2024-10-27T02:30:00+02:00"},
		{expr: "30 2 * * *", zone: "Europe/Berlin", from: "2024-10-27T02:30:00+02:00", want: "2024-10-28T02:30:00+01:00"},
	}
	for _, tt := range tests {
		t.Run(tt.expr+" "+tt.from, func(t *testing.T) {
			c, err := ParseCron(tt.expr, mustLoc(t, tt.zone))
			if err != nil {
				t.Fatal(err)
			}
			got := c.Next(mustTime(t, tt.from))
			if want := mustTime(t, tt.want); !got.Equal(want) {
				t.Errorf("Next = %s, want %s", got, want)
			}
		})
	}
	for _, bad := range []string{"61 * * * *", "* * * *", "@every 5s", "TZ=UTC * * * * *", "0 0 30 2 *"} {
		if _, err := ParseCron(bad, time.UTC); err == nil {
			t.Errorf("ParseCron(%q): want an error", bad)
		}
	}
}

// TestOverlapSecondOccurrence starts inside the repeated hour: the slots of
// that hour already fired at their first occurrence and must not repeat.
func TestOverlapSecondOccurrence(t *testing.T) {
	t.Parallel()
	berlin := mustLoc(t, "Europe/Berlin")
	c := mustCrontab(t, "*/15", "*", "*", "*", "*", berlin)
	from := mustTime(t, "2024-10-27T02:10:00+01:00")
	if got, want := c.Next(from), mustTime(t, "2024-10-27T03:00:00+01:00"); !got.Equal(want) {
		t.Errorf("Next = %s, want %s", got, want)
	}
	// The first pass through the hour fires each quarter once.
	var got []string
	for s := mustTime(t, "2024-10-27T01:50:00+02:00"); len(got) < 6; {
		s = c.Next(s)
		got = append(got, s.Format(TimeLayout))
	}
	want := []string{"2024-10-27T02:00:00+02:00", "2024-10-27T02:15:00+02:00", "2024-10-27T02:30:00+02:00",
		"2024-10-27T02:45:00+02:00", "2024-10-27T03:00:00+01:00", "2024-10-27T03:15:00+01:00"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("slots = %v, want %v", got, want)
		}
	}
}

// TestDSTDailyProperty: a daily entry at any local time of day fires exactly
// once per local day for a whole year, in zones with 1-hour and 30-minute
// DST shifts.
func TestDSTDailyProperty(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe"} {
		t.Run(zone, func(t *testing.T) {
			t.Parallel()
			loc := mustLoc(t, zone)
			start := time.Date(2024, 1, 1, 0, 0, 0, 0, loc)
			end := time.Date(2025, 1, 1, 0, 0, 0, 0, loc)
			for tod := 0; tod < 24*60; tod += 15 {
				expr := []string{
					// Celery crontab and Vixie cron share the policy; check both.
					"crontab", "cron",
				}
				for _, kind := range expr {
					var s Schedule
					h, m := tod/60, tod%60
					if kind == "crontab" {
						s = mustCrontab(t, itoa(m), itoa(h), "*", "*", "*", loc)
					} else {
						c, err := ParseCron(itoa(m)+" "+itoa(h)+" * * *", loc)
						if err != nil {
							t.Fatal(err)
						}
						s = c
					}
					perDay := map[string]int{}
					prev := start.Add(-time.Second)
					for slot := s.Next(prev); slot.Before(end); slot = s.Next(slot) {
						if !slot.After(prev) {
							t.Fatalf("%s %02d:%02d: slot %s not after %s", kind, h, m, slot, prev)
						}
						perDay[slot.In(loc).Format("2006-01-02")]++
						prev = slot
					}
					days := 0
					for d := start; d.Before(end); d = d.AddDate(0, 0, 1) {
						days++
						if n := perDay[d.Format("2006-01-02")]; n != 1 {
							t.Errorf("%s %02d:%02d fired %d times on %s", kind, h, m, n, d.Format("2006-01-02"))
						}
					}
					if days != 366 {
						t.Fatalf("walked %d days", days)
					}
				}
			}
		})
	}
}

func itoa(v int) string {
	return string(rune('0'+v/10)) + string(rune('0'+v%10))
}

func TestEvery(t *testing.T) {
	t.Parallel()
	anchor := mustTime(t, "2024-01-01T00:00:10Z")
	tests := []struct {
		name     string
		interval time.Duration
		anchor   time.Time
		from     string
		want     string
	}{
		{name: "epoch anchor", interval: 30 * time.Second, from: "2024-01-01T00:00:10Z", want: "2024-01-01T00:00:30Z"},
		{name: "on a slot is strictly after", interval: 30 * time.Second, from: "2024-01-01T00:00:30Z", want: "2024-01-01T00:01:00Z"},
		{name: "start_at anchor", interval: time.Minute, anchor: anchor, from: "2024-01-01T00:00:11Z", want: "2024-01-01T00:01:10Z"},
		{name: "before anchor fires at anchor", interval: time.Minute, anchor: anchor, from: "2023-06-01T00:00:00Z", want: "2024-01-01T00:00:10Z"},
		{name: "sub-second", interval: 250 * time.Millisecond, from: "2024-01-01T00:00:00.3Z", want: "2024-01-01T00:00:00.5Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewEvery(tt.interval, tt.anchor)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := e.Next(mustTime(t, tt.from)), mustTime(t, tt.want); !got.Equal(want) {
				t.Errorf("Next = %s, want %s", got, want)
			}
		})
	}
	if _, err := NewEvery(0, time.Time{}); err == nil {
		t.Error("NewEvery(0): want an error")
	}
}

func TestMissed(t *testing.T) {
	t.Parallel()
	every, _ := NewEvery(time.Minute, time.Time{})
	quarter := mustCrontab(t, "*/15", "*", "*", "*", "*", time.UTC)
	last := mustTime(t, "2024-01-01T10:00:00Z")
	tests := []struct {
		name      string
		s         Schedule
		after     time.Time
		through   string
		limit     int
		wantCount int64
		wantSlots []string
	}{
		{name: "never ran", s: quarter, through: "2024-01-03T12:07:00Z", limit: 5},
		{name: "nothing due", s: quarter, after: last, through: "2024-01-01T10:14:59Z", limit: 5},
		{name: "slot at through is included", s: quarter, after: last, through: "2024-01-01T10:15:00Z", limit: 5,
			wantCount: 1, wantSlots: []string{"2024-01-01T10:15:00Z"}},
		{name: "latest of many", s: quarter, after: last, through: "2024-01-03T12:07:00Z", limit: 2,
			wantCount: 200, wantSlots: []string{"2024-01-03T11:45:00Z", "2024-01-03T12:00:00Z"}},
		{name: "every counts arithmetically", s: every, after: last, through: "2024-01-01T12:00:30Z", limit: 1,
			wantCount: 120, wantSlots: []string{"2024-01-01T12:00:00Z"}},
		{name: "limit 0 counts only", s: every, after: last, through: "2024-01-01T10:03:00Z", limit: 0, wantCount: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Missed(tt.s, tt.after, mustTime(t, tt.through), tt.limit)
			if got.Count != tt.wantCount || len(got.Slots) != len(tt.wantSlots) {
				t.Fatalf("got count %d slots %v, want %d %v", got.Count, got.Slots, tt.wantCount, tt.wantSlots)
			}
			for i, w := range tt.wantSlots {
				if !got.Slots[i].Equal(mustTime(t, w)) {
					t.Errorf("slot %d = %s, want %s", i, got.Slots[i], w)
				}
			}
		})
	}
	// A one-second cron over a long outage stops at MaxScan instead of
	// walking for ever.
	sec, _ := ParseCron("* * * * * *", time.UTC)
	got := Missed(sec, last, last.Add(30*24*time.Hour), 1)
	if !got.Capped || got.Count != MaxScan {
		t.Errorf("got capped=%v count=%d, want capped at %d", got.Capped, got.Count, MaxScan)
	}
}
