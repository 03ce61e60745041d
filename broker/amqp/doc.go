// Package amqp is the RabbitMQ transport: it publishes fires as Kombu's
// AMQP transport does, with publisher confirms, fenced by a lock that the
// broker gives to one connection at a time plus a term check in etcd, and
// deduplicated across terms by a journal of batches (amqp.go says how).
package amqp
