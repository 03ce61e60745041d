// Package election makes one beatd replica the leader through an etcd
// lease, and ends its leadership the moment it can no longer be sure of it.
package election
