// Package store persists each entry's firing state in etcd, and refuses
// every write that is not guarded by the current leader's fencing token.
package store
