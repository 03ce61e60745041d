package outcome

import (
	"context"
	"log/slog"
	"time"

	"github.com/beatd/beatd/internal/retry"
	"github.com/jonboulle/clockwork"
)

// What the event readers share, Redis pub/sub and RabbitMQ's celeryev
// exchange alike: a connection kept up with one backoff, and messages
// parsed into the feed.

// reconnect runs session until ctx ends, backing off after each error
// (lost says so) and starting over from the shortest wait once a session
// calls connected. attempt counts the sessions from 0.
func reconnect(ctx context.Context, clock clockwork.Clock, session func(attempt int, connected func()) error, lost func(error)) {
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for i := 0; ctx.Err() == nil; i++ {
		err := session(i, b.Reset)
		if ctx.Err() != nil {
			return
		}
		lost(err)
		if !retry.Sleep(ctx, clock, b.NextBackOff()) {
			return
		}
	}
}

// eventSink parses task event messages into a feed, reusing one buffer;
// it belongs to one reader's goroutine.
type eventSink struct {
	f   *Feed
	log *slog.Logger
	buf []Event
}

// deliver parses msg (where says where it came from, for the log) and
// passes its task events on as FromEvents.
func (s *eventSink) deliver(ctx context.Context, msg []byte, parse func([]byte, []Event) ([]Event, error), where ...any) {
	evs, err := parse(msg, s.buf[:0])
	if err != nil {
		s.log.Debug("unreadable task event", append(where, "err", err)...)
		return
	}
	s.buf = evs
	s.f.Deliver(ctx, FromEvents, evs)
}
