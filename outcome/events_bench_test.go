package outcome

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
)

var (
	benchEvents  = flag.Bool("bench-events", false, "run the task-event consumer benchmark (make bench-events)")
	benchRate    = flag.Int("events-rate", 10000, "events a second Celery's EventDispatcher sends")
	benchFor     = flag.Duration("events-for", 60*time.Second, "how long it sends")
	benchWatched = flag.Int("events-watched", 20000, "task ids the feed watches (a leader's unfinished runs)")
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBenchEvents consumes task events that Celery's own EventDispatcher
// sends through a real Redis at --events-rate, into a feed watching
// --events-watched ids (half the ids the events name), drained as the
// scheduler would. It reports this process's CPU per event and its heap
// over time, and fails if the heap grows over the run. A benchmark, not
// a timed test: opt-in.
func TestBenchEvents(t *testing.T) {
	if !*benchEvents {
		t.Skip("the event consumer benchmark is opt-in: make bench-events (or go test ./outcome -run TestBenchEvents -args -bench-events)")
	}
	rs := testutil.MustStartRedis(t)
	feed := NewFeed(clockwork.NewRealClock(), 16384)
	for i := range *benchWatched {
		feed.Watch("bench-"+strconv.Itoa(i), "e"+strconv.Itoa(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go RunRedisEvents(ctx, rs.Client(), 0, feed, slog.New(slog.DiscardHandler))
	drained := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case r := <-feed.Reports():
				n++
				if r.Kind.Finished() { // the next run of the same entry
					feed.Watch(r.TaskID, r.Entry)
				}
			case <-ctx.Done():
				drained <- n
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // an observation window: the subscription is up before the first event
	emit := exec.Command(testutil.CeleryPython, "testdata/emit_events.py", rs.URL(0), strconv.Itoa(*benchRate),
		strconv.FormatFloat(benchFor.Seconds(), 'f', 1, 64), strconv.Itoa(2**benchWatched))
	var out strings.Builder
	emit.Stdout, emit.Stderr = &out, &out
	cpu0, start := cpuTime(), time.Now()
	if err := emit.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- emit.Wait() }()
	var heaps []uint64
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("emitter: %v\n%s", err, out.String())
			}
			running = false
		case <-tick.C:
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			heaps = append(heaps, ms.HeapInuse)
		}
	}
	// The last events are in flight: wait until the feed has read them.
	sent, _ := strconv.Atoi(strings.TrimSpace(out.String()[strings.LastIndexByte(strings.TrimSpace(out.String()), '\n')+1:]))
	testutil.Eventually(t, 30*time.Second, "every event read", func() bool { return int(feed.h.reports[FromEvents].Load()) >= sent })
	cpu, wall := cpuTime()-cpu0, time.Since(start)
	cancel()
	matched := <-drained
	read := feed.h.reports[FromEvents].Load()
	t.Logf("events: %d sent in %.1fs (%.0f/s), %d read, %d matched a watched id", sent, wall.Seconds(), float64(sent)/wall.Seconds(), read, matched)
	t.Logf("CPU: %.1f µs per event (%.2f cores)", float64(cpu.Microseconds())/float64(read), cpu.Seconds()/wall.Seconds())
	var hs []string
	for _, h := range heaps {
		hs = append(hs, fmt.Sprintf("%.1f", float64(h)/(1<<20)))
	}
	t.Logf("heap in use every 5 s (MiB): %s", strings.Join(hs, " "))
	if len(heaps) >= 4 {
		first, last := heaps[1], heaps[len(heaps)-1] // after the first sample's warm-up
		if float64(last) > float64(first)*1.25+4<<20 {
			t.Errorf("heap grew from %.1f to %.1f MiB", float64(first)/(1<<20), float64(last)/(1<<20))
		}
	}
}
