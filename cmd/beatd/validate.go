package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/upcoming"

	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// validateCommand is `beatd validate FILE`.
func validateCommand(stdout, stderr io.Writer) *cobra.Command {
	var opt config.Options
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "check a schedules.yaml; exit 1 with FILE:LINE:COL errors",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := config.CheckMinInterval(opt.MinInterval); err != nil {
				return usageError{c, fmt.Errorf("--min-interval: %w", err)}
			}
			// Every check `run` makes of a file before it contacts a server.
			cfg, err := config.CheckFile(args[0], opt)
			if err != nil {
				fmt.Fprintln(stderr, termErr(err))
				return exitError(exitFail)
			}
			fmt.Fprintf(stdout, "%s: ok, %d entries\n", args[0], len(cfg.Entries))
			printSolarNotes(stdout, cfg, time.Now())
			if len(cfg.Entries) == 0 {
				fmt.Fprintf(stderr, "warning: %s: no entries: beatd would run and publish nothing\n", args[0])
			}
			return nil
		},
	}
	fs := flagenv.New("validate", stderr)
	registerMinInterval(fs, &opt)
	commandFlags(cmd, fs)
	return cmd
}

// registerMinInterval adds --min-interval, as `beatd run` has it, to a
// command that reads schedules.yaml.
func registerMinInterval(fs *pflag.FlagSet, opt *config.Options) {
	fs.DurationVar(&opt.MinInterval, "min-interval", config.DefaultMinInterval, config.MinIntervalUsage)
}

// exitCode maps a flag parsing error to an exit code.
func exitCode(err error) int {
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	return exitUsage
}

// nextOptions are the flags of `beatd next`.
type nextOptions struct {
	config, entry, from string
	count               int
	asJSON              bool
	parse               config.Options
	etcd                etcdflags.Flags
}

func (o *nextOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.config, "config", "schedules.yaml", "schedule file")
	fs.StringVar(&o.entry, "entry", "", "only this entry")
	fs.StringVar(&o.from, "from", "", "RFC 3339 instant to start after (default now)")
	fs.IntVar(&o.count, "count", 5, "fire times per entry")
	fs.BoolVar(&o.asJSON, "json", false, "one JSON object per line: {\"entry\", \"at\"}, with \"resolved\", the expression an H resolved to, when there was one; a disabled or paused entry is one {\"entry\", \"disabled\": true} or {\"entry\", \"paused\": true} instead of times")
	registerMinInterval(fs, &o.parse)
	o.etcd.Register(fs)
	fs.Lookup("etcd-endpoints").Usage = "read each entry's state from this etcd (as the leader and the console do): paused entries, and intervals on the grid the leader runs; without it, intervals are anchored at --from"
}

// nextCommand is `beatd next`.
func nextCommand(stdout, stderr io.Writer) *cobra.Command {
	o := &nextOptions{}
	cmd := &cobra.Command{
		Use:   "next",
		Short: "print the next fire times of each entry",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			return codeErr(o.run(c, stdout, stderr))
		},
	}
	fs := flagenv.New("next", stderr)
	o.register(fs)
	commandFlags(cmd, fs)
	return cmd
}

func (o *nextOptions) run(c *cobra.Command, stdout, stderr io.Writer) int {
	configFile, entry, from, count, asJSON := &o.config, &o.entry, &o.from, &o.count, &o.asJSON
	if *count < 1 {
		fmt.Fprintf(stderr, "beatd next: --count must be at least 1\nRun '%s --help' for usage.\n", c.CommandPath())
		return exitUsage
	}
	start := time.Now()
	if *from != "" {
		t, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			fmt.Fprintf(stderr, "beatd next: --from %q is not RFC 3339 (e.g. 2026-11-30T10:00:00Z)\nRun '%s --help' for usage.\n", *from, c.CommandPath())
			return exitUsage
		}
		start = t
	}
	if err := config.CheckMinInterval(o.parse.MinInterval); err != nil {
		fmt.Fprintf(stderr, "beatd next: --min-interval: %v\nRun '%s --help' for usage.\n", err, c.CommandPath())
		return exitUsage
	}
	cfg, err := config.LoadFileWith(*configFile, o.parse)
	if err != nil {
		fmt.Fprintln(stderr, termErr(err))
		return 1
	}
	printSolarNotes(stderr, cfg, start)
	entries := cfg.Entries
	if *entry != "" {
		e := cfg.Entry(*entry)
		if e == nil {
			fmt.Fprintf(stderr, "beatd next: no entry %q in %s\n", *entry, *configFile)
			return 1
		}
		entries = []*config.Entry{e}
	}
	states, err := o.states(c.Context())
	if err != nil {
		fmt.Fprintln(stderr, "beatd next:", termErr(err))
		return 1
	}
	enc := json.NewEncoder(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "ENTRY\tTASK\tSCHEDULE\tNEXT\tIN")
	}
	for _, e := range entries {
		st := states[e.Name]
		if off := offWord(e, st); off != "" {
			// It does not fire: say so, and print no fire times.
			if *asJSON {
				line := struct {
					Entry    string `json:"entry"`
					Disabled bool   `json:"disabled,omitempty"`
					Paused   bool   `json:"paused,omitempty"`
				}{e.Name, off == "disabled", off == "paused"}
				if err := enc.Encode(line); err != nil {
					fmt.Fprintln(stderr, err)
					return 1
				}
				continue
			}
			fmt.Fprintf(tw, "%s (%s)\t%s\t%s\tnever\t\n", term(e.Name), off, term(e.Task), term(fmt.Sprint(e.Schedule)))
			continue
		}
		// The slots the leader fires (upcoming.Slots): its grid, end_at,
		// calendars and the runs max_runs leaves. With no state (no
		// --etcd-endpoints, or an entry not scheduled yet), an interval
		// without start_at or relative is anchored at --from, as when beatd
		// first schedules it, and no run is counted yet.
		slots := upcoming.Slots(e, st, start, *count)
		if len(slots) == 0 {
			// Finished (end_at passed, max_runs made) is not an error: say
			// which.
			what := finishedWord(e, st, start)
			if *asJSON {
				if what != "never" {
					if err := enc.Encode(struct {
						Entry    string `json:"entry"`
						Finished string `json:"finished"`
					}{e.Name, strings.TrimPrefix(what, "finished: ")}); err != nil {
						fmt.Fprintln(stderr, err)
						return 1
					}
				}
			} else {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", term(e.Name), term(e.Task), term(fmt.Sprint(e.Schedule)), what)
			}
			continue
		}
		resolved, _ := schedule.Spread(e.Schedule)
		for i, t := range slots {
			at := schedule.FormatSlot(t.In(e.Location))
			if *asJSON {
				line := nextLine(e, t, at)
				line.Resolved = resolved
				if err := enc.Encode(line); err != nil {
					fmt.Fprintln(stderr, err)
					return 1
				}
				continue
			}
			name, task, spec := "", "", ""
			if i == 0 {
				name, task, spec = term(e.Name), term(e.Workflow()), term(fmt.Sprint(e.Schedule))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, task, spec, at, humanDuration(t.Sub(start)))
		}
		if len(slots) < *count && !*asJSON {
			// Fewer than asked: say why the list ends.
			switch {
			case upcoming.RunsLeft(e, st) == len(slots):
				fmt.Fprintf(tw, "\t\t\tthen finished: max_runs (%d)\t\n", e.MaxRuns())
			case !e.EndAt().IsZero():
				fmt.Fprintf(tw, "\t\t\tthen finished: end_at %s\t\n", schedule.FormatSlot(e.EndAt().In(e.Location)))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// nextSlot is one line of next --json: a slot, with what its message
// will carry when that is more than the entry's own task and values (a
// template's rendered args and kwargs, a chain's and callbacks' tasks).
type nextSlot struct {
	Entry     string          `json:"entry"`
	At        string          `json:"at"`
	Resolved  string          `json:"resolved,omitempty"` // what H resolved to
	Args      json.RawMessage `json:"args,omitempty"`
	Kwargs    json.RawMessage `json:"kwargs,omitempty"`
	Chain     []string        `json:"chain,omitempty"`
	Link      []string        `json:"link,omitempty"`
	LinkError []string        `json:"link_error,omitempty"`
}

func nextLine(e *config.Entry, slot time.Time, at string) nextSlot {
	line := nextSlot{Entry: e.Name, At: at}
	if e.Templated() {
		args, kwargs := e.Render(slot)
		if args == nil {
			args = []any{}
		}
		if kwargs == nil {
			kwargs = &celery.Map{}
		}
		line.Args, line.Kwargs = celery.AppendJSON(nil, args), celery.AppendJSON(nil, kwargs)
	}
	if c := e.Canvas(); c != nil {
		for _, l := range []struct {
			dst   *[]string
			steps []celery.Step
		}{{&line.Chain, c.Chain}, {&line.Link, c.Link}, {&line.LinkError, c.LinkError}} {
			for _, s := range l.steps {
				*l.dst = append(*l.dst, s.Task)
			}
		}
		if len(c.Chain) > 0 {
			line.Chain = append([]string{e.Task}, line.Chain...)
		}
	}
	return line
}

// finishedWord says why e has no slot after now: "finished: made its
// max_runs (N)", "finished: end_at T", or "never".
func finishedWord(e *config.Entry, st *store.EntryState, now time.Time) string {
	switch fin, left := upcoming.Finished(e, st, now); {
	case fin && left == 0:
		return fmt.Sprintf("finished: made its max_runs (%d)", e.MaxRuns())
	case fin:
		return "finished: end_at " + schedule.FormatSlot(e.EndAt().In(e.Location))
	}
	return "never"
}

// offWord says why an entry does not fire ("disabled", "paused"), or "".
func offWord(e *config.Entry, st *store.EntryState) string {
	switch {
	case !e.Enabled:
		return "disabled"
	case st != nil && st.Paused:
		return "paused"
	}
	return ""
}

// states reads every entry's state from etcd when --etcd-endpoints is
// given, else returns none.
func (o *nextOptions) states(ctx context.Context) (map[string]*store.EntryState, error) {
	if len(o.etcd.EndpointURLs()) == 0 {
		return nil, nil
	}
	cli, err := o.etcd.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, err := store.New(cli, o.etcd.KeyPrefix()).Load(ctx)
	if err != nil {
		return nil, err
	}
	return t.States(), nil
}

// humanDuration writes a wait for people, always the same way: its two
// largest units, rounded down to the second ("2d 3h", "19h 30m", "5m 3s",
// "42s").
func humanDuration(d time.Duration) string {
	// Seconds first, then the sign: -d overflows for math.MinInt64.
	s, sign := int64(d/time.Second), ""
	if s < 0 { // under a second either way is "0s"
		s, sign = -s, "-"
	}
	units := []struct {
		secs int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}}
	for i, u := range units {
		if s < u.secs && u.secs > 1 {
			continue
		}
		out := sign + strconv.FormatInt(s/u.secs, 10) + u.name
		if i+1 < len(units) {
			if rest := s % u.secs / units[i+1].secs; rest > 0 {
				out += " " + strconv.FormatInt(rest, 10) + units[i+1].name
			}
		}
		return out
	}
	return sign + "0s"
}
