package testutil

import (
	"testing"

	"github.com/beatd/beatd/testkit/harness"
)

// MustStartProxy forwards a free loopback port to target until the test
// ends; Blackhole drops its traffic like a partition.
func MustStartProxy(tb testing.TB, target string) *harness.Proxy {
	tb.Helper()
	p, err := harness.NewProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}
