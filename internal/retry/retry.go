// Package retry is beatd's one backoff policy for operations retried until
// they succeed: etcd campaigns and loads, publishes to a broker that is
// down, state writes that etcd refuses.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff returns an exponential backoff from initial, doubling up to max,
// with ±20% jitter so replicas that failed together do not retry in step.
// Callers wait on their own (injected) clock; the policy only computes the
// intervals.
func Backoff(initial, max time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: initial, Multiplier: 2, MaxInterval: max, RandomizationFactor: 0.2}
}
