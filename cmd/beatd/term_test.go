package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/store"
)

// TestTerm: user text reaches a terminal with every control sequence
// escaped, and printable Unicode as it is.
func TestTerm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
	}{
		{name: "plain", in: "nightly-report", want: "nightly-report"},
		{name: "printable unicode", in: "Rapport für Zürich ✓ 夜間", want: "Rapport für Zürich ✓ 夜間"},
		{name: "backslash and quotes pass", in: `C:\tmp "x" 'y'`, want: `C:\tmp "x" 'y'`},
		{name: "ESC color sequence", in: "ok\x1b[31mRED\x1b[0m", want: `ok\x1b[31mRED\x1b[0m`},
		{name: "OSC window title", in: "\x1b]0;pwned\x07", want: `\x1b]0;pwned\a`},
		{name: "carriage return", in: "good\rEVIL", want: `good\rEVIL`},
		{name: "backspace", in: "abc\b\b\bxyz", want: `abc\b\b\bxyz`},
		{name: "bell", in: "ding\a", want: `ding\a`},
		{name: "C1 CSI U+009B", in: "x\u009b2Jy", want: `x\u009b2Jy`},
		{name: "C1 NEL U+0085", in: "a\u0085b", want: `a\u0085b`},
		{name: "DEL", in: "a\x7fb", want: `a\x7fb`},
		{name: "tab and newline", in: "a\tb\nc", want: `a\tb\nc`},
		{name: "NUL", in: "a\x00b", want: `a\x00b`},
		{name: "bidi override", in: "abc\u202edcba", want: `abc\u202edcba`},
		{name: "invalid UTF-8", in: "a\xffb\xc3", want: `a\xffb\xc3`},
		{name: "empty", in: "", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := term(tc.in)
			if got != tc.want {
				t.Errorf("term(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if again := term(got); again != got {
				t.Errorf("term is not idempotent: %q then %q", got, again)
			}
			checkTerminalSafe(t, got, false)
		})
	}
	if got := termText("line one \x1b[2J\nline two\r"); got != "line one \\x1b[2J\nline two\\r" {
		t.Errorf("termText keeps line breaks and escapes the rest: got %q", got)
	}
}

// checkTerminalSafe fails t if out holds a control character, DEL, a C1
// control or invalid UTF-8; newlines pass when lines is set.
func checkTerminalSafe(t *testing.T, out string, lines bool) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("invalid UTF-8 reaches the terminal: %q", out)
	}
	for _, r := range out {
		if r == '\n' && lines {
			continue
		}
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f {
			t.Errorf("control %U reaches the terminal: %q", r, out)
		}
	}
}

// hostile is user text as an attacker writes it: escape sequences that
// clear the screen, recolor, retitle, rewrite the line, and break a table.
const hostile = "why\x1b[2J\x1b[31mRED\x1b]0;title\x07\rFAKE\bX\a\u009b31m\ttab\nnewline"

// TestTablesEscapeUserText: the audit trail, an entry's detail and the
// status table print a hostile note, name and error as one escaped cell
// each: no control reaches the terminal and every row stays one line.
func TestTablesEscapeUserText(t *testing.T) {
	t.Parallel()
	at := time.Date(2016, 5, 19, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		print func(w *bytes.Buffer)
		rows  int // lines printed
	}{
		{name: "audit", rows: 3, print: func(w *bytes.Buffer) {
			printAudit(w, []store.AuditRecord{
				{At: at, Actor: "alice" + hostile, Via: "api", Action: "pause", Entry: "e" + hostile, Note: hostile, Detail: hostile},
				{At: at, Actor: "bob", Via: "cli", Action: "resume", Entry: "plain", Note: "fine"},
			})
		}},
		{name: "status entry detail", rows: 14, print: func(w *bytes.Buffer) {
			e := api.EntryStatus{Name: "e" + hostile, Task: "t" + hostile, Schedule: "every 1m", Paused: true}
			e.PauseReason = hostile
			e.Runs = []api.RunOutcome{{Slot: at, PublishedAt: at, Outcome: "failed", Worker: "w" + hostile, Exception: "E" + hostile, Message: hostile}}
			printEntry(w, e)
		}},
		{name: "status table", rows: 3, print: func(w *bytes.Buffer) {
			printStatus(w, api.Status{LeaderID: "l" + hostile, Entries: []api.EntryStatus{{Name: "e" + hostile, LastError: hostile, LastResult: "error"}}}, false)
		}},
		{name: "status table sharded", rows: 7, print: func(w *bytes.Buffer) {
			printStatus(w, api.Status{Shards: []status.ShardStatus{{Shard: 0, LeaderID: "l" + hostile, FencingToken: 7}, {Shard: 1}},
				Entries: []api.EntryStatus{{Name: "e"}}}, false)
		}},
		{name: "status table wide", rows: 3, print: func(w *bytes.Buffer) {
			printStatus(w, api.Status{LeaderID: "l", Entries: []api.EntryStatus{{Name: "e", Task: hostile, Schedule: hostile, LastError: hostile}}}, true)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			tc.print(&b)
			out := b.String()
			checkTerminalSafe(t, out, true)
			if n := strings.Count(out, "\n"); n != tc.rows {
				t.Errorf("%d lines, want %d (a row was broken):\n%s", n, tc.rows, out)
			}
			if !strings.Contains(out, `\x1b[2J`) {
				t.Errorf("the escape sequence is not shown escaped:\n%s", out)
			}
		})
	}
}

// TestPrintShards: `beatd status` on a sharded cluster says who leads
// each shard with its token, and which shards nobody leads.
func TestPrintShards(t *testing.T) {
	var b bytes.Buffer
	printStatus(&b, api.Status{Shards: []status.ShardStatus{{Shard: 0, LeaderID: "a", FencingToken: 12}, {Shard: 1}, {Shard: 2, LeaderID: "b", FencingToken: 9}}}, false)
	for _, want := range []string{"leader: sharded, 3 shards, 2 led\n", "SHARD  LEADER  TOKEN\n", "0      a       12\n", "1      none    -\n", "2      b       9\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
