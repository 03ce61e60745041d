package embedetcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestSingleMemberLease: a single member's slower raft tick must not
// stretch beatd's shortest lease: a 2 s TTL is granted as 2 s, and the
// lease is gone within about that once nobody keeps it alive.
func TestSingleMemberLease(t *testing.T) {
	s := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, s.Endpoints...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct{ ask, want int64 }{{2, 2}, {5, 5}} {
		g, err := cli.Grant(ctx, tc.ask)
		if err != nil {
			t.Fatal(err)
		}
		if g.TTL != tc.want {
			t.Errorf("lease of %d s granted as %d s, want %d", tc.ask, g.TTL, tc.want)
		}
	}
	g, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	// 6 s: the TTL, the lessor's 500 ms check, a proposal, -race.
	testutil.EventuallyEvery(t, 6*time.Second, 50*time.Millisecond, "a 2 s lease to expire", func() bool {
		ttl, err := cli.TimeToLive(ctx, g.ID)
		if err != nil {
			t.Fatal(err)
		}
		return ttl.TTL == -1 // expired and revoked
	})
}
