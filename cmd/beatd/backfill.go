package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	"github.com/spf13/cobra"
)

// backfillOptions are backfill's flags.
type backfillOptions struct {
	target       apiTarget
	from, to     string
	dryRun       bool
	rate         float64
	includeFired bool
	note         string
	list         bool
	cancel       string
	wait         time.Duration
	asJSON       bool
	timeout      time.Duration
}

// backfillCommand is `beatd backfill`: publish an entry's past slots
// through a replica's API, which plans them from the run history.
func backfillCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	o := &backfillOptions{target: newAPITarget()}
	cmd := &cobra.Command{
		Use:   "backfill ENTRY --from T1 --to T2 | --list [ENTRY] | --cancel ID",
		Short: "publish an entry's slots in a past range, in order (or list and cancel backfills)",
		Long: fmt.Sprintf(`backfill publishes the entry's slots in [--from, --to], in order, at --rate slots
a second (default %g, at most %g), each with the task id a normal fire of that slot
would have had. The leader runs it, fenced like every publish; a new leader
resumes it after a failover from where it got, without repeating a slot.

Slots already fired are skipped unless --include-fired. "Already fired" is what
is on record: the broker's run history (the last --run-history runs, 20 by
default; RabbitMQ keeps none), the last few runs kept with the entry's state,
and the last %d backfills. A slot fired before all of those counts as not
fired. A backfill repeated over the same range publishes nothing new.

--to must not be in the future, and a backfill publishes at most %d slots.
Slots the schedule still owes (due now, or queued by a catch-up) are left to
it. Times are RFC 3339 (2026-11-30T09:00:00Z), a date (2026-11-30, midnight
UTC), "now", or a duration before now (-36h, -7d).

It goes through the leader's HTTP API, found in etcd (--etcd-endpoints,
--prefix), or a replica's at --server, with a token of the operate role,
since the replica reads the run history to plan it.`, scheduler.DefaultBackfillRate, scheduler.MaxBackfillRate,
			store.KeptBackfills, scheduler.MaxBackfillSlots),
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			return codeErr(o.run(ctx, c, args, stdout, stderr))
		},
	}
	fs := flagenv.New("backfill", stderr)
	o.target.register(fs)
	fs.StringVar(&o.from, "from", "", "the range's start (inclusive)")
	fs.StringVar(&o.to, "to", "", "the range's end (inclusive; not in the future)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "list the slots, and which already fired, without publishing")
	fs.Float64Var(&o.rate, "rate", 0, fmt.Sprintf("slots a second (default %g)", scheduler.DefaultBackfillRate))
	fs.BoolVar(&o.includeFired, "include-fired", false, "publish slots the run history shows as already fired, too")
	fs.StringVar(&o.note, "note", "", "why: kept in the audit trail")
	fs.BoolVar(&o.list, "list", false, "list the backfills (of ENTRY, if given): running, and the last ones finished")
	fs.StringVar(&o.cancel, "cancel", "", "cancel the backfill with this id")
	fs.DurationVar(&o.wait, "wait", 0, "wait up to this long for the backfill to finish, printing its progress")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "deadline of each request")
	commandFlags(cmd, fs)
	return cmd
}

func (o *backfillOptions) run(ctx context.Context, c *cobra.Command, args []string, stdout, stderr io.Writer) int {
	switch {
	case o.cancel != "" && len(args) > 0:
		return usageFail(c, stderr, "--cancel takes a backfill id, not an entry")
	case !o.list && o.cancel == "" && (len(args) != 1 || o.from == "" || o.to == ""):
		return usageFail(c, stderr, "backfill needs ENTRY, --from and --to")
	}
	// The range is checked before the command looks for the cluster.
	var from, to time.Time
	if !o.list && o.cancel == "" {
		var err error
		now := time.Now()
		if from, err = parseWhen(o.from, now); err != nil {
			return usageFail(c, stderr, "--from: "+err.Error())
		}
		if to, err = parseWhen(o.to, now); err != nil {
			return usageFail(c, stderr, "--to: "+err.Error())
		}
	}
	cl, err := o.target.client(ctx, o.timeout)
	if err != nil {
		fmt.Fprintln(stderr, "beatd backfill:", termErr(err))
		return exitFail
	}
	cl.note = o.note
	switch {
	case o.list:
		entry := ""
		if len(args) == 1 {
			entry = args[0]
		}
		return o.runList(ctx, cl, entry, stdout, stderr)
	case o.cancel != "":
		rctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		body, _ := json.Marshal(map[string]string{"note": o.note})
		if err := cl.do(rctx, http.MethodDelete, "/api/v1/backfills/"+url.PathEscape(o.cancel), body, nil); err != nil {
			fmt.Fprintf(stderr, "beatd backfill --cancel %s: %s\n", term(o.cancel), termErr(err))
			return exitFail
		}
		fmt.Fprintf(stdout, "backfill %s: cancel accepted\n", term(o.cancel))
		return 0
	}
	name := args[0]
	spec := api.BackfillSpec{From: from, To: to, DryRun: o.dryRun, Rate: o.rate, IncludeFired: o.includeFired, Note: o.note}
	body, _ := json.Marshal(spec)
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var ans api.BackfillAnswer
	if err := cl.do(rctx, http.MethodPost, "/api/v1/entries/"+url.PathEscape(name)+"/backfill", body, &ans); err != nil {
		fmt.Fprintf(stderr, "beatd backfill %s: %s\n", term(name), termErr(err))
		return exitFail
	}
	if o.asJSON && o.wait == 0 {
		_ = json.NewEncoder(stdout).Encode(ans)
		return 0
	}
	if o.dryRun {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SLOT\tTASK ID\tALREADY FIRED\tPUBLISH")
		for _, s := range ans.Slots {
			pub := "yes"
			if s.Fired && !o.includeFired {
				pub = "no (fired)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", s.Slot.UTC().Format(time.RFC3339), term(s.TaskID), s.Fired, pub)
		}
		_ = tw.Flush()
		fmt.Fprintf(stdout, "dry run: %d slots, %d would be published, %d already fired\n", len(ans.Slots), ans.Publish, ans.Fired)
		return 0
	}
	fmt.Fprintf(stdout, "backfill %s of %s queued: %d slots to publish, %d already fired\n", term(ans.Job.ID), term(name), ans.Publish, ans.Fired)
	if o.wait == 0 {
		fmt.Fprintf(stdout, "follow it with: beatd backfill --list %s\n", term(name))
		return 0
	}
	return o.follow(ctx, cl, ans.Job.ID, stdout, stderr)
}

// follow polls a backfill until it ends or --wait passes.
func (o *backfillOptions) follow(ctx context.Context, cl *entriesClient, id string, stdout, stderr io.Writer) int {
	deadline := time.Now().Add(o.wait)
	last := ""
	for {
		rctx, cancel := context.WithTimeout(ctx, o.timeout)
		var job store.Backfill
		err := cl.do(rctx, http.MethodGet, "/api/v1/backfills/"+url.PathEscape(id), nil, &job)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "beatd backfill: %s\n", termErr(err))
		} else {
			line := fmt.Sprintf("%s: %s, %d published, %d skipped of %d", term(id), term(job.State), job.Published, job.Skipped, job.Total)
			if line != last && !o.asJSON {
				fmt.Fprintln(stdout, line)
				last = line
			}
			if !job.Unfinished() {
				if o.asJSON {
					_ = json.NewEncoder(stdout).Encode(job)
				}
				if job.State != store.BackfillDone {
					return exitFail
				}
				return 0
			}
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stderr, "beatd backfill: %s not finished within %s (it goes on; beatd backfill --list shows it)\n", term(id), o.wait)
			return exitFail
		}
		select {
		case <-ctx.Done():
			return exitFail
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (o *backfillOptions) runList(ctx context.Context, cl *entriesClient, entry string, stdout, stderr io.Writer) int {
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var out struct {
		Backfills []store.Backfill `json:"backfills"`
	}
	path := "/api/v1/backfills"
	if entry != "" {
		path += "?entry=" + url.QueryEscape(entry)
	}
	if err := cl.do(rctx, http.MethodGet, path, nil, &out); err != nil {
		fmt.Fprintln(stderr, "beatd backfill --list:", termErr(err))
		return exitFail
	}
	if o.asJSON {
		_ = json.NewEncoder(stdout).Encode(out)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tENTRY\tSTATE\tFROM\tTO\tPUBLISHED\tSKIPPED\tTOTAL\tBY\tNOTE")
	for _, j := range out.Backfills {
		note := j.Note
		if j.Error != "" {
			note = strings.TrimSpace(note + " (" + j.Error + ")")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", dash(j.ID), dash(j.Entry), dash(j.State), j.From.UTC().Format(time.RFC3339),
			j.To.UTC().Format(time.RFC3339), j.Published, j.Skipped, j.Total, dash(j.Actor), dash(oneLine(note, 0)))
	}
	_ = tw.Flush()
	return 0
}

// parseWhen reads a time: RFC 3339, a date (midnight UTC), "now", or a
// duration before now ("-36h", "-7d").
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "now" {
		return now.UTC(), nil
	}
	if strings.HasPrefix(s, "-") {
		d, err := schedule.ParseDuration(s)
		if err != nil {
			return time.Time{}, err
		}
		return now.Add(d).UTC(), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, errors.New("want RFC 3339 (2026-11-30T09:00:00Z), a date (2026-11-30), now, or a duration before now (-36h, -7d); got " + s)
}

// usageFail prints a usage problem with a pointer to --help.
func usageFail(c *cobra.Command, stderr io.Writer, msg string) int {
	fmt.Fprintf(stderr, "beatd: %s\nRun '%s --help' for usage.\n", termText(msg), c.CommandPath())
	return exitUsage
}
