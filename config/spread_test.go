package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/schedule"
)

// TestSpreadUsesTheEntryName: H resolves with the entry's own name, alike
// in the file and through the entries API, in cron, crontab strings and
// crontab fields, and two names spread apart.
func TestSpreadUsesTheEntryName(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte(`entries:
  billing-report: {task: t, cron: "H H(0-5) * * *"}
  tenant-42: {task: t, cron: "H H(0-5) * * *"}
  as-crontab: {task: t, crontab: "H/15 H(9-17) * * *"}
  as-fields: {task: t, crontab: {minute: "H/15", hour: ["H(9-17)"]}}
  plain: {task: t, cron: "0 9 * * *"}
`))
	if err != nil {
		t.Fatal(err)
	}
	spread := func(name string) string {
		s, ok := schedule.Spread(cfg.Entry(name).Schedule)
		if !ok && name != "plain" {
			t.Errorf("%s: no spread", name)
		}
		return s
	}
	// The golden values of schedule's TestSpreadGolden, by the entry name.
	if got := spread("billing-report"); got != "22 1 * * *" {
		t.Errorf("billing-report resolves to %q", got)
	}
	if got := spread("tenant-42"); got != "52 1 * * *" {
		t.Errorf("tenant-42 resolves to %q", got)
	}
	if a, b := spread("as-crontab"), spread("as-fields"); a == "" || b == "" {
		t.Errorf("crontab spreads %q, %q", a, b)
	}
	if got := spread("plain"); got != "" {
		t.Errorf("an entry without H reports spread %q", got)
	}
	api, err := cfg.ParseEntry("tenant-42", []byte(`{"task":"t","cron":"H H(0-5) * * *"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := schedule.Spread(api.Schedule); got != "52 1 * * *" {
		t.Errorf("through the API tenant-42 resolves to %q", got)
	}
}

// TestScheduleErrorsArePositioned: bad H, L, W and # and Celery's crontab
// refusing Quartz's forms get FILE:LINE:COL in a file and a JSON pointer
// through the API.
func TestScheduleErrorsArePositioned(t *testing.T) {
	tests := []struct {
		name, value string // the entry's schedule, as YAML flow and JSON
		json        string
		pointer     string
		at          string // what the file's column points at
		want        string
	}{
		{"empty H range", `cron: "H(50-10) * * * *"`, `"cron":"H(50-10) * * * *"`, "/cron", `"H(50-10)`, "range 50-10 is empty"},
		{"H step 0", `cron: "H/0 * * * *"`, `"cron":"H/0 * * * *"`, "/cron", `"H/0`, "step must be at least 1"},
		{"H outside the field", `cron: "0 H(0-30) * * *"`, `"cron":"0 H(0-30) * * *"`, "/cron", `"0 H(0-30)`, "outside the field's 0-23"},
		{"H in a crontab field", `crontab: {minute: "H(0-70)"}`, `"crontab":{"minute":"H(0-70)"}`, "/crontab/minute", `"H(0-70)"`, "outside the field's 0-59"},
		{"H in a crontab list", `crontab: {hour: [1, "H(30-40)"]}`, `"crontab":{"hour":[1,"H(30-40)"]}`, "/crontab/hour/1", `"H(30-40)"`, "outside the field's 0-23"},
		{"L in a crontab string", `crontab: "0 9 L * *"`, `"crontab":"0 9 L * *"`, "/crontab", `"0 9 L`, "write the entry with cron: instead"},
		{"# in a crontab field", `crontab: {day_of_week: "mon#2"}`, `"crontab":{"day_of_week":"mon#2"}`, "/crontab/day_of_week", `"mon#2"`, "write the entry with cron: instead"},
		{"bad L in cron", `cron: "0 9 L-40 * *"`, `"cron":"0 9 L-40 * *"`, "/cron", `"0 9 L-40`, "L-N counts at most 30"},
		{"bad # in cron", `cron: "0 9 * * MON#6"`, `"cron":"0 9 * * MON#6"`, "/cron", `"0 9 * * MON#6`, "1st to 5th"},
		{"late_slot_expires zero", `cron: "0 9 * * *", options: {late_slot_expires: 0}`, `"cron":"0 9 * * *","options":{"late_slot_expires":0}`, "/options/late_slot_expires", `0}`, "late_slot_expires"},
		{"late_slot_expires words", `cron: "0 9 * * *", options: {late_slot_expires: soon}`, `"cron":"0 9 * * *","options":{"late_slot_expires":"soon"}`, "/options/late_slot_expires", `soon}`, "late_slot_expires"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := "entries:\n  e: {task: t, " + tt.value + "}\n"
			_, err := Parse("s.yaml", []byte(doc))
			var errs Errors
			if !errors.As(err, &errs) || len(errs) != 1 {
				t.Fatalf("file: %v, want one error", err)
			}
			// The error points at the bad value's line and column.
			line := strings.Split(doc, "\n")[errs[0].Line-1]
			at := line[errs[0].Column-1:]
			if errs[0].Line != 2 || !strings.Contains(errs[0].Msg, tt.want) {
				t.Errorf("file: %v, want line 2 and %q", errs[0], tt.want)
			}
			if !strings.HasPrefix(at, tt.at) {
				t.Errorf("file: column %d points at %q, want the value %s", errs[0].Column, at, tt.at)
			}
			_, err = (*Config)(nil).ParseEntry("e", []byte(`{"task":"t",`+tt.json+`}`))
			var ferrs FieldErrors
			if !errors.As(err, &ferrs) || len(ferrs) != 1 {
				t.Fatalf("API: %v, want one error", err)
			}
			if ferrs[0].Pointer != tt.pointer || !strings.Contains(ferrs[0].Message, tt.want) {
				t.Errorf("API: %v, want %s: %q", ferrs[0], tt.pointer, tt.want)
			}
		})
	}
}

// TestLateSlotExpires: an option, set in the defaults and per entry like
// the others, and combined with expires as the earlier of the two.
func TestLateSlotExpires(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte(`defaults:
  options: {late_slot_expires: 2m}
entries:
  inherits: {task: t, every: 10s}
  own: {task: t, every: 10s, options: {late_slot_expires: 300, expires: 60}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Entry("inherits").Options.LateExpires; got != 2*time.Minute {
		t.Errorf("inherits: %v", got)
	}
	own := cfg.Entry("own").Options
	if own.LateExpires != 5*time.Minute || own.Expires.After != time.Minute {
		t.Errorf("own: %v, %v", own.LateExpires, own.Expires)
	}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		own  celery.Expiry
		late time.Duration
		want time.Time
	}{
		{celery.Expiry{}, 5 * time.Minute, now.Add(5 * time.Minute)},
		{celery.Expiry{After: time.Minute}, 5 * time.Minute, now.Add(time.Minute)},
		{celery.Expiry{After: time.Hour}, 5 * time.Minute, now.Add(5 * time.Minute)},
		{celery.Expiry{At: now.Add(2 * time.Minute)}, 5 * time.Minute, now.Add(2 * time.Minute)},
		{celery.Expiry{At: now.Add(2 * time.Hour)}, 5 * time.Minute, now.Add(5 * time.Minute)},
		{celery.Expiry{After: time.Hour}, 0, now.Add(time.Hour)},
		{celery.Expiry{}, 0, time.Time{}},
	} {
		if got := tt.own.Late(now, tt.late).Deadline(now); !got.Equal(tt.want) {
			t.Errorf("expires %+v, late %v: deadline %v, want %v", tt.own, tt.late, got, tt.want)
		}
	}
}
