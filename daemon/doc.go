// Package daemon is one beatd replica: it wires the config and its
// sources, etcd (embedded or external), the election and the leadership
// loop, the scheduler and its broker, and the HTTP surface (health,
// metrics, status, the entries API, the console), and runs them until it
// is stopped. cmd/beatd is the command line around it.
package daemon
