package config

import (
	"testing"
	"time"
)

func TestCalendarExcludes(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte(`
calendars:
  c: ["2027-12-24..2027-12-31", "2027-07-04", sun, "2027-12-30..2028-01-02"]
entries:
  e: {task: t, every: 1h, timezone: Pacific/Auckland, exclude: [c]}
`))
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Entry("e")
	for _, tc := range []struct {
		utc  string
		want bool
	}{
		{"2027-07-03T12:00:00Z", true},  // already 4 July in Auckland (UTC+12)
		{"2027-07-03T11:00:00Z", false}, // 3 July 23:00 there, a Saturday
		{"2027-07-04T12:00:00Z", false}, // 5 July there, a Monday
		{"2027-07-10T12:00:00Z", true},  // Sunday 11 July there
		{"2027-12-23T10:59:00Z", false}, // 23 Dec 23:59 NZDT
		{"2027-12-23T11:00:00Z", true},  // 24 Dec 00:00 NZDT: the range starts
		{"2028-01-02T10:59:00Z", true},  // 2 Jan 23:59: the overlapping range's end
		{"2028-01-02T11:00:00Z", false}, // 3 Jan, a Monday
	} {
		at, _ := time.Parse(time.RFC3339, tc.utc)
		if got := e.Excluded(at); got != tc.want {
			t.Errorf("%s (%s there): excluded %v, want %v", tc.utc, at.In(e.Location).Format("Mon 2006-01-02 15:04"), got, tc.want)
		}
	}
}
