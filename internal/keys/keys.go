// Package keys owns beatd's layout in etcd: every key a beatd cluster
// reads or writes lives under its prefix, at a path named here and
// nowhere else.
package keys

import (
	"hash/fnv"
	"strconv"
	"strings"
)

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
// API's documents): of the cluster's prefix when it has one shard, of each
// shard's (Defs(Shard(prefix, i, n))) when it has more.
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

// ShardCount is the key that records a sharded cluster's shard count,
// written once when the cluster is made. A cluster without it has one
// shard: every cluster made before sharding, and every cluster run with
// --shards 1, which writes nothing new.
func ShardCount(prefix string) string { return prefix + "shard-count" }

// Shard is the prefix of shard i of n: its election (Election), its state
// table (State) and its runtime entries' definitions (Defs) live under
// it. Sharding shipped in no release with another place for a sharded
// cluster's definitions, so none is migrated. The one shard of an
// unsharded cluster is the cluster's prefix itself, so a cluster of one
// shard keeps every key it had before sharding.
func Shard(prefix string, i, n int) string {
	if n <= 1 {
		return prefix
	}
	return Shards(prefix) + strconv.Itoa(i) + "/"
}

// Shards is the prefix under which a sharded cluster's shards live: one
// range read of it is every shard's election.
func Shards(prefix string) string { return prefix + "shards/" }

// ShardOf is the shard of the entry named name among n: FNV-1a of the
// name mod n, so every replica agrees without a table of assignments.
func ShardOf(name string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}

// RedisPrefix is the prefix of beatd's own Redis keys: flag
// (--redis-prefix), else one with the cluster as a hash tag, so Redis
// Cluster keeps them in one slot.
func RedisPrefix(flag, cluster string) string {
	if flag != "" {
		return flag
	}
	return "beatd:{" + cluster + "}:"
}

// SQSIntents is the prefix of the SQS transport's send records: what a
// leader is about to send, written under its fence before the send, and
// marked done after it (broker/sqs).
func SQSIntents(prefix string) string { return prefix + "sqs/intents/" }

// Resize is the prefix of a shard resize's keys (`beatd shards resize`):
// its lock, its plan and its staging state table. While any key lives
// under it, replicas refuse to start.
func Resize(prefix string) string { return prefix + "resize/" }

// ResizeLock is the key a resize holds, on a lease, while it runs: who
// runs it and since when.
func ResizeLock(prefix string) string { return Resize(prefix) + "lock" }

// ResizePlan is the key that records a resize begun and not finished
// (from, to, and whether every state is staged), so a rerun finishes it.
func ResizePlan(prefix string) string { return Resize(prefix) + "plan" }

// ResizeStaging is the store prefix of a resize's staging table: every
// entry's state, copied there before any shard's table is rewritten
// (its state table is State(ResizeStaging(prefix))).
func ResizeStaging(prefix string) string { return Resize(prefix) + "staging/" }
