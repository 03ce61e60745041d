package config

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBounds refuses each out-of-range value through the file (Parse, a
// FILE:LINE:COL error at the value) and through the entries API
// (ParseEntry, a JSON pointer to it), and accepts the values at the
// edges of each bound.
func TestBounds(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", MaxNameLength+1)
	bigArg := strings.Repeat("x", MaxValueBytes)
	tests := []struct {
		name    string
		entry   string // the entry in flow YAML, which is also JSON here
		entName string // "" is "a"
		at      string // the text the error points at in the file ("" the name)
		pointer string // the JSON pointer ParseEntry gives
		want    string // in the message; "" means accepted
	}{
		{name: "every 1ns", entry: `{"task": "t", "every": "1ns"}`, at: `"1ns"`, pointer: "/every", want: "every: 1ns is below the minimum interval, 100ms"},
		{name: "every 99ms", entry: `{"task": "t", "every": "99ms"}`, at: `"99ms"`, pointer: "/every", want: "below the minimum interval"},
		{name: "every 0.01 seconds", entry: `{"task": "t", "every": 0.01}`, at: `0.01`, pointer: "/every", want: "below the minimum interval"},
		{name: "every 100ms", entry: `{"task": "t", "every": "100ms"}`},
		{name: "every 2400000h", entry: `{"task": "t", "every": "2400000h"}`, at: `"2400000h"`, pointer: "/every", want: `every: "2400000h" is too long: the limit is 3660d (ten years)`},
		{name: "every beyond time.Duration", entry: `{"task": "t", "every": "9000000h"}`, at: `"9000000h"`, pointer: "/every", want: "too long"},
		{name: "every in wrapping days", entry: `{"task": "t", "every": "50000d50000d50000d50000d50000d"}`, at: `"50000d`, pointer: "/every", want: "too long"},
		{name: "every 1e10 seconds", entry: `{"task": "t", "every": 1e10}`, at: `1e10`, pointer: "/every", want: "every: 1e10 seconds is too long"},
		{name: "every 3661d", entry: `{"task": "t", "every": "3661d"}`, at: `"3661d"`, pointer: "/every", want: "too long"},
		{name: "every 3660d", entry: `{"task": "t", "every": "3660d"}`},
		{name: "start_at 2300", entry: `{"task": "t", "every": "1h", "start_at": "2300-01-01T00:00:00Z"}`, at: `"2300`, pointer: "/start_at",
			want: "start_at 2300-01-01T00:00:00Z is outside the times beatd schedules (from 1970-01-01, before 2200-01-01)"},
		{name: "start_at 1969", entry: `{"task": "t", "cron": "@daily", "start_at": "1969-12-31T23:59:59Z"}`, at: `"1969`, pointer: "/start_at", want: "outside the times"},
		{name: "start_at 2199", entry: `{"task": "t", "every": "3660d", "start_at": "2199-12-31T23:59:59Z"}`},
		{name: "end_at 2262", entry: `{"task": "t", "every": "1h", "end_at": "2262-04-12T00:00:00Z"}`, at: `"2262`, pointer: "/end_at", want: "end_at 2262-04-12T00:00:00Z is outside"},
		{name: "at 2200", entry: `{"task": "t", "at": "2200-01-01T00:00:00Z"}`, at: `"2200`, pointer: "/at", want: "at 2200-01-01T00:00:00Z is outside"},
		{name: "at without offset in 9999", entry: `{"task": "t", "at": "9999-12-31T23:59"}`, at: `"9999`, pointer: "/at", want: "outside"},
		{name: "expires at 2300", entry: `{"task": "t", "every": "1h", "options": {"expires": "2300-01-01T00:00:00Z"}}`, at: `"2300`, pointer: "/options/expires", want: "options.expires 2300"},
		{name: "expires after 4000d", entry: `{"task": "t", "every": "1h", "options": {"expires": "4000d"}}`, at: `"4000d"`, pointer: "/options/expires", want: "options.expires: \"4000d\" is too long"},
		{name: "catchup_window 4000d", entry: `{"task": "t", "every": "1h", "catchup_window": "4000d"}`, at: `"4000d"`, pointer: "/catchup_window", want: "catchup_window: \"4000d\" is too long"},
		{name: "jitter 2400000h", entry: `{"task": "t", "every": "1h", "jitter": "2400000h"}`, at: `"2400000h"`, pointer: "/jitter", want: "jitter: \"2400000h\" is too long"},
		{name: "overlap_timeout 1e12 seconds", entry: `{"task": "t", "every": "1h", "overlap_timeout": 1000000000000}`, at: `1000000000000`, pointer: "/overlap_timeout", want: "too long"},
		{name: "time_limit 1e12 seconds", entry: `{"task": "t", "every": "1h", "options": {"time_limit": 1000000000000}}`, at: `1000000000000`, pointer: "/options/time_limit", want: "options.time_limit: 1000000000000 seconds is too long"},
		{name: "name too long", entName: long, entry: `{"task": "t", "every": "1h"}`, pointer: "", want: fmt.Sprintf("is %d characters long; the limit is %d", MaxNameLength+1, MaxNameLength)},
		{name: "name at the limit", entName: strings.Repeat("é", MaxNameLength), entry: `{"task": "t", "every": "1h"}`},
		{name: "args too large", entry: `{"task": "t", "every": "1h", "args": ["` + bigArg + `"]}`, at: `["`, pointer: "/args", want: "args, kwargs, headers and the chain's steps take more than 262144 bytes"},
		{name: "kwargs and headers together too large", entry: `{"task": "t", "every": "1h", "kwargs": {"k": "` + bigArg[:MaxValueBytes/2] + `"}, "options": {"headers": {"h": "` + bigArg[:MaxValueBytes/2] + `"}}}`,
			at: `{"k"`, pointer: "/kwargs", want: "more than 262144 bytes"},
		{name: "args just fit", entry: `{"task": "t", "every": "1h", "args": ["` + bigArg[:MaxValueBytes-10] + `"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := tt.entName
			if name == "" {
				name = "a"
			}
			file := "entries:\n  " + name + ": " + tt.entry + "\n"
			_, err := Parse("bad.yaml", []byte(file))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse: %v", shortErr(err))
				}
			} else {
				col := 3 // the name
				if tt.at != "" {
					col = len("  "+name+": ") + strings.Index(tt.entry, tt.at) + 1
				}
				wantErr := fmt.Sprintf("bad.yaml:2:%d: ", col)
				if err == nil || !strings.Contains(err.Error(), wantErr) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("Parse: %v\nwant %q ... %q", shortErr(err), wantErr, tt.want)
				}
			}
			_, err = (*Config)(nil).ParseEntry(name, []byte(tt.entry))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ParseEntry: %v", shortErr(err))
				}
				return
			}
			var fe FieldErrors
			if !errors.As(err, &fe) || len(fe) != 1 || fe[0].Pointer != tt.pointer || !strings.Contains(fe[0].Message, tt.want) {
				t.Errorf("ParseEntry: %v\nwant pointer %q and %q", shortErr(err), tt.pointer, tt.want)
			}
		})
	}
}

func shortErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return shortName(err.Error())
}

// TestMinIntervalOption lowers (and raises) the floor of every: through
// ParseWith, and ParseEntry under the config read with it keeps it.
func TestMinIntervalOption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		min   time.Duration
		every string
		ok    bool
		bad   bool // the option itself is refused
	}{
		{name: "default refuses 10ms", every: "10ms"},
		{name: "lowered to 1ms takes 1ms", min: time.Millisecond, every: "1ms", ok: true},
		{name: "lowered to 1ms refuses 999us", min: time.Millisecond, every: "999us"},
		{name: "raised to 1s refuses 500ms", min: time.Second, every: "500ms"},
		{name: "raised to 1s takes a cron with seconds", min: time.Second, every: "1s", ok: true},
		{name: "below 1ms is refused", min: 500 * time.Microsecond, every: "1ms", bad: true},
		{name: "above 1s is refused", min: 2 * time.Second, every: "2s", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opt := Options{MinInterval: tt.min}
			if err := CheckMinInterval(tt.min); (err != nil) != tt.bad {
				t.Fatalf("CheckMinInterval(%s) = %v", tt.min, err)
			}
			cfg, err := ParseWith("s.yaml", []byte("entries:\n  a: {task: t, every: "+tt.every+"}\n  c: {task: t, cron: '* * * * * *'}\n"), opt)
			if tt.bad {
				if err == nil {
					t.Fatal("ParseWith took a minimum interval out of range")
				}
				return
			}
			if (err == nil) != tt.ok {
				t.Fatalf("ParseWith: %v, want ok %v", err, tt.ok)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "s.yaml:2:23: every: ") {
					t.Errorf("error %q is not at the every", err)
				}
				cfg, err = ParseWith("s.yaml", []byte("entries: {}\n"), opt)
				if err != nil {
					t.Fatal(err)
				}
			}
			_, err = cfg.ParseEntry("x", []byte(`{"task":"t","every":"`+tt.every+`"}`))
			if (err == nil) != tt.ok {
				t.Errorf("ParseEntry under the option: %v, want ok %v", err, tt.ok)
			}
		})
	}
}

// aliasBomb is the ~400-byte document of issue 45: nine aliases a level,
// eight levels, 9^8 (43 million) nodes once expanded.
func aliasBomb(indent string) string {
	var b strings.Builder
	b.WriteString(indent + "task: t\n" + indent + "every: 1s\n" + indent + "kwargs:\n")
	b.WriteString(indent + "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for l := 'b'; l <= 'i'; l++ {
		p := string(l - 1)
		fmt.Fprintf(&b, "%s  %c: &%c [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n", indent, l, l, p, p, p, p, p, p, p, p, p)
	}
	return b.String()
}

// TestAliasBombs refuses documents whose aliases expand without bound
// through every path a document enters by, within a second and 100 MB,
// and keeps accepting what configs do with aliases: merge keys.
func TestAliasBombs(t *testing.T) {
	// Not parallel: it measures allocation.
	var big strings.Builder // a chunked file (over chunkThreshold) with the bomb in a chunk
	big.WriteString("entries:\n")
	for i := 0; big.Len() < chunkThreshold+10000; i++ {
		fmt.Fprintf(&big, "  e%05d: {task: t, every: 1h}\n", i)
	}
	// The big file takes a while to parse without any bomb; its bomb may
	// take a few times that to refuse: the chunk that holds it sends the
	// file to the whole-file parse. Times are this process's CPU time,
	// which a loaded machine does not stretch as it stretches wall time.
	start := cpuTime(t)
	if _, err := Parse("big.yaml", []byte(big.String())); err != nil {
		t.Fatal(err)
	}
	bigLimit := max(time.Second, 3*(cpuTime(t)-start))
	big.WriteString("  bomb:\n" + aliasBomb("    "))
	// Entries that share their kwargs by an alias: 3000 aliases to 61
	// nodes each, past the floor but within ten times the file's own.
	var shared strings.Builder
	shared.WriteString("entries:\n  e00000: {task: t, every: 1h, kwargs: &k {")
	for i := range 30 {
		fmt.Fprintf(&shared, "k%d: %d, ", i, i)
	}
	shared.WriteString("}}\n")
	for i := 1; i < 3000; i++ {
		fmt.Fprintf(&shared, "  e%05d: {task: t%d, every: 1h, kwargs: *k}\n", i, i)
	}
	tests := []struct {
		name  string
		parse func() error
		want  string        // "" means accepted
		limit time.Duration // 0: a second
	}{
		{name: "file", parse: func() error {
			_, err := Parse("bomb.yaml", []byte("entries:\n  x:\n"+aliasBomb("    ")))
			return err
		}, want: "bomb.yaml:11:14: aliases expand this document to more than 100000 nodes"},
		{name: "chunked file", parse: func() error {
			_, err := Parse("big.yaml", []byte(big.String()))
			return err
		}, want: "big.yaml:", limit: bigLimit},
		{name: "API body as YAML", parse: func() error {
			_, err := (*Config)(nil).ParseEntry("x", []byte(aliasBomb("")))
			return err
		}, want: "line 9, column 10: aliases expand"},
		{name: "alias inside its own anchor", parse: func() error {
			_, err := Parse("cycle.yaml", []byte("entries:\n  x: {task: t, every: 1s, args: &x [1, *x]}\n"))
			return err
		}, want: "cycle.yaml:2:40: alias *x is inside the node it names"},
		{name: "cycle in an API body", parse: func() error {
			_, err := (*Config)(nil).ParseEntry("x", []byte("task: t\nevery: 1s\nargs: &x [1, [*x]]\n"))
			return err
		}, want: "inside the node it names"},
		{name: "kwargs shared by an alias in every entry", parse: func() error {
			cfg, err := Parse("shared.yaml", []byte(shared.String()))
			if err == nil && cfg.Entry("e02999").Kwargs.Len() != 30 {
				return errors.New("shared kwargs lost")
			}
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := cpuTime(t)
			err := tt.parse()
			took := cpuTime(t) - start
			runtime.ReadMemStats(&after)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", shortErr(err))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one with %q", err, tt.want)
			}
			if limit := cmp.Or(tt.limit, time.Second); took > limit {
				t.Errorf("took %s to refuse (limit %s)", took, limit)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 100<<20 {
				t.Errorf("allocated %d MB to refuse", alloc>>20)
			}
		})
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
