// Package keys owns beatd's layout in etcd: every key a beatd cluster
// reads or writes lives under its prefix, at a path named here and
// nowhere else.
package keys

import "strings"

// DefaultPrefix is the prefix of a cluster that names none.
const DefaultPrefix = "/beatd/default/"

// Prefix normalises a cluster prefix: the default when empty, and always
// ending in "/", so that "/beatd/a" never matches "/beatd/ab".
func Prefix(p string) string {
	if p == "" {
		p = DefaultPrefix
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}

// Election is the election's prefix (concurrency.NewElection's pfx):
// candidates' keys are Election(p) + "/" + lease.
func Election(prefix string) string { return prefix + "leader" }

// Leaders is the prefix under which the candidates' keys live; the oldest
// is the leader.
func Leaders(prefix string) string { return Election(prefix) + "/" }

// State is the prefix of the packed entry state buckets.
func State(prefix string) string { return prefix + "state/" }

// LegacyEntries is the prefix of the per-entry JSON state of beatd before
// packed buckets, read once for migration.
func LegacyEntries(prefix string) string { return prefix + "entries/" }

// Defs is the prefix of the runtime entries' definitions (the entries
// API's documents).
func Defs(prefix string) string { return prefix + "defs/" }

// CatalogHeader is the key of the published config's header.
func CatalogHeader(prefix string) string { return prefix + "catalog/header" }

// CatalogData is the prefix of the published config's chunks.
func CatalogData(prefix string) string { return prefix + "catalog/data/" }

// Replicas is the prefix of the replicas' registrations.
func Replicas(prefix string) string { return prefix + "replicas/" }

// Probe is the key the start-up check writes, guarded, to prove the
// prefix is writable.
func Probe(prefix string) string { return prefix + "probe" }

// CompactionProbe is the key the compactor reads (count only) to learn
// the current revision. It lies outside every cluster's prefix: one
// compactor serves the whole etcd.
const CompactionProbe = "compaction-probe"

// Audit is the prefix of the audit records: who changed what, and why.
func Audit(prefix string) string { return prefix + "audit/" }

// Backfills is the prefix of the backfill jobs, by id.
func Backfills(prefix string) string { return prefix + "backfills/" }

// Requests is the prefix of queued admin requests.
func Requests(prefix string) string { return prefix + "requests/" }

// Cluster is the cluster's name: its prefix without the slashes. It
// namespaces task ids and beatd's Redis keys.
func Cluster(prefix string) string { return strings.Trim(prefix, "/") }

// SQSIntents is the prefix of the SQS transport's send records: what a
// leader is about to send, written under its fence before the send, and
// marked done after it (broker/sqs).
func SQSIntents(prefix string) string { return prefix + "sqs/intents/" }
