// Package etcdflags is how every beatd command reaches etcd: the
// --etcd-* and --prefix flags, the client they dial, the secrets they
// read, and errors that name the etcd that failed and the flag that
// points elsewhere.
package etcdflags
