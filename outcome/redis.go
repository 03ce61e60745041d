package outcome

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
)

// EventsPattern is the channel pattern Kombu's Redis transport publishes
// Celery's events on, for broker database db: the celeryev fanout
// exchange with Kombu's default fanout_prefix and fanout_patterns, e.g.
// /0.celeryev/task.multi.
func EventsPattern(db int) string { return fmt.Sprintf("/%d.celeryev/task.*", db) }

// ResultKeyPrefix is Celery's key prefix for task results in a key-value
// result backend; the Redis backend also publishes each result on a
// channel of the same name.
const ResultKeyPrefix = "celery-task-meta-"

// RunRedisEvents feeds f with the task events published on a Redis
// broker (database db) until ctx ends, resubscribing after errors.
func RunRedisEvents(ctx context.Context, rdb redis.UniversalClient, db int, f *Feed, log *slog.Logger) {
	sink := eventSink{f: f, log: log}
	subscribe(ctx, rdb, EventsPattern(db), f.h.clock, log, "task events", func(m *redis.Message) {
		sink.deliver(ctx, []byte(m.Payload), ParseRedisEvent, "channel", m.Channel)
	}, nil)
}

// ResultPoll is how often the result backend is read for runs that have
// been unfinished for that long: its notifications only reach a
// subscriber that was listening, so a result stored during a failover,
// or while the connection was down, is found by the read.
const ResultPoll = 10 * time.Second

// RunRedisResults feeds f from a Redis result backend until ctx ends:
// from the notification Celery publishes with each result, and, every
// ResultPoll, from the stored results of runs unfinished for longer.
func RunRedisResults(ctx context.Context, rdb redis.UniversalClient, f *Feed, log *slog.Logger) {
	poll := func(ctx context.Context) {
		ids := f.WatchedSince(f.h.clock.Now().Add(-ResultPoll), nil)
		for len(ids) > 0 {
			n := min(len(ids), 1000)
			keys := make([]string, n)
			for i, id := range ids[:n] {
				keys[i] = ResultKeyPrefix + id
			}
			ids = ids[n:]
			vals, err := rdb.MGet(ctx, keys...).Result()
			if err != nil {
				log.Warn("result backend read failed", "err", err)
				return
			}
			var evs []Event
			for _, v := range vals {
				s, ok := v.(string)
				if !ok {
					continue
				}
				if ev, ok, err := ParseResult([]byte(s)); err == nil && ok {
					evs = append(evs, ev)
				}
			}
			f.Deliver(ctx, FromResults, evs)
		}
	}
	subscribe(ctx, rdb, ResultKeyPrefix+"*", f.h.clock, log, "result backend", func(m *redis.Message) {
		ev, ok, err := ParseResult([]byte(m.Payload))
		if err != nil || !ok {
			return
		}
		if ev.TaskID == "" {
			ev.TaskID = strings.TrimPrefix(m.Channel, ResultKeyPrefix)
		}
		f.Deliver(ctx, FromResults, []Event{ev})
	}, poll)
}

// subscribe reads pattern's messages into handle until ctx ends. With
// tick, it also calls tick every ResultPoll and once after each
// (re)subscription. Messages are handled on the caller's goroutine, one
// at a time.
func subscribe(ctx context.Context, rdb redis.UniversalClient, pattern string, clock clockwork.Clock, log *slog.Logger, what string,
	handle func(*redis.Message), tick func(context.Context)) {
	reconnect(ctx, clock, func(_ int, subscribed func()) error {
		return listen(ctx, rdb, pattern, clock, handle, tick, subscribed)
	}, func(err error) {
		log.Warn("outcome subscription lost; resubscribing", "source", what, "pattern", pattern, "err", err)
	})
}

func listen(ctx context.Context, rdb redis.UniversalClient, pattern string, clock clockwork.Clock,
	handle func(*redis.Message), tick func(context.Context), subscribed func()) error {
	ps := rdb.PSubscribe(ctx, pattern)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		return err
	}
	subscribed()
	// The ticker also pings: a subscriber only reads, so without it a
	// connection that died silently would look like a quiet channel.
	t := clock.NewTicker(ResultPoll)
	defer t.Stop()
	if tick != nil {
		tick(ctx)
	}
	msgs := make(chan any)
	errc := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			m, err := ps.Receive(rctx)
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-rctx.Done():
				errc <- rctx.Err()
				return
			}
		}
	}()
	defer func() { cancel(); _ = ps.Close(); <-errc }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			errc <- err // for the deferred drain
			return err
		case <-t.Chan():
			if err := ps.Ping(ctx); err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			if tick != nil {
				tick(ctx)
			}
		case m := <-msgs:
			switch m := m.(type) {
			case *redis.Message:
				handle(m)
			case *redis.Pong, *redis.Subscription:
			default:
				return errors.New("unexpected pubsub reply")
			}
		}
	}
}
