package schedule

import (
	"sort"
	"strings"
	"testing"
	"time"
)

// refMonth lists a month's days as the reference sees them: with
// time.Date, not the package's day arithmetic.
type refMonth struct {
	y    int
	m    time.Month
	last int
}

func (r refMonth) weekday(d int) time.Weekday {
	return time.Date(r.y, r.m, d, 12, 0, 0, 0, time.UTC).Weekday()
}

func (r refMonth) isWeekday(d int) bool {
	wd := r.weekday(d)
	return wd != time.Saturday && wd != time.Sunday
}

// nearest is Quartz's nW said another way: of the month's Monday-to-
// Friday days, the one closest to day n (there is never a tie).
func (r refMonth) nearest(n int) int {
	best := 0
	for d := 1; d <= r.last; d++ {
		if r.isWeekday(d) && (best == 0 || abs(d-n) < abs(best-n)) {
			best = d
		}
	}
	return best
}

// occurrences lists the days of the month that fall on wd.
func (r refMonth) occurrences(wd time.Weekday) []int {
	var out []int
	for d := 1; d <= r.last; d++ {
		if r.weekday(d) == wd {
			out = append(out, d)
		}
	}
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// refInstant is the DST policy said another way: the first instant, found
// minute by minute, whose wall clock in loc reads the wall time, or when
// none does (a spring-forward gap) the first whose wall clock is past it.
func refInstant(y int, m time.Month, d, h, mi int, loc *time.Location) time.Time {
	wall := time.Date(y, m, d, h, mi, 0, 0, time.UTC)
	// Any instant within a few hours of the answer starts the search: a
	// zone's offset moves by at most an hour in a day.
	_, off := wall.In(loc).Zone()
	start := wall.Add(-time.Duration(off)*time.Second - 3*time.Hour)
	for u := start; u.Before(start.Add(6 * time.Hour)); u = u.Add(time.Minute) {
		l := u.In(loc)
		if !time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), 0, 0, time.UTC).Before(wall) {
			if u.Equal(start) {
				panic("the search started too late")
			}
			return u.In(loc)
		}
	}
	panic("no instant")
}

// TestDayRulesAgainstReference walks L, W and # expressions over four
// years in three zones (New York's and London's hour shifts, Lord Howe's
// half hour) and compares every slot with a reference computed from the
// calendar by time.Date, one day at a time, and from the wall clock by a
// minute-by-minute search. The expressions fall on DST change days: the
// second Sunday of March and the first of November in New York, the last
// Sundays of March and October in London, the first Sundays of April and
// October on Lord Howe.
func TestDayRulesAgainstReference(t *testing.T) {
	tests := []struct {
		expr    string
		hours   []int
		minutes []int
		day     func(r refMonth, d int) bool
	}{
		{"0 9 L * *", []int{9}, []int{0}, func(r refMonth, d int) bool { return d == r.last }},
		{"30 2 L-3 * *", []int{2}, []int{30}, func(r refMonth, d int) bool { return d == r.last-3 }},
		{"0 12 LW * *", []int{12}, []int{0}, func(r refMonth, d int) bool {
			for l := r.last; ; l-- {
				if r.isWeekday(l) {
					return d == l
				}
			}
		}},
		{"15 8 1W,15W,31W * *", []int{8}, []int{15}, func(r refMonth, d int) bool {
			return d == r.nearest(1) || d == r.nearest(15) || r.last == 31 && d == r.nearest(31)
		}},
		{"0 17 * * FRIL", []int{17}, []int{0}, func(r refMonth, d int) bool {
			o := r.occurrences(time.Friday)
			return d == o[len(o)-1]
		}},
		{"30 2 * * SUN#2", []int{2}, []int{30}, func(r refMonth, d int) bool { return d == r.occurrences(time.Sunday)[1] }},
		{"30 1 * * 0L", []int{1}, []int{30}, func(r refMonth, d int) bool {
			o := r.occurrences(time.Sunday)
			return d == o[len(o)-1]
		}},
		{"0,45 1,2 * * 7#1,3#5", []int{1, 2}, []int{0, 45}, func(r refMonth, d int) bool {
			th := r.occurrences(time.Wednesday)
			return d == r.occurrences(time.Sunday)[0] || len(th) == 5 && d == th[4]
		}},
		// Vixie: a restricted day of month OR a restricted day of week.
		{"0 10 1,L * MON", []int{10}, []int{0}, func(r refMonth, d int) bool {
			return d == 1 || d == r.last || r.weekday(d) == time.Monday
		}},
		// A plain day-of-month with a day-of-week rule, in February only.
		{"0 3 29 2 MON#1", []int{3}, []int{0}, func(r refMonth, d int) bool {
			return r.m == time.February && (d == 29 || d == r.occurrences(time.Monday)[0])
		}},
	}
	zones := []string{"America/New_York", "Europe/London", "Australia/Lord_Howe"}
	from := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	to := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
	if testing.Short() {
		zones = zones[:2]
	}
	for _, zone := range zones {
		loc := mustLoc(t, zone)
		for _, tt := range tests {
			c, err := ParseCron(tt.expr, loc)
			if err != nil {
				t.Fatalf("%s: %v", tt.expr, err)
			}
			seen := map[int64]bool{}
			var want []time.Time
			for y := from.Year() - 1; y <= to.Year(); y++ {
				for m := time.January; m <= time.December; m++ {
					r := refMonth{y, m, time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()}
					for d := 1; d <= r.last; d++ {
						if !tt.day(r, d) {
							continue
						}
						for _, h := range tt.hours {
							for _, mi := range tt.minutes {
								u := refInstant(y, m, d, h, mi, loc)
								if u.Before(from) || !u.Before(to) || seen[u.Unix()] {
									continue
								}
								seen[u.Unix()] = true
								want = append(want, u)
							}
						}
					}
				}
			}
			sort.Slice(want, func(i, j int) bool { return want[i].Before(want[j]) })
			var got []time.Time
			for s := c.Next(from.Add(-time.Second)); s.Before(to); s = c.Next(s) {
				got = append(got, s)
			}
			if len(got) != len(want) {
				t.Errorf("%s in %s: %d slots, the reference %d", tt.expr, zone, len(got), len(want))
			}
			for i := range min(len(got), len(want)) {
				if !got[i].Equal(want[i]) {
					t.Errorf("%s in %s: slot %d is %s, the reference %s", tt.expr, zone, i, FormatSlot(got[i]), FormatSlot(want[i]))
					break
				}
			}
			if len(want) == 0 {
				t.Errorf("%s in %s: the reference has no slot", tt.expr, zone)
			}
		}
	}
}

// TestDayRulesOnDSTDays spells out what the reference agreed to on the
// days that matter: a slot in a spring-forward gap fires at the
// transition, one in a fall-back overlap at its first occurrence.
func TestDayRulesOnDSTDays(t *testing.T) {
	tests := []struct {
		expr, zone, from, want string
	}{
		// New York springs forward at 02:00 on the second Sunday of March.
		{"30 2 * 3 SUN#2", "America/New_York", "2026-01-01T00:00:00Z", "2026-03-08T03:00:00-04:00"},
		// London falls back at 02:00 BST on the last Sunday of October.
		{"30 1 * 10 SUNL", "Europe/London", "2026-01-01T00:00:00Z", "2026-10-25T01:30:00+01:00"},
		// Lord Howe springs forward half an hour at 02:00 on the first Sunday of October.
		{"15 2 * 10 SUN#1", "Australia/Lord_Howe", "2026-01-01T00:00:00Z", "2026-10-04T02:30:00+11:00"},
		{"0 9 L 2 *", "UTC", "2027-03-01T00:00:00Z", "2028-02-29T09:00:00+00:00"},
		{"0 9 LW * *", "UTC", "2026-05-01T00:00:00Z", "2026-05-29T09:00:00+00:00"},  // the 31st is a Sunday
		{"0 9 1W * *", "UTC", "2026-08-01T00:00:00Z", "2026-08-03T09:00:00+00:00"},  // the 1st is a Saturday
		{"0 9 31W * *", "UTC", "2026-05-02T00:00:00Z", "2026-05-29T09:00:00+00:00"}, // the 31st is a Sunday
		{"0 9 31W * *", "UTC", "2026-06-01T00:00:00Z", "2026-07-31T09:00:00+00:00"}, // June has no 31st
		{"0 0 9 * * MON#2", "UTC", "2026-06-01T00:00:00Z", "2026-06-08T09:00:00+00:00"},
	}
	for _, tt := range tests {
		c, err := ParseCron(tt.expr, mustLoc(t, tt.zone))
		if err != nil {
			t.Fatalf("%s: %v", tt.expr, err)
		}
		from, _ := time.Parse(time.RFC3339, tt.from)
		if got := FormatSlot(c.Next(from)); got != tt.want {
			t.Errorf("%s in %s after %s: %s, want %s", tt.expr, tt.zone, tt.from, got, tt.want)
		}
	}
}

func TestDayRulesErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"0 9 L-31 * *", "L-N counts at most 30"},
		{"0 9 32W * *", "NW needs a day 1-31"},
		{"0 9 0W * *", "NW needs a day 1-31"},
		{"0 9 LX * *", "want L, L-N, LW or NW"},
		{"0 9 * * L", "L alone is ambiguous"},
		{"0 9 * * MON#6", "1st to 5th"},
		{"0 9 * * MON#0", "1st to 5th"},
		{"0 9 * * 8L", "not a weekday"},
		{"0 9 * * XYZL", "not a weekday"},
		{"0 9 * * MON-FRI#2", "want a weekday then L"},
		{"0 9 L-30 2 *", "can never fire"},
		{"0 9 31W 2,4 *", "can never fire"},
		{"L 9 * * *", "cron"},
	}
	for _, tt := range tests {
		_, err := ParseCron(tt.expr, time.UTC)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want one containing %q", tt.expr, err, tt.want)
		}
	}
}

func TestCrontabRefusesQuartz(t *testing.T) {
	for _, spec := range []string{"0 9 L * *", "0 9 LW * *", "0 9 15W * *", "0 9 * * 5L", "0 9 * * FRIL", "0 9 * * mon#2", "0 9 L-3 * *"} {
		_, err := ParseCrontab(spec, time.UTC)
		if err == nil || !strings.Contains(err.Error(), "write the entry with cron: instead") {
			t.Errorf("crontab %q: error %v, want one naming cron:", spec, err)
		}
	}
	// Celery's own names stay as Celery reads them.
	for _, spec := range []string{"0 9 * jul *", "0 9 * april *", "0 9 * * sat", "0 9 * * saturday"} {
		if _, err := ParseCrontab(spec, time.UTC); err != nil {
			t.Errorf("crontab %q: %v", spec, err)
		}
	}
}

func TestDescribeDayRules(t *testing.T) {
	for _, tt := range []struct{ expr, want string }{
		{"0 9 L * *", "at 09:00 on the last day (UTC)"},
		{"0 9 1,L-2 * *", "at 09:00 on day 1 or 2 days before the last day (UTC)"},
		{"0 17 * * FRIL", "at 17:00 on the last Fri (UTC)"},
		{"0 9 15W * MON#2", "at 09:00 on the weekday nearest day 15 or the 2nd Mon (UTC)"},
	} {
		c, err := ParseCron(tt.expr, time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		if got := Describe(c); got != tt.want {
			t.Errorf("Describe(%s) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}
