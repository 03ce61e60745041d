package config

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestParseEntryMatchesFile(t *testing.T) {
	t.Parallel()
	file := []byte(`timezone: Europe/Berlin
defaults:
  options: {queue: low}
  catchup: skip
entries:
  report:
    task: app.report
    crontab: {minute: 15, hour: "3"}
    args: [1, "two", {three: 3}]
    kwargs: {b: 1, a: 2}
`)
	cfg, err := Parse("schedules.yaml", file)
	if err != nil {
		t.Fatal(err)
	}
	want := cfg.Entry("report")
	got, err := cfg.ParseEntry("report", []byte(`{"task":"app.report","crontab":{"minute":15,"hour":"3"},"args":[1,"two",{"three":3}],"kwargs":{"b":1,"a":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Fingerprint != want.Fingerprint {
		t.Error("the same entry as JSON has another fingerprint than in the file")
	}
	if got.Options.Queue != "low" || got.Catchup != CatchupSkip || got.Location.String() != "Europe/Berlin" {
		t.Errorf("file defaults not applied: queue %q catchup %q zone %s", got.Options.Queue, got.Catchup, got.Location)
	}
	if got.Kwargs.Keys[0] != "b" {
		t.Errorf("kwargs order lost: %v", got.Kwargs.Keys)
	}
	now := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	if !got.Schedule.Next(now).Equal(want.Schedule.Next(now)) {
		t.Error("schedules differ")
	}
	// Without a file: UTC and the built-in defaults.
	bare, err := (*Config)(nil).ParseEntry("x", []byte(`{"task":"t","every":"30s"}`))
	if err != nil {
		t.Fatal(err)
	}
	if bare.Options.Queue != DefaultQueue || bare.Location != time.UTC || bare.Catchup != CatchupOnce {
		t.Errorf("built-in defaults not applied: %+v", bare)
	}
	// A changed default changes the fingerprint, as in the file.
	other, _ := Parse("s.yaml", []byte("defaults: {catchup: all}\nentries: {}\n"))
	e2, err := other.ParseEntry("report", []byte(`{"task":"app.report","crontab":{"minute":15,"hour":"3"},"args":[1,"two",{"three":3}],"kwargs":{"b":1,"a":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e2.Fingerprint == got.Fingerprint {
		t.Error("defaults do not reach the fingerprint")
	}
}

func TestParseEntryErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, entry, doc string
		want             []FieldError
	}{
		{"missing task", "a", `{"every":"30s"}`, []FieldError{{Pointer: "", Message: `entry "a": missing key task`}}},
		{"bad every", "a", `{"task":"t","every":"soon"}`, []FieldError{{Pointer: "/every"}}},
		{"unknown option", "a", `{"task":"t","every":5,"options":{"queue":"q","colour":"red"}}`, []FieldError{{Pointer: "/options/colour"}}},
		{"bad priority", "a", `{"task":"t","every":5,"options":{"priority":12}}`, []FieldError{{Pointer: "/options/priority"}}},
		{"bad arg", "a", `{"task":"t","every":5,"args":[1,{"x":[1,2,{"k":1,"k":2}]}]}`, []FieldError{{Pointer: "/args/1/x/2/k"}}},
		{"two schedules", "a", `{"task":"t","every":5,"cron":"* * * * *"}`, []FieldError{{Pointer: "/cron"}}},
		{"crontab field", "a", `{"task":"t","crontab":{"hour":"25"}}`, []FieldError{{Pointer: "/crontab/hour"}}},
		{"slash in name", "a/b", `{"task":"t","every":5}`, []FieldError{{Pointer: ""}}},
		{"pointer escapes", "a", `{"task":"t","every":5,"kwargs":{"a/b~":[{"k":1,"k":2}]}}`, []FieldError{{Pointer: "/kwargs/a~1b~0/0/k"}}},
		{"not an object", "a", `[1]`, []FieldError{{Pointer: ""}}},
		{"not JSON", "a", `{"task":`, []FieldError{{Pointer: ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := (*Config)(nil).ParseEntry(tt.entry, []byte(tt.doc))
			var fe FieldErrors
			if !errors.As(err, &fe) {
				t.Fatalf("error %v, want FieldErrors", err)
			}
			if len(fe) != len(tt.want) {
				t.Fatalf("errors %v, want %d", fe, len(tt.want))
			}
			for i, w := range tt.want {
				if fe[i].Pointer != w.Pointer || (w.Message != "" && fe[i].Message != w.Message) || fe[i].Message == "" {
					t.Errorf("error %d = %+v, want %+v", i, fe[i], w)
				}
			}
		})
	}
}

func TestWithEntriesKeepsTheRest(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("s.yaml", []byte("timezone: Asia/Tokyo\nentries:\n  b: {task: t, every: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := cfg.ParseEntry("a", []byte(`{"task":"t","every":"2s"}`))
	if err != nil {
		t.Fatal(err)
	}
	out := cfg.WithEntries([]*Entry{cfg.Entries[0], a})
	if out.File != "s.yaml" || out.Timezone.String() != "Asia/Tokyo" || out.DefaultsHash() != cfg.DefaultsHash() {
		t.Errorf("lost the config's fields: %+v", out)
	}
	if out.Entries[0].Name != "a" || out.Entry("b") == nil || len(cfg.Entries) != 1 {
		t.Errorf("entries not sorted, or the original changed: %v", out.Entries)
	}
	if bare := (*Config)(nil).WithEntries(nil); bare.Timezone != time.UTC || bare.DefaultsHash() != (*Config)(nil).DefaultsHash() {
		t.Errorf("nil config: %+v", bare)
	}
}

func TestFollowing(t *testing.T) {
	c, err := Parse("s.yaml", []byte("entries:\n  a1: {task: t, every: 1s}\n  a2: {task: t, every: 1s}\n  b1: {task: t, every: 1s}\n  b2: {task: t, every: 1s}\n  c1: {task: t, every: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after, prefix string
		want          string
	}{
		{"", "", "a1 a2 b1 b2 c1"},
		{"a2", "", "b1 b2 c1"},
		{"", "b", "b1 b2"},
		{"b1", "b", "b2"},
		{"a1", "b", "b1 b2"}, // a cursor before the prefix
		{"b2", "b", ""},
		{"zz", "", ""},
		{"", "x", ""},
	} {
		var got []string
		for e := range c.Following(tc.after, tc.prefix) {
			got = append(got, e.Name)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("Following(%q, %q) = %v, want %s", tc.after, tc.prefix, got, tc.want)
		}
	}
}

// TestEntryFitsItsAllocation: a million entries are held at once, and an
// Entry's fields are sized and ordered to fit a 208-byte allocation (Go's
// next size class is 224: 16 MB more at a million).
func TestEntryFitsItsAllocation(t *testing.T) {
	if n := unsafe.Sizeof(Entry{}); n > 208 {
		t.Errorf("config.Entry is %d bytes, over the 208-byte size class", n)
	}
}

// TestLimitsOnlyWhenSet: an entry that sets none of the limits holds
// none, and one that sets any reads them back.
func TestLimitsOnlyWhenSet(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte(`entries:
  plain: {task: t, every: 1m}
  bounded:
    task: t
    every: 1m
    start_at: "2026-12-01T00:00:00Z"
    end_at: "2026-12-31T00:00:00Z"
    max_runs: 3
    overlap: skip
    overlap_timeout: 10m
`))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Entry("plain"); p.limits != nil || !p.StartAt().IsZero() || p.MaxRuns() != 0 {
		t.Errorf("plain: limits %+v", p.limits)
	}
	b := cfg.Entry("bounded")
	if b.StartAt().Day() != 1 || b.EndAt().Day() != 31 || b.MaxRuns() != 3 || b.OverlapTimeout() != 10*time.Minute {
		t.Errorf("bounded: %v %v %d %v", b.StartAt(), b.EndAt(), b.MaxRuns(), b.OverlapTimeout())
	}
}
