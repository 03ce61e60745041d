package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// Locked: go-redis has one process-wide logger, which a command
	// points at its stderr, and a dial that a parallel test's command left
	// running may log into this buffer after run returned.
	var out, errb testutil.SyncBuffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if code, out, errs := runCLI(t, "validate", "../../schedules.yaml"); code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("entries:\n  a:\n    task: t\n    every: 0s\n    crontab: {minute: 61}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI(t, "validate", bad)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{bad + ":4:12: every must be positive", bad + ":5:23: crontab minute: 61", bad + ":5:5: entry \"a\": every and crontab both given"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
}

// TestValidateRejectsWhatRunRejects: a reserved header is refused by
// validate with its position, as by run, before anything starts.
func TestValidateRejectsWhatRunRejects(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("entries:\n  a:\n    task: t\n    every: 1s\n    options: {headers: {x-tenant: a, beat_slot: forged}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// run logs it as JSON, so its quotes come escaped.
	want := bad + `:5:38: options.headers: "beat_slot" is reserved: beatd sets it`
	for _, args := range [][]string{{"validate", bad}, {"run", "--config", bad, "--broker", "redis://127.0.0.1:1/0", "--etcd-endpoints", "http://127.0.0.1:1"}} {
		code, out, errs := runCLI(t, args...)
		if errs += out; code == 0 || !strings.Contains(strings.ReplaceAll(errs, `\"`, `"`), want) {
			t.Errorf("%s = %d, want an error %q:\n%s", args[0], code, want, errs)
		}
	}
}

func TestNextJSON(t *testing.T) {
	t.Parallel()
	code, out, errs := runCLI(t, "next", "--config", "../../schedules.yaml", "--entry", "nightly-report",
		"--from", "2026-03-06T00:00:00Z", "--count", "3", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var v struct{ Entry, At string }
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if v.Entry != "nightly-report" {
			t.Errorf("entry = %q", v.Entry)
		}
		got = append(got, v.At)
	}
	// Weekdays at 02:30 New York time, across the March DST change.
	want := []string{"2026-03-06T02:30:00-05:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestNextErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		code int
	}{
		{name: "bad from", args: []string{"next", "--config", "../../schedules.yaml", "--from", "yesterday"}, code: 2},
		{name: "unknown entry", args: []string{"next", "--config", "../../schedules.yaml", "--entry", "nope"}, code: 1},
		{name: "missing file", args: []string{"next", "--config", "/nonexistent.yaml"}, code: 1},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, _, _ := runCLI(t, tt.args...); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
		})
	}
}
