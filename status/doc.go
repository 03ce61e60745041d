// Package status builds the one status view of a cluster and its
// entries: from the config, the state table in etcd, the run history the
// broker keeps and the clock, with the leader's live results overlaid in
// one place. GET /status (api), `beatd status` and the web console
// render it, so they say the same thing; a field added to Entry here
// reaches the JSON as is, and the CLI and console through their
// renderers.
package status
