package scheduler

import (
	"testing"
	"time"
)

// TestBusinessDaysAcrossAYear: "every weekday at 9:00 local, except US
// federal holidays" is a mon-fri crontab that excludes a holiday calendar.
// Over 2027, hand-computed: 261 weekdays, 11 of them holidays (observed
// dates), so 250 runs, in New York and in Berlin, each at 9:00 local
// across its own DST change.
func TestBusinessDaysAcrossAYear(t *testing.T) {
	cfg := mustConfig(t, `
calendars:
  us-2027: ["2027-01-01", "2027-01-18", "2027-02-15", "2027-05-31", "2027-06-18", "2027-07-05",
            "2027-09-06", "2027-10-11", "2027-11-11", "2027-11-25", "2027-12-24"]
entries:
  ny: {task: t, timezone: America/New_York, crontab: {minute: 0, hour: 9, day_of_week: mon-fri}, exclude: [us-2027]}
  berlin: {task: t, timezone: Europe/Berlin, crontab: {minute: 0, hour: 9, day_of_week: mon-fri}, exclude: [us-2027]}
`)
	for _, tc := range []struct {
		entry string
		zone  string
		// A few slots, in UTC, on each side of the zone's DST change.
		want map[string]bool
	}{
		{"ny", "America/New_York", map[string]bool{
			"2027-03-12T14:00:00Z": true, // EST: 9:00 is 14:00 UTC
			"2027-03-15T13:00:00Z": true, // EDT since 14 March
			"2027-07-02T13:00:00Z": true,
			"2027-07-05T13:00:00Z": false, // Independence Day observed
			"2027-07-06T13:00:00Z": true,
			"2027-11-25T14:00:00Z": false, // Thanksgiving
		}},
		{"berlin", "Europe/Berlin", map[string]bool{
			"2027-03-26T08:00:00Z": true, // CET
			"2027-03-29T07:00:00Z": true, // CEST since 28 March
			"2027-12-24T08:00:00Z": false,
			"2027-12-27T08:00:00Z": true,
		}},
	} {
		t.Run(tc.entry, func(t *testing.T) {
			e := cfg.Entry(tc.entry)
			loc, _ := time.LoadLocation(tc.zone)
			start := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
			end := time.Date(2028, 1, 1, 0, 0, 0, 0, loc)
			seen := map[string]bool{}
			n := 0
			for at := start; ; {
				at = NextFire(e, nil, at)
				if at.IsZero() || !at.Before(end) {
					break
				}
				if wd := at.In(loc).Weekday(); wd == time.Saturday || wd == time.Sunday || at.In(loc).Hour() != 9 {
					t.Fatalf("slot %s is not a weekday at 9:00 in %s", at.In(loc), tc.zone)
				}
				seen[at.UTC().Format(time.RFC3339)] = true
				n++
			}
			if n != 250 {
				t.Errorf("%d runs in 2027, want 250", n)
			}
			for slot, want := range tc.want {
				if seen[slot] != want {
					t.Errorf("slot %s: fired %v, want %v", slot, seen[slot], want)
				}
			}
		})
	}
}
