package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/publisher"
	"github.com/beatd/beatd/schedule"
)

// runDrill is `beatd drill local` and `beatd drill audit`.
func runDrill(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "local" && args[0] != "audit") {
		fmt.Fprintln(stderr, "usage: beatd drill local [flags]   run a failover drill on loopback\n       beatd drill audit [flags]   audit what a drill on your own cluster enqueued")
		return 2
	}
	if args[0] == "local" {
		return drillLocal(ctx, args[1:], stdout, stderr)
	}
	return drillAudit(ctx, args[1:], stdout, stderr)
}

func drillLocal(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("drill local", stderr)
	replicas := fs.Int("replicas", 3, "beatd replicas")
	duration := fs.Duration("duration", 5*time.Minute, "how long faults are injected")
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000, "seed for fault kinds and times")
	faults := fs.String("faults", strings.Join(chaos.AllFaults, ","), "fault kinds to inject")
	ttl := fs.Duration("lease-ttl", 2*time.Second, "the replicas' lease TTL")
	report := fs.String("report", "", "write the JSON report to this file")
	dir := fs.String("dir", "", "work directory (default: a temporary one)")
	minEach := fs.Int("min-each", 0, "keep going past --duration until each fault kind was injected this often")
	topology := fs.String("topology", chaos.TopologyExternal, "external: the replicas share a separate 3-member etcd; embedded: each replica hosts one member of their own etcd cluster")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	bin, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "beatd drill:", err)
		return 1
	}
	fmt.Fprintf(stdout, "drill: seed %d, %d replicas, %s topology, %s of faults: %s\n", *seed, *replicas, *topology, *duration, *faults)
	rep, err := chaos.RunLocal(ctx, chaos.LocalConfig{Binary: bin, Replicas: *replicas, Duration: *duration, Seed: *seed,
		Faults: strings.Split(*faults, ","), LeaseTTL: *ttl, MinEach: *minEach, Dir: *dir, Log: stdout, Topology: *topology})
	if err != nil {
		fmt.Fprintln(stderr, "beatd drill:", err)
		return 1
	}
	return finishDrill(rep, *report, stdout, stderr)
}

func drillAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("drill audit", stderr)
	broker := fs.String("broker", "redis://127.0.0.1:6379/0", "broker URL of the drill queue")
	queue := fs.String("queue", "drill", "the queue the drill schedule publishes to")
	config := fs.String("config", "", "the drill schedule (required)")
	from := fs.String("from", "", "audit slots from this RFC 3339 time (required)")
	to := fs.String("to", "", "audit slots up to this RFC 3339 time (default: now minus 5s)")
	report := fs.String("report", "", "write the JSON report to this file")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	if *config == "" || *from == "" {
		fmt.Fprintln(stderr, "beatd drill audit: --config and --from are required")
		return 2
	}
	cfg, err := schedule.LoadFile(*config)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fromT, err := time.Parse(time.RFC3339Nano, *from)
	if err != nil {
		fmt.Fprintf(stderr, "beatd drill audit: --from %q is not RFC 3339\n", *from)
		return 2
	}
	toT := time.Now().Add(-5 * time.Second)
	if *to != "" {
		if toT, err = time.Parse(time.RFC3339Nano, *to); err != nil {
			fmt.Fprintf(stderr, "beatd drill audit: --to %q is not RFC 3339\n", *to)
			return 2
		}
	}
	rdb, err := publisher.NewClient(publisher.BrokerConfig{URL: *broker, Password: os.Getenv("BEATD_BROKER_PASSWORD")})
	if err != nil {
		fmt.Fprintln(stderr, "beatd drill audit:", err)
		return 1
	}
	defer rdb.Close()
	msgs, err := chaos.ReadQueue(ctx, rdb, *queue)
	if err != nil {
		fmt.Fprintln(stderr, "beatd drill audit:", err)
		return 1
	}
	return finishDrill(chaos.Audit(cfg, msgs, fromT, toT), *report, stdout, stderr)
}

func finishDrill(rep *chaos.Report, reportPath string, stdout, stderr io.Writer) int {
	rep.WriteSummary(stdout)
	if reportPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(reportPath, b, 0o644); err != nil {
			fmt.Fprintln(stderr, "beatd drill:", err)
			return 1
		}
	}
	if !rep.OK {
		return 1
	}
	return 0
}
