// Package redis is the Redis transport: it pushes fires to Kombu's Redis
// queues with one fenced, deduplicated optimistic transaction per flight
// of fires (each entry's high-water mark, carried by the newest record of
// its run history, is its dedup), keeps that history, checks at start-up
// that the broker and its ACL allow all of that, and can wait for
// replicas (WAIT) so a failover loses no acknowledged publish.
package redis
