package store

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCompactOnItsClock: Compact keeps its period on the store's clock.
// Its first pass only notes the revision; one period later on that clock
// it compacts the history up to there, so a read of an older revision
// fails.
func TestCompactOnItsClock(t *testing.T) {
	cli := newClient(t)
	key := testPrefix(t) + "v"
	ctx := context.Background()
	old, err := cli.Put(ctx, key, "1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, "2"); err != nil { // the first pass sees a newer revision
		t.Fatal(err)
	}
	const period = time.Hour
	clock := clockwork.NewFakeClock()
	s := New(cli, testPrefix(t)).WithClock(clock)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Compact(cctx, period, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()

	readOld := func() error {
		_, err := cli.Get(ctx, key, clientv3.WithRev(old.Header.Revision))
		return err
	}
	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	if err := clock.BlockUntilContext(bctx, 1); err != nil {
		t.Fatal("Compact armed no period on its clock")
	}
	if err := readOld(); err != nil {
		t.Fatalf("history compacted before a period passed on the clock: %v", err)
	}
	clock.Advance(period)
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "the history compacted one period later", func() bool {
		return errors.Is(readOld(), rpctypes.ErrCompacted)
	})
}
