// Package livetest runs the beatd binary against the Redis and etcd setups
// people run in production — Sentinel with failovers, TLS, ACL users, etcd
// with mTLS and RBAC, a Redis Cluster — all real servers on loopback, and
// checks the guarantees and the start-up errors end to end. It has only
// tests.
package livetest
