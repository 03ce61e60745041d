// Package testutil starts real servers (redis-server, etcd, a Celery
// worker, PostgreSQL) on free loopback ports for tests, and waits for
// conditions (Eventually). The processes come from testkit/harness, which
// chaos and testkit/soak share; testutil ties them to a test: a failure
// fails it, and what it starts is stopped when it ends. A missing binary
// fails the test: a skipped guarantee is not a checked one.
package testutil
