package migrate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

var helper = Helper{Python: testutil.CeleryPython, Script: "../contrib/celery_dump.py"}

// now is a fixed instant for conversions that depend on it.
var now = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// dumpCeleryApp runs the shipped helper on the fixture app, as a user would.
func dumpCeleryApp(t *testing.T, extra ...string) []byte {
	t.Helper()
	args := append([]string{helper.Script, "beat_app:app"}, extra...)
	cmd := exec.Command(helper.Python, args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("testdata", "celeryapp"))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("celery_dump.py: %v: %s (Debian's python3-celery and python3-ephem are needed)", err, stderr)
	}
	return out
}

func TestCeleryAppImportAndCheck(t *testing.T) {
	src, err := Parse("dump.json", dumpCeleryApp(t))
	if err != nil {
		t.Fatal(err)
	}
	// 15 in beat_schedule, one from add_periodic_task, and the
	// celery.backend_cleanup that celery beat installs itself (results
	// expire and the app's backend cannot expire them).
	if src.Kind != "celery" || src.Timezone != "Europe/Berlin" || len(src.Entries) != 17 {
		t.Fatalf("source %s %s with %d entries, want celery Europe/Berlin 17", src.Kind, src.Timezone, len(src.Entries))
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Config.Entries) != 16 || strings.Join(res.Skipped, ",") != "custom" || res.Config.Entry("celery.backend_cleanup") == nil {
		t.Fatalf("converted %d, skipped %v; want 16 with celery.backend_cleanup, and [custom]", len(res.Config.Entries), res.Skipped)
	}
	for _, want := range []string{
		`entry "custom": not imported: schedule beat_app.every_other_tuesday`,
		`entry "reports/weekly": renamed to "reports-weekly"`,
		`entry "reports/weekly": options beatd does not send, dropped: countdown=10`,
		`entry "when": value not carried faithfully: args[0]: datetime`,
	} {
		if !strings.Contains(strings.Join(res.Warnings, "\n"), want) {
			t.Errorf("warnings lack %q:\n%s", want, strings.Join(res.Warnings, "\n"))
		}
	}
	for _, want := range []string{
		"  # NOT IMPORTED: \"custom\"",
		"    every: 1d\n    kwargs: {\"b\": 1, \"a\": [1, 2.5, null, \"é\"]}",
		"    every: 2w\n",
		"    every: 500ms\n",
		"    every: 1h\n    relative: true",
		`    crontab: {minute: "0,20,40", hour: "9-17", day_of_week: "*", day_of_month: "*", month_of_year: "*"}`,
		`    solar: {event: "dusk_astronomical", lat: -33.87, lon: 151.21}`,
		`    options: {queue: "reports", priority: 5, expires: 60, headers: {"x-team": "data"}, time_limit: 30, soft_time_limit: 20.5, ignore_result: true, exchange: "reports", routing_key: "reports.daily"}`,
		"  \"ping every 10s\":\n    task: \"tasks.ping\"\n    every: 10s\n    args: [\"pong\"]",
	} {
		if !strings.Contains(res.YAML, want) {
			t.Errorf("YAML lacks %q:\n%s", want, res.YAML)
		}
	}
	e := res.Config.Entry("weekday-morning")
	if e.Options.Queue != "reports" || *e.Options.Priority != 5 || e.Options.Expires.After != time.Minute || !e.Options.IgnoreResult {
		t.Errorf("weekday-morning options = %+v", e.Options)
	}

	// Celery's own fire times agree with beatd's for every entry but the
	// relative 90-minute interval, whose rounding beatd does not copy.
	diffs, err := Compare(context.Background(), helper, res.Checks, 50, now)
	if err != nil {
		t.Fatal(err)
	}
	other := 0
	for _, d := range diffs {
		if d.Entry != "ninety-relative" {
			other++
			t.Errorf("difference: %s", d)
		}
	}
	if len(diffs) == other {
		t.Error("no difference found for ninety-relative: the check compares nothing")
	}
}

func TestDjangoImport(t *testing.T) {
	data, err := os.ReadFile("testdata/django_dump.json")
	if err != nil {
		t.Fatal(err)
	}
	src, err := Parse("django_dump.json", data)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Config.Entries) != 12 || len(res.Skipped) != 0 {
		t.Fatalf("converted %d entries, skipped %v", len(res.Config.Entries), res.Skipped)
	}
	for _, want := range []string{
		"  # Deletes stale rows.\n  # Runs often.\n",
		"    every: 5m\n    start_at: \"2026-11-30T09:45:00.123Z\"\n    args: [1, \"two\", null]\n    kwargs: {\"z\": 1, \"a\": [true, 2.5]}",
		`    options: {queue: "slow", exchange: "backups", routing_key: "backup.run", priority: 3, expires: 3600, headers: {"x-team": "ops"}}`,
		"  \"poll\":\n    task: \"app.tasks.poll\"\n    every: 1m30s\n    enabled: false",
		"    every: 3h\n    start_at: \"2026-12-01T06:00:00Z\"",
		"    timezone: \"America/New_York\"\n    crontab: {minute: \"30\", hour: \"7\", day_of_week: \"mon-fri\"",
		`    options: {expires: "2027-06-30T12:00:00Z"}`,
		`    end_at: "2027-06-30T12:00:00Z"`, // django-celery-beat stops running it at expires too
		`    solar: {event: "sunset", lat: 52.52, lon: 13.4}`,
		"  \"new year\":\n    task: \"app.tasks.greet\"\n    at: \"2027-01-01T00:00:00Z\"",
		// one_off: the schedule, run once (max_runs: 1).
		"  \"once-quarterly\":\n    task: \"app.tasks.once\"\n    crontab: {minute: \"*/15\", hour: \"*\", day_of_week: \"*\", day_of_month: \"*\", month_of_year: \"*\"}\n    max_runs: 1",
		"  \"done-once\":\n    task: \"app.tasks.done\"\n    at: \"2026-11-30T10:00:00Z\"\n    enabled: false",
		"  \"quarter-hourly\":",
		// What the header says of periodic_task_name is what celery/message.go does.
		"# like django-celery-beat, beatd sends periodic_task_name (the entry's name) with each task on Redis",
	} {
		if !strings.Contains(res.YAML, want) {
			t.Errorf("YAML lacks %q:\n%s", want, res.YAML)
		}
	}
	states := map[string]State{}
	for _, s := range res.States {
		states[s.Name] = s
	}
	for name, want := range map[string]string{
		"cleanup":        "2026-11-30T09:45:00.123Z", // the interval's anchor (dumpdata keeps milliseconds)
		"morning report": "2026-11-27T12:30:00Z",     // 07:30 in New York
		"quarter-hourly": "2026-11-30T09:45:00Z",
	} {
		if got := states[name].LastSlot.UTC().Format(time.RFC3339Nano); got != want {
			t.Errorf("state %q: last slot %s, want %s", name, got, want)
		}
	}
	// The sunset celery beat sent on Nov 29 (at 14:57:36.4 UTC) is that
	// day's beatd slot.
	if d := states["lights"].LastSlot.Sub(time.Date(2026, 11, 29, 14, 57, 36, 0, time.UTC)); d < -time.Minute || d > time.Minute {
		t.Errorf("lights: last slot %s", states["lights"].LastSlot)
	}
	if len(res.States) != 4 {
		t.Errorf("states %v, want 4 entries with a last run", res.States)
	}
	diffs, err := Compare(context.Background(), helper, res.Checks, 50, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		if d.Documented == "" {
			t.Errorf("difference: %s", d)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"a": 1}`, "not one written by contrib/celery_dump.py"},
		{`[{"model": "auth.user", "pk": 1, "fields": {}}]`, "without django_celery_beat objects"},
		{`hello`, "not a celery_dump.py dump"},
		{`[{"model": "django_celery_beat.periodictask", "pk": 1, "fields": {"name": "x", "task": "t", "interval": 7}}]`, "interval schedule 7 is not in the dump"},
	} {
		if _, err := Parse("f", []byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestFormatSeconds(t *testing.T) {
	for secs, want := range map[float64]string{30: "30s", 90: "1m30s", 3600: "1h", 5400: "1h30m", 86400: "1d", 1209600: "2w", 93784: "1d2h3m4s", 0.25: "250ms", 1.5: "1.5s"} {
		if got := formatSeconds(secs); got != want {
			t.Errorf("formatSeconds(%v) = %s, want %s", secs, got, want)
		}
	}
}

// An option beatd rejects is dropped with a warning; the entry stays.
func TestBadOptionDroppedNotEntry(t *testing.T) {
	src, err := Parse("o.json", []byte(`{"source": "celery", "timezone": "UTC", "enable_utc": true, "entries": [
 {"name": "p", "task": "t", "schedule": {"type": "interval", "seconds": 60, "relative": false}, "args": [], "kwargs": {}, "options": {"priority": 12, "expires": 0, "queue": "q", "link": "x"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Config.Entry("p"); e == nil || e.Options.Queue != "q" || e.Options.Priority != nil {
		t.Fatalf("entry p = %+v", e)
	}
	w := strings.Join(res.Warnings, "\n")
	for _, want := range []string{"priority=12 (options.priority must be between 0 and 9, got 12)", "expires=0", `link="x"`} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q: %s", want, w)
		}
	}
}

// An entry celery beat has state for but the app no longer schedules is
// named, not dropped silently.
func TestStateOnlyEntryWarned(t *testing.T) {
	src, err := Parse("d.json", []byte(`{"source": "celery", "timezone": "UTC", "enable_utc": true, "state_only": ["old-report"], "entries": []}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, `entry "old-report" is in celery beat's schedule file but not in the app's schedule`) {
		t.Errorf("warnings: %s", w)
	}
}

// Celery 5.2.6's crontab bugs that beatd does not copy show up in --check
// as documented deviations, not as failures: a wall time in a DST gap, and
// the month skip west of UTC.
func TestCheckDocumentedDeviations(t *testing.T) {
	src, err := Parse("ny.json", []byte(`{"source": "celery", "timezone": "America/New_York", "enable_utc": true, "entries": [
 {"name": "month-end", "task": "t", "schedule": {"type": "crontab", "minute": "0", "hour": "23", "day_of_week": "*", "day_of_month": "28-31", "month_of_year": "*"}, "args": [], "kwargs": {}, "options": {}},
 {"name": "dst", "task": "t", "schedule": {"type": "crontab", "minute": "30", "hour": "2", "day_of_week": "*", "day_of_month": "*", "month_of_year": "*"}, "args": [], "kwargs": {}, "options": {}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := Compare(context.Background(), helper, res.Checks, 150, now)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, d := range diffs {
		if d.Documented == "" {
			t.Errorf("undocumented difference: %s", d)
		}
		seen[d.Entry+"/"+d.Documented]++
	}
	if seen["dst/dst_gap"] == 0 || seen["month-end/celery_5_2_6_month_skip"] == 0 {
		t.Errorf("deviations seen: %v", seen)
	}
}
