package daemon

import (
	"context"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// niceOfThread is the nice value of the thread the caller runs on (it
// must be locked to it).
func niceOfThread(t *testing.T) int {
	t.Helper()
	// getpriority returns 20-nice for a thread (the raw syscall's
	// convention, which x/sys/unix passes through).
	p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return 20 - p
}

// TestInBackground checks that fn runs at backgroundNice on the one
// background thread, which outlives it (a thread that exited would take
// down the child processes it started), and that no other goroutine runs
// at the lowered priority.
func TestInBackground(t *testing.T) {
	runtime.LockOSThread()
	base := niceOfThread(t)
	runtime.UnlockOSThread()
	want := min(base+backgroundNice, 19)
	var tids []int
	for range 3 {
		inBackground(func() {
			tids = append(tids, unix.Gettid())
			if got := niceOfThread(t); got != want {
				t.Errorf("fn ran at nice %d, want %d", got, want)
			}
		})
	}
	if len(tids) != 3 || tids[1] != tids[0] || tids[2] != tids[0] {
		t.Errorf("fn ran on threads %v, want one thread three times", tids)
	}
	for range 50 {
		done := make(chan int)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			done <- niceOfThread(t)
		}()
		if got := <-done; got != base {
			t.Fatalf("another goroutine ran at nice %d, want %d", got, base)
		}
	}
}

// TestLoadPriority checks that a shard's load parses on the lowered
// thread when another replica leads the shard (the load is ahead of its
// move), and at the process's priority when nobody leads it (its slots
// wait for the load: a kill -9's shards, a cold start's).
func TestLoadPriority(t *testing.T) {
	runtime.LockOSThread()
	base := niceOfThread(t)
	runtime.UnlockOSThread()
	s := testShardSet("d", 16, 4, leaders(12))
	niceOfParse := map[int]int{}
	s.defs = func(_ context.Context, i int) (func(), error) {
		s.background(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			niceOfParse[i] = niceOfThread(t)
		})
		return func() {}, nil
	}
	for _, tc := range []struct {
		shard int
		want  int
	}{
		{shard: 11, want: min(base+backgroundNice, 19)}, // c leads it
		{shard: 12, want: base},                         // nobody leads it
	} {
		stop, waiting, err := s.load(context.Background(), s.shards[tc.shard])
		if err != nil {
			t.Fatal(err)
		}
		stop()
		waiting()
		if got := niceOfParse[tc.shard]; got != tc.want {
			t.Errorf("shard %d's parse ran at nice %d, want %d", tc.shard, got, tc.want)
		}
	}
	if s.ahead.Load() {
		t.Error("a load ended, and the next parse would still run lowered")
	}
}
