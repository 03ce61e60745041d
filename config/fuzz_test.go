package config

import (
	"testing"
)

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
