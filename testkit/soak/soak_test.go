package soak

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// The long runs are opt-in flags (make soak, make bench-celery pass them
// after -args); without them only the unit tests and a short smoke run.
var (
	soakFlag     = flag.Bool("soak", false, "run the soak benchmark (TestSoak)")
	benchFlag    = flag.Bool("bench-celery", false, "run the side-by-side benchmark with celery beat (TestBenchCelery)")
	binFlag      = flag.String("beatd", "", "beatd binary to measure (default: build ./cmd/beatd into a temp dir)")
	entriesFlag  = flag.Int("entries", 1000, "soak: entries")
	intervalFlag = flag.Duration("interval", time.Second, "entries fire every interval")
	durFlag      = flag.Duration("duration", 10*time.Minute, "soak: run length")
	benchDurFlag = flag.Duration("bench-duration", 20*time.Second, "bench-celery: measured window per scheduler")
	sampleFlag   = flag.Duration("sample", 10*time.Second, "soak: sample period")
	windowFlag   = flag.Duration("growth-window", 5*time.Minute, "soak: tail of the run whose linear fit judges growth")
	etcdFlag     = flag.String("etcd", "embedded", "soak: embedded or external (the etcd binary)")
	steadyFlag   = flag.Duration("steady-after", time.Minute, "soak: start-up left out of the steady delivery figures")
	drainFlag    = flag.Duration("drain-every", 0, "soak: the consumer empties the queue once per period (default 0: continuously)")
	redisAOFFlag = flag.Bool("redis-aof", false, "soak: run Redis with appendonly yes, appendfsync everysec (default: no persistence)")
	outFlag      = flag.String("out", "", "JSON report path")
	extraFlag    = flag.String("extra", "", "extra arguments for beatd run, space-separated")
	keepFlag     = flag.Bool("keep", false, "keep the run directory (logs, data) even on success")
	warmupFlag   = flag.Duration("warmup", 5*time.Second, "bench-celery: warm-up after the first message")
	celeryFlag   = flag.Int("celery-entries", 1000, "bench-celery: celery beat's entries (0: measure beatd alone)")
	beatdNFlag   = flag.String("beatd-entries", "1000,20000", "bench-celery: beatd's entry counts, comma-separated")
	pythonFlag   = flag.String("python", "/usr/bin/python3", "bench-celery: the python with celery installed")
)

// signalContext ends on SIGINT or SIGTERM, so ctrl-C still stops every
// process the harness started.
func signalContext(t *testing.T) context.Context {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	t.Cleanup(stop)
	return ctx
}

// beatdBinary returns -beatd or builds one.
func beatdBinary(t *testing.T, ctx context.Context) string {
	if *binFlag != "" {
		abs, err := filepath.Abs(*binFlag)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(t.TempDir(), "beatd")
	if err := harness.BuildBeatd(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

func splitArgs(s string) []string { return strings.Fields(s) }

func TestSoak(t *testing.T) {
	if !*soakFlag {
		t.Skip("the soak is opt-in: make soak (or go test ./testkit/soak -run TestSoak -args -soak)")
	}
	ctx := signalContext(t)
	if *etcdFlag != "embedded" && *etcdFlag != "external" {
		t.Fatalf("-etcd %q: want embedded or external", *etcdFlag)
	}
	_, err := RunSoak(ctx, SoakConfig{Bin: beatdBinary(t, ctx), Entries: *entriesFlag, Interval: *intervalFlag,
		Duration: *durFlag, Sample: *sampleFlag, ExternalEtcd: *etcdFlag == "external", RedisAOF: *redisAOFFlag, SteadyAfter: *steadyFlag, DrainEvery: *drainFlag, Out: *outFlag,
		GrowthWindow: *windowFlag, DBLimit: DefaultDBLimit, RSSLimit: DefaultRSSLimit, BrokerLimit: DefaultBrokerLimit, KeysLimit: DefaultKeysLimit, Extra: splitArgs(*extraFlag),
		Keep: *keepFlag, Log: os.Stdout})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBenchCelery(t *testing.T) {
	if !*benchFlag {
		t.Skip("the side-by-side benchmark is opt-in: make bench-celery (or go test ./testkit/soak -run TestBenchCelery -args -bench-celery)")
	}
	ctx := signalContext(t)
	var counts []int
	for _, f := range strings.Split(*beatdNFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			t.Fatalf("-beatd-entries %q: want positive integers, comma-separated", *beatdNFlag)
		}
		counts = append(counts, n)
	}
	_, err := RunBench(ctx, BenchConfig{Bin: beatdBinary(t, ctx), Python: *pythonFlag, Duration: *benchDurFlag, Warmup: *warmupFlag,
		Interval: *intervalFlag, CeleryEntries: *celeryFlag, SkipCelery: *celeryFlag == 0, BeatdEntries: counts, Out: *outFlag,
		Extra: splitArgs(*extraFlag), Keep: *keepFlag, Log: os.Stdout})
	if err != nil {
		t.Fatal(err)
	}
}
