// Command beatd-drill runs failover drills against beatd and audits what
// they enqueued for exactly-once: `beatd-drill local` builds a cluster on
// loopback and injects faults, `beatd-drill audit` reads what a drill on
// your own cluster enqueued. It is a command of its own so that the beatd
// binary links none of the test kit the drills start servers with.
package main

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/flagenv"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/pflag"
)

// Exit codes, as beatd's: 1 a failed drill or audit, 2 a usage error.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: beatd-drill local [flags]   run a failover drill on loopback: replicas, etcd, a broker and faults
       beatd-drill audit [flags]   audit what a drill on your own cluster enqueued
Run a command with --help for its flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "local":
		return local(ctx, args[1:], stdout, stderr)
	case "audit":
		return audit(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "beatd-drill: unknown command %q\n%s", args[0], usage)
	return exitUsage
}

// parse parses a command's flags (and their BEATD_* variables); it says
// the exit code when the command should not run.
func parse(fs *pflag.FlagSet, args []string) (int, bool) {
	switch err := flagenv.Parse(fs, args); {
	case errors.Is(err, pflag.ErrHelp):
		return exitOK, false
	case err != nil:
		return exitUsage, false
	case fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return exitUsage, false
	}
	return 0, true
}

func local(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flagenv.New("drill local", stderr)
	bin := fs.String("beatd", "", "the beatd binary the replicas run (default: beatd beside this command, else on PATH)")
	replicas := fs.Int("replicas", 3, "beatd replicas")
	duration := fs.Duration("duration", 5*time.Minute, "how long faults are injected")
	seed := fs.Int64("seed", 0, "seed for fault kinds, targets and times (default: drawn from crypto/rand and printed only in the final report)")
	shards := fs.Int("shards", 0, "run the replicas with --shards N (2 to 16) and draw the sharded fault kinds too: "+strings.Join(chaos.ShardFaults, ","))
	faults := fs.String("faults", "", "fault kinds to inject (default: all of the broker's: "+strings.Join(chaos.AllFaults, ",")+"; with amqp "+chaos.FaultRabbitRestart+" in place of "+chaos.FaultRedisRestart+")")
	brokerKind := fs.String("broker", chaos.BrokerRedis, "the drill's broker: redis or amqp (a rabbitmq-server)")
	ttl := fs.Duration("lease-ttl", 2*time.Second, "the replicas' lease TTL")
	report := fs.String("report", "", "write the JSON report to this file")
	dir := fs.String("dir", "", "work directory (default: a temporary one)")
	minEach := fs.Int("min-each", 0, "keep going past --duration until each fault kind was injected this often")
	etcdDelay := fs.Duration("etcd-delay", 0, "etcd-slow: how late every etcd answer arrives (default 200–500 ms at random); the fault kind etcd-slow is chosen by name in --faults")
	sentinel := fs.Bool("sentinel", false, "run Redis as a master, a replica and 3 sentinels; adds the redis-failover fault")
	topology := fs.String("topology", chaos.TopologyExternal, "external: the replicas share a separate 3-member etcd; embedded: each replica hosts one member of their own etcd cluster")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	beatd, err := beatdBinary(*bin)
	if err != nil {
		fmt.Fprintln(stderr, "beatd-drill:", err)
		return exitUsage
	}
	var kinds []string
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
	}
	if *sentinel && *brokerKind != chaos.BrokerRedis {
		fmt.Fprintln(stderr, "beatd-drill: --sentinel runs Redis: it needs --broker redis")
		return exitUsage
	}
	// A seed nobody chose: the drill must hold for any, so none is shown
	// before the end (nothing to tune a run to); the report names it, so
	// a failing run reproduces.
	if !fs.Changed("seed") {
		*seed = randomSeed()
	}
	shown := "hidden until the report"
	if fs.Changed("seed") {
		shown = strconv.FormatInt(*seed, 10)
	}
	fmt.Fprintf(stdout, "drill: seed %s, %d replicas, %d shards, %s broker, %s topology, %s of faults: %s\n", shown, *replicas, max(*shards, 1), *brokerKind, *topology, *duration, *faults)
	rep, err := chaos.RunLocal(ctx, chaos.LocalConfig{Binary: beatd, Replicas: *replicas, Duration: *duration, Seed: *seed,
		Faults: kinds, LeaseTTL: *ttl, MinEach: *minEach, Dir: *dir, Log: stdout, Broker: *brokerKind, Sentinel: *sentinel, Topology: *topology,
		EtcdDelay: *etcdDelay, Shards: *shards})
	if err != nil {
		fmt.Fprintf(stderr, "beatd-drill: %v (seed %d)\n", err, *seed)
		return exitFail
	}
	return finish(rep, *report, stdout, stderr)
}

// randomSeed draws a positive seed from crypto/rand.
func randomSeed() int64 {
	var b [8]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		return time.Now().UnixNano() & math.MaxInt64 // crypto/rand never fails on Linux; a fallback all the same
	}
	return int64(binary.BigEndian.Uint64(b[:])&math.MaxInt64) | 1
}

// beatdBinary is --beatd, else the beatd beside this command (make build
// puts both in bin/), else the one on PATH.
func beatdBinary(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), "beatd"); isFile(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("beatd")
	if err != nil {
		return "", fmt.Errorf("no beatd binary beside this command or on PATH: build one (make build) or name it with --beatd")
	}
	return p, nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func audit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flagenv.New("drill audit", stderr)
	brokerURL := fs.String("broker", "redis://127.0.0.1:6379/0", "broker URL of the drill queue (on RabbitMQ, amqp://..., the queue is drained)")
	queue := fs.String("queue", "drill", "the queue the drill schedule publishes to")
	configFile := fs.String("config", "", "the drill schedule (required)")
	from := fs.String("from", "", "audit slots from this RFC 3339 time (required)")
	to := fs.String("to", "", "audit slots up to this RFC 3339 time (default: now minus 5s)")
	report := fs.String("report", "", "write the JSON report to this file")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline for reading the queue from the broker")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *configFile == "" || *from == "" {
		fmt.Fprintln(stderr, "beatd-drill audit: --config and --from are required")
		return exitUsage
	}
	cfg, err := config.LoadFile(*configFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFail
	}
	fromT, err := time.Parse(time.RFC3339Nano, *from)
	if err != nil {
		fmt.Fprintf(stderr, "beatd-drill audit: --from %q is not RFC 3339\n", *from)
		return exitUsage
	}
	toT := time.Now().Add(-5 * time.Second)
	if *to != "" {
		if toT, err = time.Parse(time.RFC3339Nano, *to); err != nil {
			fmt.Fprintf(stderr, "beatd-drill audit: --to %q is not RFC 3339\n", *to)
			return exitUsage
		}
	}
	if amqpbroker.IsAMQPURL(*brokerURL) {
		msgs, err := drainAMQP(*brokerURL, *queue)
		if err != nil {
			fmt.Fprintln(stderr, "beatd-drill audit:", err)
			return exitFail
		}
		rep := chaos.Audit(cfg, msgs, fromT, toT)
		if rep.FencedPublishes = len(chaos.FencedPublishes(msgs)); rep.FencedPublishes > 0 {
			rep.OK = false
		}
		return finish(rep, *report, stdout, stderr)
	}
	rdb, err := redisbroker.NewClient(redisbroker.BrokerConfig{URL: *brokerURL, Password: os.Getenv("BEATD_BROKER_PASSWORD")})
	if err != nil {
		fmt.Fprintln(stderr, "beatd-drill audit:", err)
		return exitFail
	}
	defer rdb.Close()
	tctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	msgs, err := chaos.ReadQueue(tctx, rdb, *queue)
	if err != nil {
		fmt.Fprintf(stderr, "beatd-drill audit: broker at %s (within %s): %s\n", broker.Redacted(*brokerURL), *timeout, err)
		return exitFail
	}
	return finish(chaos.Audit(cfg, msgs, fromT, toT), *report, stdout, stderr)
}

// finish prints the report's summary, writes it as JSON if asked, and
// says the exit code.
func finish(rep *chaos.Report, reportPath string, stdout, stderr io.Writer) int {
	rep.WriteSummary(stdout)
	if reportPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(reportPath, b, 0o644); err != nil {
			fmt.Fprintln(stderr, "beatd-drill:", err)
			return exitFail
		}
	}
	if !rep.OK {
		return exitFail
	}
	return exitOK
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
