// Package broker is what every broker tells the scheduler: the Result of
// each fire's publish and ErrStale when a newer leader holds the fence
// (the run a broker records of a publish is an outcome.Run). The
// transports are its subpackages: broker/redis, broker/amqp and
// broker/sqs.
package broker

import (
	"errors"
)

// Result is what a broker did with one fire.
type Result int8

// Results of a publish.
const (
	ResultError     Result = iota // not attempted, or the transport failed
	ResultOK                      // pushed
	ResultDuplicate               // the slot was already pushed: a no-op
	ResultStale                   // refused: a newer leader raised the fence
)

func (r Result) String() string {
	switch r {
	case ResultOK:
		return "ok"
	case ResultDuplicate:
		return "duplicate"
	case ResultStale:
		return "stale"
	}
	return "error"
}

// ErrStale means a leader with a larger fencing token has published: this
// replica is no longer the leader and must stop.
var ErrStale = errors.New("broker: stale fencing token")
