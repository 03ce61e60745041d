// Package reshard changes a stopped cluster's shard count: it moves each
// entry's state to its shard under the new count, resumably, records the
// count, and reads the recorded count and any resize in progress for the
// replicas that must refuse to start meanwhile.
package reshard
