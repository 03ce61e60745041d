package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/publisher"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runStatus prints the leader and every entry's state, read from etcd, so
// it works from anywhere that reaches etcd.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	ef := etcdFlags{Prefix: "/beatd/default/"}
	ef.register(fs)
	config := fs.String("config", "", "schedule file, to show schedules and next run times")
	broker := fs.String("broker", "redis://127.0.0.1:6379/0", "Celery broker URL, to show each entry's recent runs (kept in Redis)")
	brokerMaster := fs.String("broker-master-name", "", "Redis Sentinel master name")
	brokerPassFile := fs.String("broker-password-file", "", "file holding the Redis password (else BEATD_BROKER_PASSWORD)")
	redisPrefix := fs.String("redis-prefix", "", "prefix of beatd's own Redis keys (default beatd:{<prefix>}:)")
	asJSON := fs.Bool("json", false, "print JSON, as GET /status")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	var cfg *schedule.Config
	if *config != "" {
		var err error
		if cfg, err = schedule.LoadFile(*config); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	cli, err := ef.client()
	if err != nil {
		fmt.Fprintln(stderr, "beatd status:", err)
		return 1
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if cfg, err = withRuntimeEntries(ctx, cli, ef.prefix(), cfg); err != nil {
		fmt.Fprintln(stderr, "beatd status:", err)
		return 1
	}
	var hist historyReader
	if pass, err := secret(*brokerPassFile, "BEATD_BROKER_PASSWORD"); err != nil {
		fmt.Fprintln(stderr, "beatd status:", err)
		return 1
	} else if rdb, err := publisher.NewClient(publisher.BrokerConfig{URL: *broker, MasterName: *brokerMaster, Password: pass}); err != nil {
		fmt.Fprintln(stderr, "beatd status: no run history:", err)
	} else {
		defer rdb.Close()
		cluster := strings.Trim(ef.prefix(), "/")
		hist = publisher.New(rdb, publisher.Options{Cluster: cluster, KeyPrefix: redisKeyPrefix(*redisPrefix, cluster)})
	}
	st, err := buildStatus(ctx, cli, ef.prefix(), cfg, hist, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "beatd status:", err)
		return 1
	}
	if st.HistoryError != "" {
		fmt.Fprintf(stderr, "beatd status: recent runs unavailable (%s): %s\n", publisher.Redacted(*broker), st.HistoryError)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return 0
	}
	if st.LeaderID == "" {
		fmt.Fprintln(stdout, "leader: none")
	} else {
		fmt.Fprintf(stdout, "leader: %s (fencing token %d)\n", st.LeaderID, st.FencingToken)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENTRY\tPAUSED\tRUNS\tLAST SLOT\tLAST RUN\tNEXT")
	for _, e := range st.Entries {
		fmt.Fprintf(tw, "%s\t%v\t%d\t%s\t%s\t%s\n", e.Name, e.Paused, e.TotalRunCount, fmtTime(e.LastSlot), fmtTime(e.LastRunAt), fmtTime(e.NextRunAt))
	}
	_ = tw.Flush()
	return 0
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// runAdmin returns the trigger, pause or resume command: it queues the
// request in etcd and waits until the leader has acted on it.
func runAdmin(op store.Op) func(context.Context, []string, io.Writer, io.Writer) int {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		fs := newFlagSet(string(op), stderr)
		ef := etcdFlags{Prefix: "/beatd/default/"}
		ef.register(fs)
		wait := fs.Duration("wait", 10*time.Second, "how long to wait for the leader to act (0: do not wait)")
		asJSON := fs.Bool("json", false, "print the outcome as JSON")
		fs.Usage = func() { fmt.Fprintf(stderr, "usage: beatd %s [flags] NAME\n", op); fs.PrintDefaults() }
		// Allow flags after the name, as people type them.
		var name string
		if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
			name, args = args[0], args[1:]
		}
		if err := parseFlags(fs, args); err != nil {
			return exitCode(err)
		}
		if name == "" && fs.NArg() == 1 {
			name = fs.Arg(0)
		}
		if name == "" {
			fs.Usage()
			return 2
		}
		cli, err := ef.client()
		if err != nil {
			fmt.Fprintf(stderr, "beatd %s: %v\n", op, err)
			return 1
		}
		defer cli.Close()
		r, err := store.New(cli, ef.prefix()).PutRequest(ctx, op, name, time.Now())
		if err != nil {
			fmt.Fprintf(stderr, "beatd %s: %v\n", op, err)
			return 1
		}
		outcome := "queued"
		if *wait > 0 {
			if err := waitConsumed(ctx, cli, r.Key, *wait); err != nil {
				fmt.Fprintf(stderr, "beatd %s %s: queued, but no leader acted within %s (is a beatd leader running?)\n", op, name, *wait)
				return 1
			}
			outcome = "done"
		}
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(map[string]string{"op": string(op), "entry": name, "request": r.ID, "outcome": outcome})
		} else {
			fmt.Fprintf(stdout, "%s %s: %s\n", op, name, outcome)
		}
		return 0
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
