package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/status"

	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/catalog"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gopkg.in/yaml.v3"
)

// statusOptions are the flags of `beatd status`.
type statusOptions struct {
	etcd    etcdflags.Flags
	broker  statusBroker
	config  string
	output  string
	asJSON  bool
	timeout time.Duration
	entry   string // the one entry to show in detail
	// serverCA verifies the leader's https status URL.
	serverCA string
}

func (o *statusOptions) register(fs *pflag.FlagSet) {
	o.etcd.Register(fs)
	fs.StringVar(&o.serverCA, "server-cacert", "", serverCACertHelp)
	o.broker.register(fs)
	fs.StringVar(&o.config, "config", "", "schedule file for schedules and next run times (default: the config the leader published to etcd)")
	fs.StringVarP(&o.output, "output", "o", "", "output format: json, yaml or wide (default: a table)")
	fs.BoolVar(&o.asJSON, "json", false, "same as -o json")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "deadline for the whole command, etcd and the leader's HTTP included")
	_ = fs.MarkHidden("json")
}

// statusCommand is `beatd status`.
func statusCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	o := &statusOptions{etcd: etcdflags.Flags{Prefix: keys.DefaultPrefix}}
	cmd := &cobra.Command{
		Use:   "status [ENTRY]",
		Short: "show the leader and every entry's state, from etcd",
		Long: `Show who leads and every entry's state: paused, last run, what the workers
reported about it, last publish result and error, next run. With ENTRY, that
entry's last runs and their outcomes (received, started, succeeded, failed
with the exception, lost, skipped), its failure streak and why it is paused.
It reads etcd, and the leader's HTTP /status (at the address the leader
registered in etcd) for the last results and the recent runs, so it works
from anywhere that reaches etcd and the leader, without the schedule file
or the broker's address. --broker reads the recent runs from Redis instead.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.entry = args[0]
			}
			if o.asJSON {
				o.output = "json"
			}
			switch o.output {
			case "", "wide", "json", "yaml":
			default:
				return usageError{c, fmt.Errorf("--output %q: want json, yaml or wide", o.output)}
			}
			return codeErr(o.run(ctx, stdout, stderr))
		},
	}
	fs := flagenv.New("status", stderr)
	o.register(fs)
	commandFlags(cmd, fs)
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"json", "yaml", "wide"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (o *statusOptions) run(ctx context.Context, stdout, stderr io.Writer) int {
	var cfg *config.Config
	if o.config != "" {
		var err error
		if cfg, err = config.LoadFile(o.config); err != nil {
			fmt.Fprintln(stderr, termErr(err))
			return exitFail
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cli, err := o.etcd.Client()
	if err != nil {
		fmt.Fprintln(stderr, "beatd status:", termErr(err))
		return exitFail
	}
	defer cli.Close()
	prefix := o.etcd.KeyPrefix()
	var notes []string
	if cfg == nil {
		cfg, _, err = catalog.Load(ctx, cli, prefix)
		switch {
		case errors.Is(err, catalog.ErrNone):
			notes = append(notes, "no leader has published its config to etcd yet: schedules and next runs unknown (pass --config)")
		case err != nil:
			if ctx.Err() != nil {
				fmt.Fprintln(stderr, "beatd status:", termErr(o.etcd.Failure("read the leader's config", o.timeout, err)))
				return exitFail
			}
			notes = append(notes, err.Error())
		}
	}
	if cfg, err = runtimeEntries(ctx, cli, prefix, cfg); err != nil {
		fmt.Fprintln(stderr, "beatd status:", termErr(o.etcd.Failure("read runtime entries", o.timeout, err)))
		return exitFail
	}
	// The recent runs come from the leader, which reaches the broker,
	// unless --broker names it: the CLI needs no broker address (nor its
	// password) of its own.
	var hist outcome.History
	if o.broker.url != "" {
		h, closeHist, err := o.broker.history(keys.Cluster(prefix))
		if err != nil {
			notes = append(notes, "recent runs unavailable: "+err.Error())
		} else {
			hist = h
		}
		defer closeHist()
	}
	q := status.Query{Limit: status.DefaultLimit}
	if o.entry != "" {
		q.Prefix = o.entry // the entry first, wherever it is among a million
	}
	st, err := status.FromEtcd(ctx, cli, prefix, cfg, hist, time.Now(), q)
	if err != nil {
		fmt.Fprintln(stderr, "beatd status:", termErr(o.etcd.Failure("read status", o.timeout, err)))
		return exitFail
	}
	// A sharded cluster's replicas each answer /status for every shard
	// (gathering each shard's live fields from its leader), so the CLI
	// asks one of them: the first shard's leader.
	asked := st.LeaderID
	for _, sh := range st.Shards {
		if asked == "" && sh.LeaderID != "" {
			asked = sh.LeaderID
		}
	}
	switch {
	case asked == "" && hist == nil:
		notes = append(notes, "recent runs and last results unavailable: no leader (--broker reads the runs from Redis)")
	case asked == "":
	case st.LeaderUnresponsive && hist == nil:
		notes = append(notes, "recent runs and last results unavailable: the leader is not responding (--broker reads the runs from Redis)")
	case st.LeaderUnresponsive:
	default:
		err := o.mergeLeader(ctx, cli, prefix, asked, &st, hist == nil)
		switch {
		case err != nil && hist == nil:
			notes = append(notes, "recent runs and last results unavailable (--broker reads the runs from Redis): "+err.Error())
		case err != nil:
			notes = append(notes, "last results unavailable: "+err.Error())
		}
	}
	for _, sh := range st.Shards {
		if sh.LiveError != "" {
			notes = append(notes, fmt.Sprintf("shard %d: last results, health and the leader's next runs unavailable: %s", sh.Shard, sh.LiveError))
		}
	}
	if st.HistoryError != "" {
		from := "the leader's broker"
		if hist != nil {
			from = broker.Redacted(o.broker.url)
		}
		notes = append(notes, fmt.Sprintf("recent runs unavailable (%s): %s", from, st.HistoryError))
	}
	if o.entry != "" {
		var found []status.Entry
		for _, e := range st.Entries {
			if e.Name == o.entry {
				found = append(found, e)
			}
		}
		if len(found) == 0 {
			fmt.Fprintf(stderr, "beatd status: no entry %q\n", o.entry)
			return exitFail
		}
		st.Entries = found
	}
	if st.OutcomeWarning != "" {
		notes = append(notes, st.OutcomeWarning)
	}
	if o.entry == "" && st.EntriesTotal > len(st.Entries) {
		notes = append(notes, fmt.Sprintf("showing the first %d of %d entries; `beatd status NAME` shows one, `beatd entries list` every one", len(st.Entries), st.EntriesTotal))
	}
	switch o.output {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	case "yaml":
		// Through JSON, so the field names are the JSON ones.
		b, _ := json.Marshal(st)
		var v any
		_ = json.Unmarshal(b, &v)
		enc := yaml.NewEncoder(stdout)
		enc.SetIndent(2)
		_ = enc.Encode(v)
		_ = enc.Close()
	default:
		if o.entry != "" {
			printEntry(stdout, st.Entries[0])
		} else {
			printStatus(stdout, st, o.output == "wide")
		}
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "note:", termText(n))
	}
	return 0
}

// printShards writes who leads each shard of a sharded cluster.
func printShards(w io.Writer, shards []status.ShardStatus) {
	led := 0
	for _, sh := range shards {
		if sh.LeaderID != "" {
			led++
		}
	}
	fmt.Fprintf(w, "leader: sharded, %d shards, %d led\n", len(shards), led)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tLEADER\tTOKEN")
	for _, sh := range shards {
		if sh.LeaderID == "" {
			fmt.Fprintf(tw, "%d\tnone\t-\n", sh.Shard)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\n", sh.Shard, term(sh.LeaderID), sh.FencingToken)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
}

// printStatus writes the status table; wide adds the task, schedule, run
// count and full error.
func printStatus(w io.Writer, st status.View, wide bool) {
	switch {
	case len(st.Shards) > 0:
		printShards(w, st.Shards)
	case st.LeaderID == "":
		fmt.Fprintln(w, "leader: none")
	case st.LeaderUnresponsive:
		fmt.Fprintf(w, "leader: %s (fencing token %d) NOT RESPONDING: its lease was not renewed, it expires in %ds\n", term(st.LeaderID), st.FencingToken, st.LeaderLeaseSeconds)
	default:
		fmt.Fprintf(w, "leader: %s (fencing token %d)\n", term(st.LeaderID), st.FencingToken)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "ENTRY\tTASK\tSCHEDULE\tPAUSED\tRUNS\tLAST SLOT\tLAST RUN\tRESULT\tOUTCOME\tNEXT\tLAST ERROR")
	} else {
		fmt.Fprintln(tw, "ENTRY\tPAUSED\tLAST RUN\tRESULT\tOUTCOME\tNEXT\tLAST ERROR")
	}
	for _, e := range st.Entries {
		errText := dash(e.LastError)
		if e.LastErrorAt != nil {
			errText = e.LastErrorAt.Format(time.RFC3339) + " " + e.LastError
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", term(e.Name), dash(cmp.Or(e.Workflow, e.Task)), dash(e.Schedule), e.Paused, e.TotalRunCount,
				fmtTime(e.LastSlot), fmtTime(e.LastRunAt), dash(e.ResultText()), dash(e.LastOutcome()), fmtTime(e.NextRunAt), oneLine(errText, 0))
		} else {
			fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\n", term(e.Name), e.Paused, fmtTime(e.LastRunAt), dash(e.ResultText()), dash(e.LastOutcome()),
				fmtTime(e.NextRunAt), oneLine(errText, 60))
		}
	}
	_ = tw.Flush()
	for _, b := range st.Backfills {
		fmt.Fprintf(w, "backfill %s of %s: %s, %d published, %d skipped of %d (%s to %s, by %s)\n", term(b.ID), term(b.Entry), term(b.State),
			b.Published, b.Skipped, b.Total, b.From.UTC().Format(time.RFC3339), b.To.UTC().Format(time.RFC3339), dash(b.Actor))
	}
}

// printEntry writes one entry's detail and its runs' outcomes.
func printEntry(w io.Writer, e status.Entry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, term(v)) }
	row("entry", e.Name)
	row("task", dash(e.Task))
	row("schedule", dash(e.Schedule))
	paused := fmt.Sprint(e.Paused)
	if e.PauseReason != "" {
		paused += " (" + e.PauseReason + ")"
	}
	row("paused", paused)
	row("overlap", dash(e.Overlap))
	row("running", fmt.Sprint(e.Running))
	row("last success", fmtTime(e.LastSuccessAt))
	row("last failure", fmtTime(e.LastFailureAt))
	row("failures in a row", fmt.Sprint(e.ConsecutiveFailures))
	row("last published", fmtTime(e.LastPublishedAt))
	row("next run", fmtTime(e.NextRunAt))
	if e.Health != "" {
		row("health", term(e.Health+": "+e.HealthReason))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	if len(e.Runs) == 0 {
		fmt.Fprintln(w, "no run outcomes recorded")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tOUTCOME\tPUBLISHED\tSTARTED\tRUNTIME\tWORKER\tEXCEPTION")
	for _, r := range e.Runs {
		rt := "-"
		if d := r.Runtime(); d > 0 {
			rt = d.Round(time.Millisecond).String()
		}
		exc := r.ExceptionText()
		slot := r.Slot.Format(time.RFC3339)
		if r.Manual {
			slot += " (manual)"
		}
		if r.SkippedSlots > 1 {
			exc = fmt.Sprintf("%d slots in a row, the newest shown", r.SkippedSlots)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", slot, dash(r.OutcomeText()), r.PublishedAt.Format(time.RFC3339), fmtTime(r.StartedAt), rt,
			dash(r.Worker), dash(oneLine(exc, 80)))
	}
	_ = tw.Flush()
}

// dash is a table cell of user text: "-" when empty, else escaped (term).
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return term(s)
}

// oneLine keeps a table cell on one line, cut to max runes (0: no cut),
// escaped (term).
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); max > 0 && len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return term(s)
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// mergeLeader adds what replica id's GET /status knows to st: each
// entry's last result and error (only the leader has them; on a sharded
// cluster any replica gathers them from every shard's leader), and with
// runs its recent runs, which the leader reads from the broker. It finds
// the replica's HTTP where the replica registered it.
func (o *statusOptions) mergeLeader(ctx context.Context, cli *clientv3.Client, prefix, id string, st *status.View, runs bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reps, err := election.Replicas(ctx, cli, prefix)
	if err != nil {
		return err
	}
	base, err := election.LeaderURL(election.Leader{ID: id}, reps)
	if err != nil {
		return err
	}
	statusURL := base + "/status"
	if o.entry != "" {
		statusURL += "?" + url.Values{"prefix": {o.entry}}.Encode() // the entry, wherever it is among a million
	}
	return mergeLeaderResults(ctx, st, statusURL, o.serverCA, runs)
}

// mergeLeaderResults adds each entry's last result and error, which only
// the leader knows, from its GET /status, and with runs the entry's
// recent runs, through status's overlay. It is the one place the CLI
// reads them, so it can be re-pointed when they are stored elsewhere.
func mergeLeaderResults(ctx context.Context, st *status.View, statusURL, caFile string, runs bool) error {
	hc, err := cliHTTP(caFile)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, statusURL, nil)
	if err != nil {
		return err
	}
	// /status is a read: where tokens guard reads, it needs one, taken
	// as --server's is (BEATD_TOKEN, else BEATD_ADMIN_TOKEN).
	if tok := cmp.Or(os.Getenv("BEATD_TOKEN"), os.Getenv("BEATD_ADMIN_TOKEN")); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("leader at %s: %w", statusURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("leader at %s: %s", statusURL, resp.Status)
	}
	var ls status.View
	if err := json.NewDecoder(resp.Body).Decode(&ls); err != nil {
		return fmt.Errorf("leader at %s: %w", statusURL, err)
	}
	st.Overlay(status.LiveOf(ls.Entries))
	for _, sh := range ls.Shards {
		// Why a shard's live fields are missing, as that replica saw it.
		if sh.Shard < len(st.Shards) && st.Shards[sh.Shard].Shard == sh.Shard {
			st.Shards[sh.Shard].LiveError = sh.LiveError
		}
	}
	if runs {
		st.OverlayRuns(ls.Entries)
		st.HistoryError = ls.HistoryError
	}
	st.OutcomeWarning = ls.OutcomeWarning
	return nil
}

// adminOptions are the flags of trigger, pause and resume.
type adminOptions struct {
	etcd    etcdflags.Flags
	wait    time.Duration
	timeout time.Duration
	asJSON  bool
	noCheck bool
	// respectOverlap: a trigger obeys the entry's overlap policy.
	respectOverlap bool
	note           string
	// server, when set, sends the request to beatd's HTTP API with
	// token, instead of writing it to etcd.
	server    string
	tokenFile string
	serverCA  string
}

func (o *adminOptions) register(fs *pflag.FlagSet) {
	o.etcd.Register(fs)
	fs.DurationVar(&o.wait, "wait", 10*time.Second, "how long to wait for the leader to act (0: do not wait)")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "deadline for checking the entry and queueing the request in etcd")
	fs.BoolVar(&o.asJSON, "json", false, "print the outcome as JSON")
	fs.BoolVar(&o.noCheck, "no-check", false, "queue the request without checking the entry exists in the leader's config")
	fs.StringVar(&o.note, "note", "", "why: kept in the audit trail (and, for a pause, shown by status); a leader run with --require-notes refuses a pause without one")
	fs.StringVar(&o.server, "server", "", "send the request to beatd's HTTP API at this URL, authenticated by --token-file, instead of writing it to etcd (BEATD_SERVER)")
	fs.StringVar(&o.tokenFile, "token-file", "", "with --server: file holding the bearer token (else BEATD_TOKEN, else BEATD_ADMIN_TOKEN)")
	fs.StringVar(&o.serverCA, "server-cacert", "", serverCACertHelp)
}

// adminCommand is trigger, pause or resume: it checks the entry against
// the config the leader published, queues the request in etcd and waits
// until the leader has acted on it.
func adminCommand(ctx context.Context, op store.Op, short string, stdout, stderr io.Writer) *cobra.Command {
	o := &adminOptions{etcd: etcdflags.Flags{Prefix: keys.DefaultPrefix}}
	cmd := &cobra.Command{
		Use:   string(op) + " ENTRY",
		Short: short,
		Args:  usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 || flagenv.ApplyEnv(c.Flags()) != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return o.entryNames(ctx), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return codeErr(o.run(ctx, op, args[0], stdout, stderr))
		},
	}
	fs := flagenv.New(string(op), stderr)
	o.register(fs)
	if op == store.OpTrigger {
		fs.BoolVar(&o.respectOverlap, "respect-overlap", false, "obey the entry's overlap policy: skip the trigger while the previous run is unfinished")
	}
	commandFlags(cmd, fs)
	return cmd
}

// entryNames completes entry names from the leader's published config.
func (o *adminOptions) entryNames(ctx context.Context) []cobra.Completion {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cli, err := o.etcd.Client()
	if err != nil {
		return nil
	}
	defer cli.Close()
	cfg, _, err := catalog.Load(ctx, cli, o.etcd.KeyPrefix())
	if err != nil {
		return nil
	}
	out := make([]cobra.Completion, 0, len(cfg.Entries))
	for _, e := range cfg.Entries {
		out = append(out, e.Name)
	}
	return out
}

func (o *adminOptions) run(ctx context.Context, op store.Op, name string, stdout, stderr io.Writer) int {
	if o.server != "" {
		return o.runHTTP(ctx, op, name, stdout, stderr)
	}
	cli, err := o.etcd.Client()
	if err != nil {
		fmt.Fprintf(stderr, "beatd %s: %s\n", op, termErr(err))
		return exitFail
	}
	defer cli.Close()
	tctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if !o.noCheck {
		if err := checkEntry(tctx, cli, o.etcd.KeyPrefix(), name); err != nil {
			if tctx.Err() != nil {
				err = o.etcd.Failure("check the entry", o.timeout, err)
			}
			fmt.Fprintf(stderr, "beatd %s %s: %s\n", op, term(name), termErr(err))
			return exitFail
		}
	}
	if op == store.OpPause && strings.TrimSpace(o.note) == "" {
		if h, err := catalog.ReadHeader(tctx, cli, o.etcd.KeyPrefix()); err == nil && h.RequireNotes {
			fmt.Fprintf(stderr, "beatd pause %s: the leader runs with --require-notes: say why with --note\n", term(name))
			return exitUsage
		}
	}
	req := store.Request{Op: op, Entry: name, RespectOverlap: o.respectOverlap, Actor: o.etcdActor(), Note: strings.TrimSpace(o.note)}
	rec := &store.AuditRecord{Actor: req.Actor, Role: "etcd", Via: "etcd", Action: string(op), Entry: name, Note: req.Note, Detail: localUser()}
	r, err := store.New(cli, o.etcd.KeyPrefix()).PutRequest(tctx, req, rec, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "beatd %s %s: %s\n", op, term(name), termErr(o.etcd.Failure("queue the request", o.timeout, err)))
		return exitFail
	}
	outcome := "queued"
	if o.wait > 0 {
		if err := waitConsumed(ctx, cli, r.Key, o.wait); err != nil {
			fmt.Fprintf(stderr, "beatd %s %s: queued, but no leader acted within %s (is a beatd leader running? etcd at %s)\n", op, term(name), o.wait, term(o.etcd.Where()))
			return exitFail
		}
		outcome = "done"
	}
	o.print(stdout, op, name, r.ID, outcome)
	return 0
}

func (o *adminOptions) print(stdout io.Writer, op store.Op, name, id, outcome string) {
	if o.asJSON {
		_ = json.NewEncoder(stdout).Encode(map[string]string{"op": string(op), "entry": name, "request": id, "outcome": outcome})
	} else {
		fmt.Fprintf(stdout, "%s %s: %s\n", op, term(name), outcome)
	}
}

// etcdActor names, in the audit trail, a change written straight to
// etcd: whoever holds etcd credentials holds the schedule, so the record
// says so, with the etcd user when there is one.
func (o *adminOptions) etcdActor() string {
	if o.etcd.Username != "" {
		return "etcd:" + o.etcd.Username
	}
	return "etcd"
}

// localUser is who ran the CLI on which host, for the audit record of a
// change written straight to etcd (it has no token to name it).
func localUser() string {
	host, _ := os.Hostname()
	u := os.Getenv("USER")
	if u == "" {
		u = "?"
	}
	return "cli as " + u + "@" + host
}

// runHTTP sends trigger, pause or resume to beatd's API.
func (o *adminOptions) runHTTP(ctx context.Context, op store.Op, name string, stdout, stderr io.Writer) int {
	c, err := newAPIClient(o.server, o.tokenFile, o.serverCA)
	if err != nil {
		fmt.Fprintf(stderr, "beatd %s: %s\n", op, termErr(err))
		return exitFail
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	path := "/api/v1/entries/" + url.PathEscape(name) + "/" + string(op)
	if o.respectOverlap {
		path += "?respect_overlap=true"
	}
	body, _ := json.Marshal(map[string]string{"note": strings.TrimSpace(o.note)})
	var out struct {
		Request string `json:"request"`
	}
	if err := c.do(ctx, http.MethodPost, path, body, &out); err != nil {
		fmt.Fprintf(stderr, "beatd %s %s: %s\n", op, term(name), termErr(err))
		return exitFail
	}
	o.print(stdout, op, name, out.Request, "accepted")
	return 0
}

// runtimeEntries adds the entries API's entries of every shard of the
// cluster to file's config.
func runtimeEntries(ctx context.Context, cli *clientv3.Client, prefix string, file *config.Config) (*config.Config, error) {
	n, _, err := reshard.ReadCount(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	return sources.WithRuntimeEntries(ctx, cli, prefix, n, file)
}

// errUnknownEntry is an admin request for an entry the leader does not run.
var errUnknownEntry = errors.New("no such entry")

// checkEntry fails unless name is an entry of the config the leader
// published. Before any leader published one, the entry's state in etcd
// is proof enough that a leader has run it.
func checkEntry(ctx context.Context, cli *clientv3.Client, prefix, name string) error {
	cfg, h, err := catalog.Load(ctx, cli, prefix)
	if err == nil {
		// The catalog is the file; entries of the entries API are the
		// leader's too.
		if cfg, err = runtimeEntries(ctx, cli, prefix, cfg); err != nil {
			return err
		}
	}
	switch {
	case err == nil:
		if cfg.Entry(name) == nil {
			return fmt.Errorf("%w: %q is not in the leader's config (%s, %d entries, published by %s at %s)",
				errUnknownEntry, name, h.File, len(cfg.Entries), h.LeaderID, h.PublishedAt.Format(time.RFC3339))
		}
		return nil
	case errors.Is(err, catalog.ErrNone):
		st, gerr := store.New(cli, prefix).Get(ctx, name)
		if gerr != nil {
			return gerr
		}
		if st.LastSlot.IsZero() && st.Since.IsZero() && !st.Paused {
			return fmt.Errorf("%w: %q: no leader has published its config under prefix %s and etcd holds no state for it (is --prefix right? --no-check queues anyway)", errUnknownEntry, name, prefix)
		}
		return nil
	default:
		if ctx.Err() == nil {
			return fmt.Errorf("%w (--no-check queues the request without checking)", err)
		}
		return err
	}
}

// waitConsumed waits until the leader deletes the request key.
func waitConsumed(ctx context.Context, cli *clientv3.Client, key string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	for wr := range cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return os.ErrDeadlineExceeded
}

// statusBroker is how `beatd status` reaches the broker, where each
// entry's recent runs are kept.
type statusBroker struct {
	url, master, passFile, redisPrefix string
}

func (b *statusBroker) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.url, "broker", "", "Celery broker URL to read each entry's recent runs from Redis (default: ask the leader, which reads them)")
	fs.StringVar(&b.master, "broker-master-name", "", "Redis Sentinel master name")
	fs.StringVar(&b.passFile, "broker-password-file", "", "file holding the Redis password (else BEATD_BROKER_PASSWORD)")
	fs.StringVar(&b.redisPrefix, "redis-prefix", "", "prefix of beatd's own Redis keys (default beatd:{<prefix>}:)")
}

// fenceRaiser is how `beatd shards resize` fences the old count's shards
// on the broker (reshard.Options.RaiseFences): on Redis it raises their
// fences; on RabbitMQ it checks that no connection holds their locks (a
// replica reconnecting checks its term in etcd) and that every old
// shard's journal ends in a clean term (amqp.CheckResizable). close
// releases the client.
func (b *statusBroker) fenceRaiser(cluster string) (func(context.Context, int64, int, int) error, func(), error) {
	switch {
	case b.url == "":
		return nil, func() {}, errors.New("--broker is required: a resize fences the old shards on the broker, so that a replica paused through it cannot publish")
	}
	pass, err := etcdflags.Secret(b.passFile, "BEATD_BROKER_PASSWORD")
	if err != nil {
		return nil, func() {}, err
	}
	if amqpbroker.IsAMQPURL(b.url) {
		return func(_ context.Context, _ int64, from, to int) error {
			return amqpbroker.CheckResizable(b.url, pass, cluster, from, to)
		}, func() {}, nil
	}
	rdb, err := redisbroker.NewClient(redisbroker.BrokerConfig{URL: b.url, MasterName: b.master, Password: pass})
	if err != nil {
		return nil, func() {}, err
	}
	prefix := keys.RedisPrefix(b.redisPrefix, cluster)
	raise := func(ctx context.Context, floor int64, from, to int) error {
		return redisbroker.RaiseShardFences(ctx, rdb, prefix, []int{from, to}, floor)
	}
	return raise, func() { rdb.Close() }, nil
}

// history opens the run history of cluster; close releases it.
func (b *statusBroker) history(cluster string) (outcome.History, func(), error) {
	pass, err := etcdflags.Secret(b.passFile, "BEATD_BROKER_PASSWORD")
	if err != nil {
		return nil, func() {}, err
	}
	rdb, err := redisbroker.NewClient(redisbroker.BrokerConfig{URL: b.url, MasterName: b.master, Password: pass})
	if err != nil {
		return nil, func() {}, err
	}
	return redisbroker.New(rdb, redisbroker.Options{Cluster: cluster, KeyPrefix: keys.RedisPrefix(b.redisPrefix, cluster)}), func() { rdb.Close() }, nil
}
