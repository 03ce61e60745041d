package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseExample(t *testing.T) {
	t.Parallel()
	cfg, err := LoadFile("../schedules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Entries) != 9 {
		t.Fatalf("got %d entries", len(cfg.Entries))
	}
	nr := cfg.Entry("nightly-report")
	if nr == nil {
		t.Fatal("nightly-report missing")
	}
	if nr.Location.String() != "America/New_York" || nr.Options.Queue != "reports" || *nr.Options.Priority != 5 {
		t.Errorf("nightly-report: %+v", nr)
	}
	if nr.Options.Expires.After != time.Hour {
		t.Errorf("expires = %v", nr.Options.Expires)
	}
	if v, _ := nr.Kwargs.Get("full"); v != true {
		t.Errorf("kwargs = %+v", nr.Kwargs)
	}
	if nr.Args[0] != int64(1) || nr.Args[1] != "two" {
		t.Errorf("args = %#v", nr.Args)
	}
	if got := cfg.Entry("add-every-5s"); got.Options.Queue != "celery" || got.Location.String() != "Europe/Berlin" || got.Catchup != CatchupOnce {
		t.Errorf("defaults not merged: %+v", got)
	}
	if got := cfg.Entry("weekday-cleanup"); got.Catchup != CatchupAll || got.MaxCatchup != 10 {
		t.Errorf("weekday-cleanup: %+v", got)
	}
	if cfg.Entry("paused-example").Enabled {
		t.Error("enabled: false ignored")
	}
	at := cfg.Entry("launch").Schedule
	if got := at.Next(mustTime(t, "2026-01-01T00:00:00Z")); !got.Equal(mustTime(t, "2026-12-24T18:00:00Z")) {
		t.Errorf("at.Next = %s", got)
	}
	anch := cfg.Entry("tick-every-2s-anchored").Schedule
	if got := anch.Next(mustTime(t, "2026-06-01T00:00:00Z")); !got.Equal(mustTime(t, "2026-06-01T00:00:01Z")) {
		t.Errorf("anchored every Next = %s", got)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want []string // each a "LINE:COL: fragment" that must appear
	}{
		{name: "unknown key and missing task", yaml: `
entries:
  a:
    every: 5s
    colour: red
`, want: []string{"3:3: entry \"a\": missing key task", "5:5: unknown key \"colour\""}},
		{name: "two schedules", yaml: `
entries:
  a:
    task: t
    every: 5s
    cron: "* * * * *"
`, want: []string{"6:5: entry \"a\": every and cron both given"}},
		{name: "end_at before start_at, max_runs 0", yaml: `
entries:
  a: {task: t, every: 1h, start_at: "2027-01-02T00:00:00Z", end_at: "2027-01-01T00:00:00Z"}
  b: {task: t, every: 1h, max_runs: 0}
`, want: []string{"3:69: entry \"a\": end_at 2027-01-01T00:00:00Z is not after start_at 2027-01-02T00:00:00Z",
			"4:37: entry \"b\": max_runs must be at least 1, got 0"}},
		{name: "calendars", yaml: `
calendars:
  hols: ["2027-13-01", "2027-02-10..2027-02-01", funday]
entries:
  a: {task: t, every: 1h, exclude: [hols, nope]}
`, want: []string{"3:10: calendar \"hols\": \"2027-13-01\" is not a date", "3:24: calendar \"hols\": \"2027-02-10..2027-02-01\" ends before it starts",
			"3:50: calendar \"hols\": \"funday\" is not a date", "5:43: entry \"a\": unknown calendar \"nope\"; known: hols"}},
		{name: "overlap and its timeout", yaml: `
entries:
  a: {task: t, every: 1h, overlap: sometimes, overlap_timeout: -5s, pause_after_failures: -1}
`, want: []string{"3:36: overlap must be allow, skip or buffer_one, got \"sometimes\"", "3:64: overlap_timeout must be positive",
			"3:91: pause_after_failures must be between 0 (never) and 1000000, got -1"}},
		{name: "duplicate entry", yaml: `
entries:
  a: {task: t, every: 1s}
  a: {task: t, every: 2s}
`, want: []string{"4:3: duplicate entry \"a\" (first at line 3)"}},
		{name: "never fires", yaml: `
entries:
  feb31:
    task: t
    crontab: {day_of_month: 31, month_of_year: 2}
`, want: []string{"5:14: crontab", "can never fire"}},
		{name: "bad zone, priority, duration", yaml: `
timezone: Mars/Olympus
entries:
  a:
    task: t
    every: -5s
    options: {priority: 12}
`, want: []string{"2:11: unknown timezone \"Mars/Olympus\"", "6:12: every must be positive", "7:25: options.priority must be between 0 and 9"}},
		{name: "bad crontab field", yaml: `
entries:
  a:
    task: t
    crontab: {minute: 60, day_of_week: "7"}
`, want: []string{"5:23: crontab minute: 60 is out of range 0-59", "5:40: crontab day_of_week \"7\""}},
		{name: "invalid yaml", yaml: "entries:\n  a: [\n", want: []string{"invalid YAML"}},
		{name: "not a mapping", yaml: "- 1\n", want: []string{"1:1: the config must be a mapping"}},
		{name: "missing entries", yaml: "timezone: UTC\n", want: []string{"missing key entries"}},
		{name: "bad at", yaml: `
entries:
  a: {task: t, at: tomorrow}
`, want: []string{"3:20: at must be an RFC 3339 time"}},
		{name: "kwargs not mapping", yaml: `
entries:
  a: {task: t, every: 1s, kwargs: [1]}
`, want: []string{"3:35: kwargs must be a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("bad.yaml", []byte(tt.yaml))
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("want Errors, got %v", err)
			}
			text := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("error text lacks %q:\n%s", w, text)
				}
			}
			for _, line := range strings.Split(text, "\n") {
				if !strings.HasPrefix(line, "bad.yaml:") {
					t.Errorf("line without FILE:LINE:COL: %q", line)
				}
			}
		})
	}
}
