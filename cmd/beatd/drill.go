package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/internal/flagenv"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
)

// drillCommand is `beatd drill local` and `beatd drill audit`.
func drillCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "failover drills with an exactly-once audit (local, audit)",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	cmd.AddCommand(drillLocalCommand(ctx, stdout, stderr), drillAuditCommand(ctx, stdout, stderr))
	return cmd
}

func drillLocalCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	fs := flagenv.New("drill local", stderr)
	replicas := fs.Int("replicas", 3, "beatd replicas")
	duration := fs.Duration("duration", 5*time.Minute, "how long faults are injected")
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000, "seed for fault kinds and times")
	faults := fs.String("faults", "", "fault kinds to inject (default: all of the broker's: "+strings.Join(chaos.AllFaults, ",")+"; with amqp "+chaos.FaultRabbitRestart+" in place of "+chaos.FaultRedisRestart+")")
	brokerKind := fs.String("broker", chaos.BrokerRedis, "the drill's broker: redis or amqp (a rabbitmq-server)")
	ttl := fs.Duration("lease-ttl", 2*time.Second, "the replicas' lease TTL")
	report := fs.String("report", "", "write the JSON report to this file")
	dir := fs.String("dir", "", "work directory (default: a temporary one)")
	minEach := fs.Int("min-each", 0, "keep going past --duration until each fault kind was injected this often")
	etcdDelay := fs.Duration("etcd-delay", 0, "etcd-slow: how late every etcd answer arrives (default 200–500 ms at random); the fault kind etcd-slow is chosen by name in --faults")
	sentinel := fs.Bool("sentinel", false, "run Redis as a master, a replica and 3 sentinels; adds the redis-failover fault")
	topology := fs.String("topology", chaos.TopologyExternal, "external: the replicas share a separate 3-member etcd; embedded: each replica hosts one member of their own etcd cluster")
	cmd := &cobra.Command{
		Use:   "local",
		Short: "run a failover drill on loopback: replicas, etcd, Redis and faults",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			bin, err := os.Executable()
			if err != nil {
				fmt.Fprintln(stderr, "beatd drill:", termErr(err))
				return exitError(exitFail)
			}
			var kinds []string
			if *faults != "" {
				kinds = strings.Split(*faults, ",")
			}
			if *sentinel && *brokerKind != chaos.BrokerRedis {
				fmt.Fprintln(stderr, "beatd drill: --sentinel runs Redis: it needs --broker redis")
				return exitError(exitUsage)
			}
			fmt.Fprintf(stdout, "drill: seed %d, %d replicas, %s broker, %s topology, %s of faults: %s\n", *seed, *replicas, *brokerKind, *topology, *duration, *faults)
			rep, err := chaos.RunLocal(ctx, chaos.LocalConfig{Binary: bin, Replicas: *replicas, Duration: *duration, Seed: *seed,
				Faults: kinds, LeaseTTL: *ttl, MinEach: *minEach, Dir: *dir, Log: stdout, Broker: *brokerKind, Sentinel: *sentinel, Topology: *topology,
				EtcdDelay: *etcdDelay})
			if err != nil {
				fmt.Fprintln(stderr, "beatd drill:", termErr(err))
				return exitError(exitFail)
			}
			return codeErr(finishDrill(rep, *report, stdout, stderr))
		},
	}
	commandFlags(cmd, fs)
	return cmd
}

func drillAuditCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	fs := flagenv.New("drill audit", stderr)
	brokerKind := fs.String("broker", "redis://127.0.0.1:6379/0", "broker URL of the drill queue (on RabbitMQ, amqp://..., the queue is drained)")
	queue := fs.String("queue", "drill", "the queue the drill schedule publishes to")
	configFile := fs.String("config", "", "the drill schedule (required)")
	from := fs.String("from", "", "audit slots from this RFC 3339 time (required)")
	to := fs.String("to", "", "audit slots up to this RFC 3339 time (default: now minus 5s)")
	report := fs.String("report", "", "write the JSON report to this file")
	timeout := fs.Duration("timeout", defaultTimeout, "deadline for reading the queue from the broker")
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "audit what a drill on your own cluster enqueued",
		Args:  usageArgs(cobra.NoArgs),
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		if *configFile == "" || *from == "" {
			return usageError{c, fmt.Errorf("--config and --from are required")}
		}
		cfg, err := config.LoadFile(*configFile)
		if err != nil {
			fmt.Fprintln(stderr, termErr(err))
			return exitError(exitFail)
		}
		fromT, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			return usageError{c, fmt.Errorf("--from %q is not RFC 3339", *from)}
		}
		toT := time.Now().Add(-5 * time.Second)
		if *to != "" {
			if toT, err = time.Parse(time.RFC3339Nano, *to); err != nil {
				return usageError{c, fmt.Errorf("--to %q is not RFC 3339", *to)}
			}
		}
		if amqpbroker.IsAMQPURL(*brokerKind) {
			msgs, err := drainAMQP(*brokerKind, *queue)
			if err != nil {
				fmt.Fprintln(stderr, "beatd drill audit:", termErr(err))
				return exitError(exitFail)
			}
			rep := chaos.Audit(cfg, msgs, fromT, toT)
			if rep.FencedPublishes = len(chaos.FencedPublishes(msgs)); rep.FencedPublishes > 0 {
				rep.OK = false
			}
			return codeErr(finishDrill(rep, *report, stdout, stderr))
		}
		rdb, err := redisbroker.NewClient(redisbroker.BrokerConfig{URL: *brokerKind, Password: os.Getenv("BEATD_BROKER_PASSWORD")})
		if err != nil {
			fmt.Fprintln(stderr, "beatd drill audit:", termErr(err))
			return exitError(exitFail)
		}
		defer rdb.Close()
		tctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		msgs, err := chaos.ReadQueue(tctx, rdb, *queue)
		if err != nil {
			fmt.Fprintf(stderr, "beatd drill audit: broker at %s (within %s): %s\n", broker.Redacted(*brokerKind), *timeout, termErr(err))
			return exitError(exitFail)
		}
		return codeErr(finishDrill(chaos.Audit(cfg, msgs, fromT, toT), *report, stdout, stderr))
	}
	commandFlags(cmd, fs)
	return cmd
}

func finishDrill(rep *chaos.Report, reportPath string, stdout, stderr io.Writer) int {
	rep.WriteSummary(stdout)
	if reportPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(reportPath, b, 0o644); err != nil {
			fmt.Fprintln(stderr, "beatd drill:", termErr(err))
			return 1
		}
	}
	if !rep.OK {
		return 1
	}
	return 0
}

// drainAMQP takes every message out of queue on the RabbitMQ at rawURL, in
// queue order.
func drainAMQP(rawURL, queue string) ([]chaos.Message, error) {
	urls, err := amqpbroker.ParseAMQPURLs(rawURL, os.Getenv("BEATD_BROKER_PASSWORD"))
	if err != nil {
		return nil, err
	}
	u := urls[0]
	uri := amqp.URI{Scheme: "amqp", Host: u.Host, Port: u.Port, Username: u.User, Password: u.Password, Vhost: u.VHost}
	cfg := amqp.Config{Dial: amqp.DefaultDial(u.ConnectTimeout), Vhost: u.VHost, TLSClientConfig: u.TLS}
	if u.TLS != nil {
		uri.Scheme = "amqps"
	}
	conn, err := amqp.DialConfig(uri.String(), cfg)
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ %s: %w", u, err)
	}
	defer conn.Close()
	return chaos.ReadQueueAMQP(conn, queue)
}
