package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// runDrill runs a drill of cfg (its fault kinds, or the broker's default
// set), wants each kind of want injected at least twice, and fails the
// test on any unexplained duplicate, missed slot or publish from a fenced
// term. A failing seed reproduces with BEATD_DRILL_SEED=N. The short
// drills run in make test; the long ones stay make targets.
func runDrill(t *testing.T, cfg LocalConfig, want []string) *Report {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a failover drill")
	}
	bin := testutil.BeatdBinary(t)
	seed := time.Now().UnixNano() % 1000
	if v, err := strconv.ParseInt(os.Getenv("BEATD_DRILL_SEED"), 10, 64); err == nil {
		seed = v
	}
	var log strings.Builder
	cfg.Binary, cfg.Replicas, cfg.Seed, cfg.MinEach, cfg.Dir, cfg.Log = bin, 3, seed, 2, t.TempDir(), &log
	rep, err := RunLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("drill (seed %d): %v\n%s", seed, err, log.String())
	}
	var sum strings.Builder
	rep.WriteSummary(&sum)
	t.Logf("seed %d\n%s%s", seed, log.String(), sum.String())
	counts := map[string]int{}
	for _, f := range rep.Faults {
		counts[f.Kind]++
	}
	for _, k := range want {
		if counts[k] < 2 {
			t.Errorf("fault %s injected %d times, want at least 2", k, counts[k])
		}
	}
	if !rep.OK {
		t.Fatalf("drill failed (seed %d): %d unexplained duplicates, %d missed, %d publishes from a fenced term",
			seed, len(rep.Duplicates), len(rep.Missed), rep.FencedPublishes)
	}
	return rep
}

// TestDrillSentinelCI is the short Sentinel drill of make test: Redis
// master failovers and kill -9s against Sentinel (its replicas reach
// Redis through Sentinel, with no proxy of their own to cut).
// BEATD_DRILL_SENTINEL=1 runs every kind (TestDrillSentinel).
func TestDrillSentinelCI(t *testing.T) {
	kinds := []string{FaultRedisFailover, FaultKill}
	runDrill(t, LocalConfig{Duration: 15 * time.Second, Sentinel: true, Faults: kinds}, kinds)
}

// TestDrillAMQPCI is the short RabbitMQ drill of make test: a kill -9,
// a RabbitMQ restart and a cut of the leader's broker path. make
// drill-amqp runs every kind for longer.
func TestDrillAMQPCI(t *testing.T) {
	kinds := []string{FaultKill, FaultRabbitRestart, FaultBrokerPartition}
	runDrill(t, LocalConfig{Duration: 15 * time.Second, Broker: BrokerAMQP, Faults: kinds}, kinds)
}
