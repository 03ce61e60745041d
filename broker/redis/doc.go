// Package redis is the Redis transport: it pushes fires to Kombu's Redis
// queues with one fenced, deduplicated, atomic script per batch (each
// entry's high-water mark, one hash field, is its dedup), keeps each
// entry's run history beside it, checks at start-up that the broker and
// its ACL allow all of that, and can wait for replicas (WAIT) so a
// failover loses no acknowledged publish.
package redis
