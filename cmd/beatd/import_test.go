package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

func TestImportCommand(t *testing.T) {
	dir := t.TempDir()
	helper := filepath.Join("..", "..", "contrib", "celery_dump.py")
	fixture := filepath.Join("..", "..", "migrate", "testdata", "django_dump.json")

	// The YAML validates; warnings name entries on stderr.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"import", fixture}, &out, &errb); code != 0 {
		t.Fatalf("import = %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), `warning: entry "quarter/hourly": renamed to "quarter-hourly"`) {
		t.Errorf("stderr lacks the rename warning:\n%s", errb.String())
	}
	cfgPath := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(cfgPath, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var vout, verr bytes.Buffer
	if code := run(context.Background(), []string{"validate", cfgPath}, &vout, &verr); code != 0 || !strings.Contains(vout.String(), "ok, 12 entries") {
		t.Fatalf("validate = %d: %s%s", code, vout.String(), verr.String())
	}

	// --check agrees with Celery on every entry of the django fixture,
	// from a "now" pinned before every date in it...
	check := func(from string) (int, string) {
		out.Reset()
		errb.Reset()
		code := run(context.Background(), []string{"import", "--check", "--from", from, "--python", testutil.CeleryPython, "--helper", helper, fixture}, &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, got := check("2026-11-30T10:00:00Z"); code != 0 || !strings.Contains(got, "0 differences (0 documented deviations)") {
		t.Fatalf("import --check = %d:\n%s", code, got)
	}
	// ...and, once rollup's start_time has passed without a run, names
	// the grid beatd keeps as a documented deviation, not a difference.
	code, got := check("2026-12-01T09:12:00Z")
	if code != 0 || !strings.Contains(got, ": 0 differences (") || !strings.Contains(got, `entry "rollup": beatd 2026-12-01T12:00:00Z, Celery - (documented deviation: django_start_time_past)`) {
		t.Fatalf("import --check after rollup's start_time = %d:\n%s", code, got)
	}
	if strings.Contains(got, "(0 documented deviations)") {
		t.Errorf("import --check after rollup's start_time names no deviation:\n%s", got)
	}
	// ...and exits 1, listing the difference, where Celery's relative
	// rounding differs from beatd's clock grid.
	dump := filepath.Join(dir, "dump.json")
	if err := os.WriteFile(dump, []byte(`{"source": "celery", "timezone": "UTC", "enable_utc": true, "entries": [
 {"name": "r90", "task": "t", "schedule": {"type": "interval", "seconds": 5400, "relative": true}, "args": [], "kwargs": {}, "options": {}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"import", "--check", "--python", testutil.CeleryPython, "--helper", helper, dump}, &out, &errb)
	if code != 1 || !strings.Contains(out.String(), `entry "r90": beatd`) {
		t.Fatalf("import --check on a differing entry = %d:\n%s%s", code, out.String(), errb.String())
	}
}

// validate and next say when a solar event skips days near the poles.
func TestSolarPolarNotes(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(cfg, []byte("entries:\n  rise: {task: t, solar: {event: sunrise, lat: 78.22, lon: 15.65}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"next", "--config", cfg, "--from", "2026-11-30T12:00:00Z", "--count", "1", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("next = %d: %s", code, errb.String())
	}
	if want := `{"entry":"rise","at":"2027-02-16T10:20:43+00:00"}`; strings.TrimSpace(out.String()) != want {
		t.Errorf("next = %s, want %s", out.String(), want)
	}
	if want := `note: entry "rise": no sunrise at 78.22, 15.65 between 2026-11-30 and 2027-02-16 (polar day or night); beatd fires at 2027-02-16T10:20:43+00:00`; !strings.Contains(errb.String(), want) {
		t.Errorf("next's notes lack %q:\n%s", want, errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"validate", cfg}, &out, &errb); code != 0 || !strings.Contains(out.String(), `note: entry "rise": no sunrise at 78.22, 15.65 between`) {
		t.Errorf("validate = %d:\n%s", code, out.String())
	}
}
