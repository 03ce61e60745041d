package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/tlsfiles"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Start-up probes: a setup that can never work (a wrong CA, a wrong
// password, an ACL user or etcd role without the permissions beatd needs,
// a Redis Cluster) fails `beatd run` at once with an error naming the
// server, instead of at the first fire or the first term. A server that
// is merely unreachable is logged and retried later, as at run time.

// probeBudget bounds each start-up probe.
const probeBudget = 10 * time.Second

// minReplicasUnset is --broker-min-replicas' default: ReplicasAuto for a
// Sentinel broker, else 0.
const minReplicasUnset = -2

// brokerMinReplicas resolves --broker-min-replicas for broker.
func brokerMinReplicas(flag int, broker string) (int, error) {
	switch {
	case flag == minReplicasUnset && strings.HasPrefix(strings.TrimSpace(broker), "sentinel://"):
		return redisbroker.ReplicasAuto, nil
	case flag == minReplicasUnset:
		return 0, nil
	case flag < 0:
		return 0, fmt.Errorf("--broker-min-replicas %d: want 0 or more", flag)
	}
	return flag, nil
}

// newShortfallCounter counts publish batches left pending because too few
// replicas acknowledged them.
func newShortfallCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_replica_shortfalls_total",
		Help: "Publish batches (or fence raises) that fewer than --broker-min-replicas replicas acknowledged within the timeout; their fires stay pending."})
}

// probeTasks compiles one entry per distinct queue and exchange, the keys
// the broker user must be allowed to write.
func probeTasks(cfg *config.Config, cluster, kombuPrefix string) []*celery.Task {
	var out []*celery.Task
	seen := map[string]bool{}
	for _, e := range cfg.Entries {
		o := e.Options
		prio := -1
		if o.Priority != nil {
			prio = *o.Priority
		}
		k := fmt.Sprintf("%s\x00%s\x00%d", o.Queue, o.Exchange, prio)
		if seen[k] || len(out) >= 100 {
			continue
		}
		seen[k] = true
		if t, err := celery.Compile(e.Spec(), cluster, "beatd@probe", kombuPrefix); err == nil {
			out = append(out, t)
		}
	}
	return out
}

// probeBroker runs the publisher's start-up check. The error names the
// broker with its password redacted.
func probeBroker(ctx context.Context, log *slog.Logger, pub *redisbroker.Publisher, brokerURL string, tasks []*celery.Task) error {
	ctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	err := pub.Check(ctx, tasks...)
	if err == nil {
		want := pub.MinReplicas(ctx)
		log.Info("broker check passed", "broker", broker.Redacted(brokerURL), "min_replicas", want)
		// An explicit --broker-min-replicas above what the master has
		// stalls every publish until replicas join: say so now.
		if n, cerr := pub.OnlineReplicas(ctx); cerr == nil && n < want {
			log.Warn("the broker master has fewer online replicas than --broker-min-replicas; publishes stay pending until enough replicas follow it",
				"broker", broker.Redacted(brokerURL), "online_replicas", n, "min_replicas", want)
		}
		return nil
	}
	if redisbroker.IsUnreachable(err) {
		log.Warn("broker unreachable at start-up; publishing retries until it answers",
			"broker", broker.Redacted(brokerURL), "err", err)
		return nil
	}
	return fmt.Errorf("broker %s: start-up check failed: %w", broker.Redacted(brokerURL), err)
}

// errEtcdUnreachable is an etcd that did not answer probeEtcd: beatd
// waits for it (waitEtcd).
var errEtcdUnreachable = errors.New("etcd: unreachable")

// probeEtcd reads the cluster's prefix and makes a guarded write on it
// whose guard can never hold, so nothing is written: etcd checks the
// permissions of every operation in a transaction, run or not. A role
// without readwrite on the prefix fails here. An etcd that does not
// answer within budget is an error wrapping errEtcdUnreachable; any
// other error is a refusal that retrying cannot fix.
func probeEtcd(ctx context.Context, cli *clientv3.Client, f *etcdflags.Flags, budget time.Duration) error {
	prefix, endpoints := f.KeyPrefix(), f.Endpoints
	// gRPC retries a failed TLS handshake until the deadline and reports
	// only that; a handshake of our own tells a refused certificate from a
	// server that is down, at once.
	if tc, err := f.TLSConfig(); err == nil && tc != nil {
		for _, ep := range f.EndpointURLs() {
			if err := tlsHandshake(ep, tc); err != nil {
				return fmt.Errorf("etcd %s: start-up check failed: TLS handshake with %s: %w", endpoints, ep, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	err := func() error {
		if _, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			return fmt.Errorf("read %s*: %w", prefix, err)
		}
		probe := keys.Probe(prefix)
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(probe), "=", -1)).
			Then(clientv3.OpPut(probe, "")).Else(clientv3.OpGet(probe)).Commit()
		if err != nil {
			return fmt.Errorf("guarded write on %s: %w", prefix, err)
		}
		return nil
	}()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrPermissionDenied) || strings.Contains(err.Error(), rpctypes.ErrPermissionDenied.Error()):
		return fmt.Errorf("etcd %s: start-up check failed: %w (the user or client certificate needs a role with readwrite on the prefix %s: see docs/operations.md)",
			endpoints, err, prefix)
	case etcdFatal(err):
		return fmt.Errorf("etcd %s: start-up check failed: %w", endpoints, err)
	}
	return fmt.Errorf("%w: %w", errEtcdUnreachable, err)
}

// etcdFatal reports whether err is a refusal that retrying cannot fix.
func etcdFatal(err error) bool {
	for _, e := range []error{rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty,
		rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthNotEnabled, rpctypes.ErrUserNotFound} {
		if errors.Is(err, e) || strings.Contains(err.Error(), e.Error()) {
			return true
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:") || strings.Contains(msg, "certificate")
}

// tlsHandshake is tlsfiles.RefusedHandshake for an etcd endpoint URL.
// gRPC's server speaks first (its SETTINGS frame), so an accepted
// handshake returns at once.
func tlsHandshake(endpoint string, tc *tls.Config) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil
	}
	tc = tc.Clone()
	tc.ServerName = u.Hostname()
	tc.NextProtos = []string{"h2"}
	return tlsfiles.RefusedHandshake(u.Host, tc, time.Second)
}
