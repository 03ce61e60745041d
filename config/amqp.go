package config

import (
	"math"

	"github.com/beatd/beatd/celery"
	"gopkg.in/yaml.v3"
)

// AMQPConfig is the top-level amqp section: how the Celery workers declare
// their queues on RabbitMQ, so that beatd declares them the same way. A
// queue declared twice with different arguments is a PRECONDITION_FAILED
// error for whoever declares second (a worker crashes on it).
//
//	amqp:
//	  task_queue_max_priority: 10      # Celery's setting of the same name
//	  queues:
//	    reports:
//	      queue_arguments: {x-max-priority: 5, x-queue-mode: lazy}
//	      exchange: reports          # default: the queue's name
//	      routing_key: reports       # default: the queue's name
type AMQPConfig struct {
	// MaxPriority is task_queue_max_priority: x-max-priority on every
	// queue that does not set its own. Nil: none, as in a default app.
	MaxPriority *int
	// Queues are per-queue settings, by queue name.
	Queues map[string]AMQPQueue
}

// AMQPQueue is one queue's declaration, as Kombu's Queue(queue_arguments=...).
type AMQPQueue struct {
	Arguments *celery.Map // in the order written
	// Exchange and RoutingKey bind the queue, when the workers' task_queues
	// bind it otherwise than Celery's default (a direct exchange named
	// after the queue, routing key the queue's name).
	Exchange, RoutingKey string
}

// QueueArguments returns the arguments a Celery worker with this config
// declares queue with, in Kombu's order: the queue's own arguments, then
// x-max-priority from task_queue_max_priority when they lack one. Nil
// means none.
func (c AMQPConfig) QueueArguments(queue string) *celery.Map {
	var out *celery.Map
	if q, ok := c.Queues[queue]; ok && q.Arguments != nil && q.Arguments.Len() > 0 {
		out = &celery.Map{}
		for i, k := range q.Arguments.Keys {
			out.Set(k, q.Arguments.Values[i])
		}
	}
	if c.MaxPriority != nil {
		if out == nil {
			out = &celery.Map{}
		}
		if _, ok := out.Get("x-max-priority"); !ok {
			out.Set("x-max-priority", int64(*c.MaxPriority))
		}
	}
	return out
}

// QueueBinding returns the exchange and routing key queue is bound with;
// "" means the queue's own name, Celery's default.
func (c AMQPConfig) QueueBinding(queue string) (exchange, routingKey string) {
	q := c.Queues[queue]
	return q.Exchange, q.RoutingKey
}

var (
	amqpKeys      = []string{"task_queue_max_priority", "queues"}
	amqpQueueKeys = []string{"queue_arguments", "exchange", "routing_key"}
)

func (d *decoder) amqp(n *yaml.Node) AMQPConfig {
	var c AMQPConfig
	f := d.fields(n, "amqp", amqpKeys)
	if mp, ok := f.get("task_queue_max_priority"); ok {
		if p, ok := d.integer(mp.val, "amqp.task_queue_max_priority"); ok {
			if p < 1 || p > 255 {
				d.errorf(mp.val, "amqp.task_queue_max_priority must be between 1 and 255, got %d", p)
			} else {
				c.MaxPriority = &p
			}
		}
	}
	qs, ok := f.get("queues")
	if !ok {
		return c
	}
	qn := deref(qs.val)
	if qn.Kind != yaml.MappingNode {
		d.errorf(qn, "amqp.queues must be a mapping from queue name to its settings")
		return c
	}
	c.Queues = map[string]AMQPQueue{}
	for i := 0; i+1 < len(qn.Content); i += 2 {
		k, v := deref(qn.Content[i]), qn.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			d.errorf(k, "amqp.queues: a queue name must be a non-empty string")
			continue
		}
		if _, dup := c.Queues[k.Value]; dup {
			d.errorf(k, "amqp.queues: duplicate queue %q", k.Value)
			continue
		}
		var q AMQPQueue
		qf := d.fields(v, "amqp.queues."+k.Value, amqpQueueKeys)
		if a, ok := qf.get("queue_arguments"); ok {
			an := deref(a.val)
			if an.Kind != yaml.MappingNode {
				d.errorf(an, "amqp.queues.%s.queue_arguments must be a mapping", k.Value)
			} else if v, ok := d.value(an); ok {
				q.Arguments = v.(*celery.Map)
				d.amqpArgs(an, q.Arguments)
			}
		}
		for _, key := range []string{"exchange", "routing_key"} {
			if kf, ok := qf.get(key); ok {
				kn := deref(kf.val)
				if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" || kn.Value == "" {
					d.errorf(kn, "amqp.queues.%s.%s must be a non-empty string", k.Value, key)
					continue
				}
				if key == "exchange" {
					q.Exchange = kn.Value
				} else {
					q.RoutingKey = kn.Value
				}
			}
		}
		c.Queues[k.Value] = q
	}
	return c
}

// amqpArgs checks that queue arguments fit the AMQP table types py-amqp
// writes: an integer below -2^31+1 would be a signed 64-bit 'L', which
// the Go client cannot write.
func (d *decoder) amqpArgs(n *yaml.Node, m *celery.Map) {
	for i, v := range m.Values {
		if iv, ok := v.(int64); ok && iv < -math.MaxInt32 {
			d.errorf(n.Content[2*i+1], "queue argument %q: integers below %d are not supported on AMQP", m.Keys[i], -math.MaxInt32)
		}
		if m.Keys[i] == "x-max-priority" {
			if iv, ok := v.(int64); !ok || iv < 1 || iv > 255 {
				d.errorf(n.Content[2*i+1], "queue argument x-max-priority must be an integer between 1 and 255")
			}
		}
	}
}
