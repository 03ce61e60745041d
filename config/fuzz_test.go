package config

import (
	"errors"
	"testing"

	"github.com/beatd/beatd/testkit/fuzzcheck"
)

// FuzzParseConfig is schedules.yaml's input path: Parse either refuses a
// document with positioned Errors or accepts entries that fire at
// strictly increasing slots, each within fuzzcheck's time and memory
// bounds. Its corpus (testdata/fuzz/FuzzParseConfig) holds issue 45's
// attacks: an alias bomb, an alias cycle, every: 1ns and 2400000h,
// start_at in 2300.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("entries:\n  a: {task: t, every: 5s}\n"))
	f.Add([]byte("timezone: Europe/Berlin\nentries:\n  a:\n    task: t\n    crontab: {minute: '*/5', day_of_week: mon-fri}\n    kwargs: {x: [1, 2.5, null, true]}\n"))
	f.Add([]byte("defaults: {options: {queue: q, headers: {a: 1}}}\nentries:\n  b: {task: t, cron: '@daily', options: {priority: 3, expires: 2026-01-01T00:00:00Z}}\n"))
	f.Add([]byte("entries:\n  c: &x {task: t, at: 2026-12-24T18:00:00Z}\n  d: *x\n"))
	f.Add([]byte("defaults: {options: {late_slot_expires: 5m}}\nentries:\n  h: {task: t, cron: 'H H(0-5) LW * *'}\n  q: {task: t, cron: '0 9 * * MON#2,FRIL', options: {late_slot_expires: null}}\n  k: {task: t, crontab: {minute: 'H/15', hour: [H(9-17)]}}\n"))
	f.Add([]byte("entries:\n  s: {task: t, solar: {event: dusk_civil, lat: -77.8, lon: 166.6}}\n  r: {task: t, every: 1w2d, relative: true, jitter: 1d}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var cfg *Config
		var err error
		fuzzcheck.Bounded(t, len(data), func() { cfg, err = Parse("fuzz.yaml", data) })
		if err != nil {
			if _, ok := err.(Errors); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		for _, e := range cfg.Entries {
			if e.Task == "" {
				t.Fatalf("entry %q accepted without a task", e.Name)
			}
			fuzzcheck.Slots(t, e.Name, e.Schedule, DefaultMinInterval)
		}
	})
}

// FuzzParseEntry is the entries API's input path (and django-celery-
// beat's, whose rows become such documents): ParseEntry of a JSON or
// YAML body under a file's defaults either refuses it with FieldErrors
// or accepts an entry that fires at strictly increasing slots, within
// fuzzcheck's bounds.
func FuzzParseEntry(f *testing.F) {
	file, err := Parse("schedules.yaml", []byte("timezone: Europe/Berlin\ndefaults:\n  options: {queue: q, headers: {team: ops}}\n  catchup: all\ncalendars:\n  hols: [\"2026-12-25\"]\nentries: {}\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("a", []byte(`{"task":"t","every":"30s"}`))
	f.Add("report", []byte(`{"task":"app.report","crontab":{"minute":15,"hour":"3"},"args":[1,"two",{"three":3}],"kwargs":{"b":1,"a":2},"exclude":["hols"]}`))
	f.Add("b", []byte("task: t\ncron: '*/10 * * * * *'\nstart_at: 2027-01-01T00:00:00\nend_at: 2028-01-01T00:00:00Z\n"))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		var e *Entry
		var err error
		fuzzcheck.Bounded(t, len(name)+len(data), func() { e, err = file.ParseEntry(name, data) })
		if err != nil {
			var fe FieldErrors
			if !errors.As(err, &fe) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		if e.Task == "" || e.Name != name {
			t.Fatalf("entry %q accepted as %q with task %q", name, e.Name, e.Task)
		}
		fuzzcheck.Slots(t, e.Name, e.Schedule, DefaultMinInterval)
	})
}
