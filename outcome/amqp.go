package outcome

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

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

// AMQPEvents says where RunAMQPEvents reads task events.
type AMQPEvents struct {
	// Dial connects to the broker for the attempt'th time (from 0), so
	// a failover list is tried in turn: broker/amqp's EventsDialer knows
	// Celery's broker URLs, TLS and heartbeats.
	Dial   func(attempt int) (*amqp.Connection, error)
	Name   string // the queue name's suffix (the replica)
	Logger *slog.Logger
}

// RunAMQPEvents feeds f with the task events Celery's workers (-E)
// publish on RabbitMQ, from a queue of its own bound to task.#, until ctx
// ends; it reconnects after errors.
func RunAMQPEvents(ctx context.Context, c AMQPEvents, f *Feed) {
	sink := eventSink{f: f, log: c.Logger}
	reconnect(ctx, f.h.clock, func(attempt int, connected func()) error {
		return consumeAMQPEvents(ctx, c, attempt, &sink, connected)
	}, func(err error) {
		c.Logger.Warn("task events from RabbitMQ lost; reconnecting", "err", err)
	})
}

func consumeAMQPEvents(ctx context.Context, c AMQPEvents, attempt int, sink *eventSink, consuming func()) error {
	conn, err := c.Dial(attempt)
	if err != nil {
		return err
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
			// The AMQP transport's body is the event itself: no envelope.
			sink.deliver(ctx, m.Body, ParseEventBody, "routing_key", m.RoutingKey)
		}
	}
}
