// Package outcome is what happened to each of beatd's fires. It owns the
// Run model (the broker's run record and the runs an entry's state keeps
// are one type) and History, the one reader of an entry's last runs. It
// turns what Celery reports about a task — its workers' task events, over
// Redis pub/sub or RabbitMQ's celeryev exchange, and its result backend —
// into received, started, succeeded, failed, retried, revoked, expired:
// it parses Celery's own encodings (Kombu's event envelopes, the result
// backend's task meta) and runs the consumers that read them into the
// Feed; the scheduler decides what an outcome means for an entry.
package outcome
