package chaos

import "github.com/beatd/beatd/testkit/harness"

// Replica is one beatd process of a drill, and the proxies that carry its
// traffic, so a partition can cut it off.
type Replica struct {
	*harness.Replica
	EtcdProxies []*harness.Proxy
	RedisProxy  *harness.Proxy
}
