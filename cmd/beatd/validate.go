package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/schedule"
)

func runValidate(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: beatd validate FILE") }
	if err := fs.Parse(args); err != nil {
		return exitCode(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	cfg, err := schedule.LoadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok, %d entries\n", fs.Arg(0), len(cfg.Entries))
	printSolarNotes(stdout, cfg, time.Now())
	return 0
}

func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func runNext(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("next", stderr)
	config := fs.String("config", "schedules.yaml", "schedule file")
	entry := fs.String("entry", "", "only this entry")
	from := fs.String("from", "", "RFC 3339 instant to start after (default now)")
	count := fs.Int("count", 5, "fire times per entry")
	asJSON := fs.Bool("json", false, "one JSON object per line: {\"entry\", \"at\"}")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	if *count < 1 {
		fmt.Fprintln(stderr, "beatd next: --count must be at least 1")
		return 2
	}
	start := time.Now()
	if *from != "" {
		t, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			fmt.Fprintf(stderr, "beatd next: --from %q is not RFC 3339 (e.g. 2026-11-30T10:00:00Z)\n", *from)
			return 2
		}
		start = t
	}
	cfg, err := schedule.LoadFile(*config)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	printSolarNotes(stderr, cfg, start)
	entries := cfg.Entries
	if *entry != "" {
		e := cfg.Entry(*entry)
		if e == nil {
			fmt.Fprintf(stderr, "beatd next: no entry %q in %s\n", *entry, *config)
			return 1
		}
		entries = []*schedule.Entry{e}
	}
	enc := json.NewEncoder(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "ENTRY\tTASK\tSCHEDULE\tNEXT\tIN")
	}
	for _, e := range entries {
		t := start
		// An interval without start_at or relative is shown as if it were
		// first scheduled at --from: its grid is anchored when beatd first
		// schedules it.
		sch := schedule.Anchor(e.Schedule, start)
		for i := 0; i < *count; i++ {
			t = sch.Next(t)
			if t.IsZero() {
				if !*asJSON && i == 0 {
					fmt.Fprintf(tw, "%s\t%s\t%v\tnever\t\n", e.Name, e.Task, e.Schedule)
				}
				break
			}
			at := schedule.FormatSlot(t.In(e.Location))
			if *asJSON {
				if err := enc.Encode(struct {
					Entry string `json:"entry"`
					At    string `json:"at"`
				}{e.Name, at}); err != nil {
					fmt.Fprintln(stderr, err)
					return 1
				}
				continue
			}
			name, task, spec := "", "", ""
			if i == 0 {
				name, task, spec = e.Name, e.Task, fmt.Sprint(e.Schedule)
				if !e.Enabled {
					name += " (disabled)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, task, spec, at, humanDuration(t.Sub(start)))
		}
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// humanDuration rounds a wait for people: "in 3h25m", "in 42s".
func humanDuration(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	default:
		return d.Round(time.Second).String()
	}
}
