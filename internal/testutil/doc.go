// Package testutil starts real servers (redis-server, etcd, a Celery worker)
// on free loopback ports for tests. A missing binary fails the test: a
// skipped guarantee is not a checked one.
package testutil
