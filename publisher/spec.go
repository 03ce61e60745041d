package publisher

import (
	"github.com/beatd/beatd/internal/celery"
)

// Spec is what a task's messages say: the task, its arguments and Celery's
// send options. It is the publisher's own description, so how entries are
// written (schedules.yaml, the API, django-celery-beat) stays out of this
// package; the scheduler builds one per entry.
type Spec struct {
	Name    string // the entry: it namespaces task ids
	Task    string
	Args    []any
	Kwargs  *celery.Map
	Options celery.SendOptions
}

// Queues says how the workers declare each queue (on RabbitMQ), so beatd
// declares it identically: a declaration that differs is refused.
type Queues interface {
	// QueueArguments are the queue's x-arguments in Kombu's order; nil
	// means none.
	QueueArguments(queue string) *celery.Map
	// QueueBinding is the exchange and routing key the queue is bound
	// with; "" means Celery's default, the queue's own name.
	QueueBinding(queue string) (exchange, routingKey string)
}

// celeryQueues declares every queue as a default Celery app does.
type celeryQueues struct{}

func (celeryQueues) QueueArguments(string) *celery.Map    { return nil }
func (celeryQueues) QueueBinding(string) (string, string) { return "", "" }
