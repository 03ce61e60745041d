// Package testkit is the root of beatd's test and benchmark kit, kept out
// of internal/ (which holds runtime helpers only): harness starts real
// servers and beatd processes on free loopback ports, testutil wraps it
// for tests, soak drives the built binary for long benchmarks, tenants
// writes the scale benchmarks' entries.
package testkit
