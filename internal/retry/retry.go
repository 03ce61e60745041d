// Package retry is beatd's one backoff policy for operations retried until
// they succeed: etcd campaigns and loads, publishes to a broker that is
// down, state writes that etcd refuses, the catalog, the runtime entries'
// watch and the console's mirror.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// Backoff returns an exponential backoff from initial, doubling up to max,
// with ±20% jitter so replicas that failed together do not retry in step.
// Callers wait on their own (injected) clock, with Sleep; the policy only
// computes the intervals.
func Backoff(initial, max time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: initial, Multiplier: 2, MaxInterval: max, RandomizationFactor: 0.2}
}

// GRPCConnect is the same policy for a gRPC connection's redials (the
// etcd client's), which gRPC runs on its own. Its defaults grow to 120 s
// between attempts and give each handshake 20 s, so a replica cut off
// from etcd for a minute could take minutes more to see it back; here
// redials stay within max apart and a handshake that hangs (a black hole)
// is abandoned after handshake.
func GRPCConnect(initial, max, handshake time.Duration) grpc.ConnectParams {
	return grpc.ConnectParams{
		Backoff:           grpcbackoff.Config{BaseDelay: initial, Multiplier: 2, Jitter: 0.2, MaxDelay: max},
		MinConnectTimeout: handshake,
	}
}

// Sleep waits d on clock, or until ctx ends; it reports whether the wait
// ran out (false: ctx ended first).
func Sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) bool {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}
