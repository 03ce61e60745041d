// Package chaos runs failover drills against a real beatd cluster on
// loopback and audits that every (entry, slot) was enqueued exactly once.
package chaos
