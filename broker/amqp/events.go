package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/outcome"
	"github.com/jonboulle/clockwork"
	amqp "github.com/rabbitmq/amqp091-go"
)

// eventExchange is Celery's event exchange on RabbitMQ: a durable topic
// exchange, declared exactly as Celery declares it so either side may
// create it first.
const eventExchange = "celeryev"

// eventQueueTTL bounds how long beatd's event queue outlives its
// consumer (and how long its unread events are kept), like the event
// receivers of Celery's own monitors.
const eventQueueTTL = 60 * time.Second

// EventsConfig says where RunEvents reads task events.
type EventsConfig struct {
	URL, Password string // the broker, as for NewAMQP
	Name          string // the queue and connection name's suffix (the replica)
	Clock         clockwork.Clock
	Logger        *slog.Logger
}

// RunEvents feeds f with the task events Celery's workers (-E) publish
// on RabbitMQ, from a queue of its own bound to task.#, until ctx ends;
// it reconnects after errors.
func RunEvents(ctx context.Context, c EventsConfig, f *outcome.Feed) error {
	urls, err := ParseAMQPURLs(c.URL, c.Password)
	if err != nil {
		return err
	}
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for i := 0; ctx.Err() == nil; i++ {
		err := consumeEvents(ctx, urls[i%len(urls)], c, f, b.Reset)
		if ctx.Err() != nil {
			return nil
		}
		c.Logger.Warn("task events from RabbitMQ lost; reconnecting", "err", err)
		if !retry.Sleep(ctx, c.Clock, b.NextBackOff()) {
			return nil
		}
	}
	return nil
}

func consumeEvents(ctx context.Context, u AMQPURL, c EventsConfig, f *outcome.Feed, consuming func()) error {
	conn, err := u.Dial("beatd events "+c.Name, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(eventExchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", eventExchange, err)
	}
	q, err := ch.QueueDeclare("beatd.events."+c.Name, false, true, true, false,
		amqp.Table{"x-message-ttl": int32(eventQueueTTL / time.Millisecond), "x-expires": int32(eventQueueTTL / time.Millisecond)})
	if err != nil {
		return fmt.Errorf("declare the event queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "task.#", eventExchange, false, nil); err != nil {
		return fmt.Errorf("bind the event queue: %w", err)
	}
	msgs, err := ch.ConsumeWithContext(ctx, q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume events: %w", err)
	}
	consuming()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	var buf []outcome.Event
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			if e == nil {
				return errors.New("connection closed")
			}
			return e
		case m, ok := <-msgs:
			if !ok {
				return errors.New("event consumer cancelled")
			}
			evs, err := outcome.ParseEventBody(m.Body, buf[:0])
			if err != nil {
				c.Logger.Debug("unreadable task event", "routing_key", m.RoutingKey, "err", err)
				continue
			}
			buf = evs
			f.Deliver(ctx, outcome.FromEvents, evs)
		}
	}
}
