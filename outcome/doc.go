// Package outcome turns what Celery reports about a task — its workers'
// task events and its result backend — into what happened to each of
// beatd's fires: received, started, succeeded, failed, retried, revoked,
// expired. It parses Celery's own encodings (Kombu's event envelopes, the
// result backend's task meta) and runs the consumers that read them; the
// scheduler decides what an outcome means for an entry.
package outcome
