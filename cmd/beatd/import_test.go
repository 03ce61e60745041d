package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beatd/beatd/internal/testutil"
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

	// --check agrees with Celery on every entry of the django fixture...
	out.Reset()
	errb.Reset()
	code := run(context.Background(), []string{"import", "--check", "--python", testutil.CeleryPython, "--helper", helper, fixture}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "0 differences") {
		t.Fatalf("import --check = %d:\n%s%s", code, out.String(), errb.String())
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
