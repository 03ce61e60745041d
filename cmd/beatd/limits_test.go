package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestHumanDurationExtremes: the most negative duration, whose negation
// overflows, once recursed until the stack ran out (beatd next on an
// every: 2400000h entry).
func TestHumanDurationExtremes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		d    time.Duration
		want string
	}{
		{name: "most negative", d: math.MinInt64, want: "-106751d 23h"},
		{name: "most positive", d: math.MaxInt64, want: "106751d 23h"},
		{name: "one above most negative", d: math.MinInt64 + 1, want: "-106751d 23h"},
		{name: "minus a nanosecond", d: -1, want: "0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := humanDuration(tt.d); got != tt.want {
				t.Errorf("humanDuration(%d) = %q, want %q", int64(tt.d), got, tt.want)
			}
		})
	}
}

// TestValidateMinInterval: validate refuses what run refuses, and
// --min-interval moves the floor for both.
func TestValidateMinInterval(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "s.yaml")
	if err := os.WriteFile(file, []byte("entries:\n  fast: {task: t, every: 10ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout or stderr
	}{
		{name: "default floor", args: []string{"validate", file}, code: 1, want: file + ":2:26: every: 10ms is below the minimum interval, 100ms"},
		{name: "lowered", args: []string{"validate", "--min-interval", "10ms", file}, code: 0, want: "ok, 1 entries"},
		{name: "flag below its range", args: []string{"validate", "--min-interval", "1us", file}, code: 2, want: "--min-interval: config: the minimum interval must be between 1ms and 1s"},
		{name: "next lowered", args: []string{"next", "--config", file, "--min-interval", "10ms", "--from", "2026-12-05T00:00:00Z", "--count", "2"}, code: 0, want: "fast"},
		{name: "next at the default", args: []string{"next", "--config", file}, code: 1, want: "below the minimum interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := runCLI(t, tt.args...)
			if code != tt.code || !strings.Contains(out+errs, tt.want) {
				t.Errorf("exit %d, want %d; output %q, want %q", code, tt.code, out+errs, tt.want)
			}
		})
	}
}

// TestApplyAliasBomb: entries apply bounds a file's aliases before it
// expands them into the JSON it sends, as the server does for its own.
func TestApplyAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("entries:\n  x:\n    task: t\n    every: 1s\n    kwargs:\n      a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for l := 'b'; l <= 'i'; l++ {
		p := string(l - 1)
		fmt.Fprintf(&b, "      %c: &%c [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n", l, l, p, p, p, p, p, p, p, p, p)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := applyEntries(&bytes.Buffer{}, "bomb.yaml", []byte(b.String()))
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "bomb.yaml:11:14:") || !strings.Contains(err.Error(), "aliases expand") {
		t.Fatalf("err %v, want bomb.yaml:11:14: aliases expand ...", err)
	}
	if took > time.Second {
		t.Errorf("took %s to refuse", took)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 100<<20 {
		t.Errorf("allocated %d MB to refuse", alloc>>20)
	}
	// Aliases within the bound still apply, expanded.
	n, err := applyEntries(&bytes.Buffer{}, "ok.yaml", []byte("entries:\n  a: &e {task: t, every: 1s}\n  b: *e\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := nodeJSON(n, 0); string(got) != `{"a":{"task":"t","every":"1s"},"b":{"task":"t","every":"1s"}}` {
		t.Errorf("JSON %s", got)
	}
}
