package daemon

import (
	"context"
	"fmt"
	"os"
	"time"

	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/outcome"
	"github.com/redis/go-redis/v9"
)

// outcomeFlags choose where beatd learns what its runs did.
type outcomeFlags struct {
	// ResultBackend is Celery's result backend (the same URL forms as
	// --broker, Redis only), read for runs the events did not report.
	ResultBackend string
	// TaskEvents reads the workers' task events from the broker.
	TaskEvents bool
	// Silence is how long without any report before status and the log
	// say no outcome source is seen.
	Silence time.Duration
	// SendSentEvents publishes task-sent events, as a Celery producer with
	// task_send_sent_event does.
	SendSentEvents bool
}

// sentEventsFrom is the hostname beatd's task-sent events carry, or ""
// without --send-task-events.
func (m *Main) sentEventsFrom() string {
	if !m.Outcomes.SendSentEvents {
		return ""
	}
	host, _ := os.Hostname()
	return "beatd@" + host
}

// DefaultOutcomeSilence is --outcome-silence's default.
const DefaultOutcomeSilence = 10 * time.Minute

// feedBuffer is how many reports wait for the leader's loop while it
// publishes a burst: 20k entries' worth of a burst's received events.
const feedBuffer = 16384

// startOutcomes starts the consumers that feed m.feed, on every replica:
// a standby that becomes leader then has its subscriptions already.
func (m *Main) startOutcomes(ctx context.Context) error {
	switch {
	case !m.Outcomes.TaskEvents:
	case m.rdb != nil:
		db := clientDB(m.rdb)
		m.wg.Go(func() { outcome.RunRedisEvents(ctx, m.rdb, db, m.feed, m.log) })
	case amqpbroker.IsAMQPURL(m.Broker):
		dial, err := amqpbroker.EventsDialer(m.Broker, m.brokerPass, m.ID)
		if err != nil {
			m.log.Error("task events from RabbitMQ", "err", err)
			break
		}
		cfg := outcome.AMQPEvents{Dial: dial, Name: m.ID, Logger: m.log}
		m.wg.Go(func() { outcome.RunAMQPEvents(ctx, cfg, m.feed) })
	}
	if m.Outcomes.ResultBackend != "" {
		rb, err := redisbroker.NewClient(redisbroker.BrokerConfig{URL: m.Outcomes.ResultBackend})
		if err != nil {
			return fmt.Errorf("--result-backend: %w", err)
		}
		m.resultsRDB = rb
		m.wg.Go(func() { outcome.RunRedisResults(ctx, rb, m.feed, m.log) })
	}
	m.wg.Go(func() { m.warnSilence(ctx) })
	return nil
}

// clientDB is the database a Redis client uses (a cluster has only 0).
func clientDB(rdb redis.UniversalClient) int {
	if c, ok := rdb.(*redis.Client); ok {
		return c.Options().DB
	}
	return 0
}

// outcomeWarning says why no outcome is known, or "" while reports come.
func outcomeWarning(f *outcome.Feed, flags outcomeFlags, started, now time.Time) string {
	silence := flags.Silence
	if silence <= 0 {
		silence = DefaultOutcomeSilence
	}
	last := f.LastAnyReport()
	if last.IsZero() {
		last = started
	}
	if now.Sub(last) < silence {
		return ""
	}
	var sources string
	switch {
	case !flags.TaskEvents && flags.ResultBackend == "":
		return "no outcome source: run outcomes, overlap and pause_after_failures need task events (start the workers with -E) or --result-backend"
	case flags.ResultBackend == "":
		sources = "task events"
	case !flags.TaskEvents:
		sources = "result backend reports"
	default:
		sources = "task events or result backend reports"
	}
	return fmt.Sprintf("no %s in %s: start the workers with -E or set --result-backend", sources, roundDuration(silence))
}

func roundDuration(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", int(d/time.Minute))
	}
	return d.String()
}

// warnSilence logs, once per silence, that no outcome source reports.
func (m *Main) warnSilence(ctx context.Context) {
	silence := m.Outcomes.Silence
	if silence <= 0 {
		silence = DefaultOutcomeSilence
	}
	t := m.clock.NewTicker(min(silence/2, 15*time.Second))
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		w := outcomeWarning(m.feed, m.Outcomes, m.started, m.clock.Now())
		switch {
		case w != "" && !warned:
			m.log.Warn(w)
		case w == "" && warned:
			m.log.Info("run outcomes reported again")
		}
		warned = w != ""
	}
}
