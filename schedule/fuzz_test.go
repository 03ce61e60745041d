package schedule

import (
	"strings"
	"testing"
	"time"
)

func FuzzParseCrontabField(f *testing.F) {
	for _, s := range []string{"*", "*/15", "1-5", "55-5/3", "mon-fri", "jan,feb", "1-5-7", "", "*/", "-1", "7", "sebtember", "1_0", " 3"} {
		f.Add(uint8(0), s)
		f.Add(uint8(2), s)
	}
	f.Fuzz(func(t *testing.T, field uint8, spec string) {
		fi := CrontabField(field % 5)
		set, err := ParseCrontabField(fi, spec)
		if err != nil {
			return
		}
		fd := crontabFields[fi]
		if set == 0 || set&^maskOf(rangeOf(fd.minValue, fd.minValue+fd.size-1)) != 0 {
			t.Fatalf("%s %q: set %b outside the field's range", fi, spec, set)
		}
	})
}

func FuzzCrontabNext(f *testing.F) {
	f.Add("*/7 3 mon 13 *", "Europe/Berlin", int64(1700000000))
	f.Add("0 2 * * *", "Australia/Lord_Howe", int64(1712400000))
	f.Fuzz(func(t *testing.T, spec, zone string, unix int64) {
		loc, err := time.LoadLocation(zone)
		if err != nil || zone == "Local" {
			return
		}
		c, err := ParseCrontab(spec, loc)
		if err != nil {
			return
		}
		from := time.Unix(unix%(1<<36), 0)
		next := c.Next(from)
		if !next.IsZero() && !next.After(from) {
			t.Fatalf("Next(%s) = %s, not after", from, next)
		}
	})
}

// FuzzCronNext parses cron specs with H, L, W and # for an entry name and
// checks that each slot is strictly after the instant asked about, and
// that H resolved to a spec without H.
func FuzzCronNext(f *testing.F) {
	f.Add("H H(0-5) L * *", "e", "America/New_York", int64(1700000000))
	f.Add("0 9 LW,15W * MON#2,FRIL", "billing", "Europe/London", int64(1711846800))
	f.Add("H/15 2 * 3 SUN#2", "tenant-1", "Australia/Lord_Howe", int64(1712400000))
	f.Add("30 1 L-3 * 0L", "x", "UTC", int64(0))
	f.Fuzz(func(t *testing.T, spec, name, zone string, unix int64) {
		loc, err := time.LoadLocation(zone)
		if err != nil || zone == "Local" {
			return
		}
		c, err := ParseCronFor(spec, name, loc)
		if err != nil {
			return
		}
		if strings.Contains(c.Expr(), "H(") || strings.HasPrefix(c.Expr(), "H") {
			t.Fatalf("%q for %q resolved to %q", spec, name, c.Expr())
		}
		from := time.Unix(unix%(1<<36), 0)
		for range 3 {
			next := c.Next(from)
			if next.IsZero() {
				return
			}
			if !next.After(from) {
				t.Fatalf("%q: Next(%v) = %v, not after", spec, from, next)
			}
			from = next
		}
	})
}
