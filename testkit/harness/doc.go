// Package harness starts and stops the real processes that tests, drills
// and soak runs need (redis-server, an etcd cluster, beatd replicas) on
// free loopback ports, and waits for them to be ready. It imports no
// testing package, so chaos and testkit/soak use it at run time;
// testkit/testutil wraps it for tests.
package harness
