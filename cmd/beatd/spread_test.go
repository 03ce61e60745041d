package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNextShowsSpread: next lists an H entry's resolved times, says what
// the H resolved to (in the text and as "resolved" in --json), and
// validate places a bad H at its value.
func TestNextShowsSpread(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "s.yaml")
	if err := os.WriteFile(file, []byte("entries:\n  billing-report: {task: t, cron: \"H H(0-5) * * *\"}\n  month-end: {task: t, cron: \"0 9 L * *\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "next", "--config", file, "--from", "2026-12-01T00:00:00Z", "--count", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var v struct{ Entry, At, Resolved string }
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got = append(got, v.Entry+" "+v.At+" "+v.Resolved)
	}
	want := []string{
		"billing-report 2026-12-01T01:22:00+00:00 22 1 * * *", "billing-report 2026-12-02T01:22:00+00:00 22 1 * * *",
		"month-end 2026-12-31T09:00:00+00:00 ", "month-end 2027-01-31T09:00:00+00:00 ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("next --json:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, out, _ = runCLI(t, "next", "--config", file, "--entry", "billing-report", "--count", "1"); !strings.Contains(out, "cron(22 1 * * *) from H H(0-5) * * *") {
		t.Errorf("next's text does not show the resolved spec:\n%s", out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("entries:\n  e:\n    task: t\n    cron: \"H(50-10) * * * *\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "validate", bad)
	if wantErr := bad + `:4:11: cron "H(50-10) * * * *": minute "H(50-10)": range 50-10 is empty`; code != 1 || !strings.Contains(errs, wantErr) {
		t.Errorf("validate: exit %d, want 1 and %q:\n%s", code, wantErr, errs)
	}
}
