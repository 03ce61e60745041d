package main

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestCLIConventions: help, version, completion and usage errors behave
// as kubectl's do.
func TestCLIConventions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // substrings
		stderr     []string
		maxErrLine int // stderr at most this many lines (0: no limit)
	}{
		{name: "no command", args: nil, code: 0, stdout: []string{"Available Commands:", "trigger"}},
		{name: "help run", args: []string{"help", "run"}, code: 0, stdout: []string{"beatd run [flags]", "--config string", "--etcd-endpoints", "BEATD_CONFIG"}},
		{name: "run --help", args: []string{"run", "--help"}, code: 0, stdout: []string{"beatd run [flags]", "--lease-ttl"}},
		{name: "help status", args: []string{"help", "status"}, code: 0, stdout: []string{"-o, --output", "BEATD_TIMEOUT", "--timeout duration"}},
		{name: "help nosuch", args: []string{"help", "nosuch"}, code: 2, stderr: []string{`unknown help topic "nosuch"`}, maxErrLine: 2},
		{name: "version flag", args: []string{"--version"}, code: 0, stdout: []string{"beatd "}},
		{name: "version short", args: []string{"-v"}, code: 0, stdout: []string{"beatd "}},
		{name: "version command", args: []string{"version"}, code: 0, stdout: []string{"beatd "}},
		{name: "unknown flag", args: []string{"status", "--bogus"}, code: 2, stderr: []string{"unknown flag: --bogus", "beatd status --help"}, maxErrLine: 2},
		{name: "single-dash long flag", args: []string{"next", "-config", "x"}, code: 2, stderr: []string{"--help"}, maxErrLine: 2},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: []string{"unknown command"}, maxErrLine: 3},
		{name: "trigger two args", args: []string{"trigger", "a", "b"}, code: 2, stderr: []string{"accepts 1 arg(s), received 2", "beatd trigger --help"}, maxErrLine: 2},
		{name: "trigger no arg", args: []string{"trigger"}, code: 2, stderr: []string{"accepts 1 arg(s), received 0"}, maxErrLine: 2},
		{name: "validate no arg", args: []string{"validate"}, code: 2, maxErrLine: 2},
		{name: "run extra arg", args: []string{"run", "oops"}, code: 2, stderr: []string{"unknown command \"oops\""}, maxErrLine: 2},
		{name: "bad output", args: []string{"status", "-o", "xml"}, code: 2, stderr: []string{`--output "xml"`}, maxErrLine: 2},
		{name: "bad log level", args: []string{"run", "--log-level", "loud"}, code: 2, stderr: []string{`--log-level must be`}, maxErrLine: 2},
		{name: "bad log format", args: []string{"run", "--log-format", "xml"}, code: 2, stderr: []string{`--log-format must be`}, maxErrLine: 2},
		{name: "shards resize no arg", args: []string{"shards", "resize"}, code: 2, stderr: []string{"accepts 1 arg(s), received 0"}, maxErrLine: 2},
		{name: "shards resize not a count", args: []string{"shards", "resize", "many"}, code: 2, stderr: []string{`M "many": want a shard count, 1 to 256`}, maxErrLine: 2},
		{name: "shards resize out of bounds", args: []string{"shards", "resize", "257"}, code: 1, stderr: []string{"resize refused: 257 shards: a cluster has 1 to 256"}, maxErrLine: 1},
		{name: "shards resize without broker", args: []string{"shards", "resize", "8", "--etcd-endpoints", "127.0.0.1:1"}, code: 1, stderr: []string{"--broker is required: a resize fences the old shards on the broker"}, maxErrLine: 1},
		{name: "completion bash", args: []string{"completion", "bash"}, code: 0, stdout: []string{"bash completion", "__start_beatd"}},
		{name: "completion zsh", args: []string{"completion", "zsh"}, code: 0, stdout: []string{"#compdef beatd"}},
		{name: "completion fish", args: []string{"completion", "fish"}, code: 0, stdout: []string{"complete -c beatd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runCLI(t, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errs)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errs, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errs)
				}
			}
			if n := strings.Count(strings.TrimSpace(errs), "\n") + 1; tt.maxErrLine > 0 && n > tt.maxErrLine {
				t.Errorf("stderr has %d lines, want at most %d:\n%s", n, tt.maxErrLine, errs)
			}
		})
	}
}

// TestEveryFlagHasItsVariable: each command's help lists the BEATD_*
// variable of each of its flags.
func TestEveryFlagHasItsVariable(t *testing.T) {
	t.Parallel()
	var cmds []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Name() != "help" && sub.Name() != "completion" {
				cmds = append(cmds, sub)
				walk(sub)
			}
		}
	}
	walk(newRoot(t.Context(), io.Discard, io.Discard))
	for _, c := range cmds {
		path := strings.Fields(c.CommandPath())[1:]
		code, out, _ := runCLI(t, append(path, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: exit %d", path, code)
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" && !f.Hidden && !strings.Contains(out, flagenv.EnvName(f.Name)+" ") {
				t.Errorf("%v --help lacks %s", path, flagenv.EnvName(f.Name))
			}
		})
	}
}

// TestFlagWinsOverEnv: BEATD_* sets a flag not given; the flag wins.
func TestFlagWinsOverEnv(t *testing.T) {
	t.Setenv("BEATD_COUNT", "2")
	lines := func(args ...string) int {
		code, out, errs := runCLI(t, append([]string{"next", "--config", "../../schedules.yaml", "--entry", "nightly-report", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		return strings.Count(out, "\n")
	}
	if n := lines(); n != 2 {
		t.Errorf("BEATD_COUNT=2: %d fire times", n)
	}
	if n := lines("--count", "4"); n != 4 {
		t.Errorf("--count 4 over BEATD_COUNT=2: %d fire times", n)
	}
	t.Setenv("BEATD_COUNT", "many")
	if code, _, errs := runCLI(t, "next", "--config", "../../schedules.yaml"); code != 2 || !strings.Contains(errs, "BEATD_COUNT") {
		t.Errorf("bad BEATD_COUNT: exit %d, %s", code, errs)
	}
}

// TestCLIDeadEtcd: every command that talks to etcd gives up within its
// --timeout, exits 1 and names the endpoint.
func TestCLIDeadEtcd(t *testing.T) {
	t.Parallel()
	dead := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	for _, args := range [][]string{{"status"}, {"status", "-o", "json"}, {"trigger", "x"}, {"pause", "x"}, {"resume", "x"}, {"backfill", "--list"}, {"entries", "list"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			code, _, errs := runCLI(t, append(args, "--etcd-endpoints", dead, "--timeout", "1s")...)
			took := time.Since(start)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if !strings.Contains(errs, dead) || !strings.Contains(errs, "did not answer within 1s") {
				t.Errorf("stderr does not name the endpoint and the timeout: %s", errs)
			}
			// The deadline is 1s; generous slack for a loaded machine.
			if took > 8*time.Second {
				t.Errorf("took %s with --timeout 1s", took)
			}
		})
	}
}

func TestValidateWarnsOnNoEntries(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"entries: {}\n", "timezone: UTC\nentries:\n"} {
		f := filepath.Join(t.TempDir(), "empty.yaml")
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errs := runCLI(t, "validate", f)
		if code != 0 || !strings.Contains(out, "ok, 0 entries") || !strings.Contains(errs, "warning: "+f+": no entries") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", src, code, out, errs)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{400 * time.Millisecond, "0s"},
		{42 * time.Second, "42s"},
		{5*time.Minute + 3*time.Second, "5m 3s"},
		{5 * time.Minute, "5m"},
		{19*time.Hour + 30*time.Minute, "19h 30m"},
		{19*time.Hour + 30*time.Minute + 59*time.Second, "19h 30m"},
		{2*24*time.Hour + 3*time.Hour, "2d 3h"},
		{2 * 24 * time.Hour, "2d"},
		{400 * 24 * time.Hour, "400d"},
		{-90 * time.Second, "-1m 30s"},
		{math.MaxInt64, "106751d 23h"},
		{math.MinInt64, "-106751d 23h"},
	}
	for _, tt := range tests {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestNextInColumn(t *testing.T) {
	t.Parallel()
	code, out, errs := runCLI(t, "next", "--config", "../../schedules.yaml", "--from", "2026-03-06T00:00:00Z", "--count", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// IN follows the RFC 3339 NEXT column.
	in := regexp.MustCompile(`.*\d{4}-\d\d-\d\dT\S+\s+(.*)$`)
	format := regexp.MustCompile(`^\d+[dhms]( \d+[hms])?$`)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		m := in.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		if !format.MatchString(strings.TrimSpace(m[1])) {
			t.Errorf("IN %q is not in the one human format: %q", m[1], line)
		}
	}
	if n == 0 {
		t.Fatalf("no fire times:\n%s", out)
	}
}
