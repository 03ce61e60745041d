// Package publisher turns a fire into the exact Celery task message a Python
// producer would write, and pushes it to Redis with one fenced, deduplicated,
// atomic script, or to RabbitMQ (amqp.go) through a connection-owned fence
// lock, with publisher confirms and a journal of batches.
package publisher
