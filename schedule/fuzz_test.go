package schedule

import (
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

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("entries:\n  a: {task: t, every: 5s}\n"))
	f.Add([]byte("timezone: Europe/Berlin\nentries:\n  a:\n    task: t\n    crontab: {minute: '*/5', day_of_week: mon-fri}\n    kwargs: {x: [1, 2.5, null, true]}\n"))
	f.Add([]byte("defaults: {options: {queue: q, headers: {a: 1}}}\nentries:\n  b: {task: t, cron: '@daily', options: {priority: 3, expires: 2026-01-01T00:00:00Z}}\n"))
	f.Add([]byte("entries:\n  c: &x {task: t, at: 2026-12-24T18:00:00Z}\n  d: *x\n"))
	f.Add([]byte("entries:\n  s: {task: t, solar: {event: dusk_civil, lat: -77.8, lon: 166.6}}\n  r: {task: t, every: 1w2d, relative: true, jitter: 1d}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil {
			if _, ok := err.(Errors); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		for _, e := range cfg.Entries {
			if e.Schedule == nil || e.Task == "" {
				t.Fatalf("entry %q accepted without schedule or task", e.Name)
			}
		}
	})
}
