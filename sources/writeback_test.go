package sources

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/testkit/testutil"
)

// fakeHistory stands in for the broker's run history (a pure unit: the
// guarantee checked here is what lands in dcb's tables).
type fakeHistory map[string]outcome.EntryRuns

func (f fakeHistory) Histories(_ context.Context, names []string) (map[string]outcome.EntryRuns, error) {
	out := map[string]outcome.EntryRuns{}
	for _, n := range names {
		if h, ok := f[n]; ok {
			out[n] = h
		}
	}
	return out, nil
}

func runs(times ...time.Time) outcome.EntryRuns {
	h := outcome.EntryRuns{Count: int64(len(times))}
	for i := len(times) - 1; i >= 0; i-- { // newest first
		h.Runs = append(h.Runs, outcome.Run{Slot: times[i], PublishedAt: times[i]})
	}
	return h
}

func TestDCBWriteBack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PostgreSQL and Django")
	}
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			var dj *testutil.Django
			var url string
			if backend == "postgres" {
				pg := postgres(t)
				var db string
				dj, db = testutil.MustDjangoPostgres(t, pg, "writeback")
				url = pg.URL(db)
			} else {
				var path string
				dj, path = testutil.MustDjangoSQLite(t)
				url = "sqlite://" + path
			}
			dj.ORM(t, `
from datetime import datetime, timezone as tz
iv, _ = IntervalSchedule.objects.get_or_create(every=10, period='seconds')
ck = ClockedSchedule.objects.create(clocked_time=datetime(2030, 1, 2, tzinfo=tz.utc))
PeriodicTask.objects.create(name='rep', task='t.rep', interval=iv)
PeriodicTask.objects.create(name='one', task='t.one', clocked=ck, one_off=True)
`)
			show := func() string {
				return strings.TrimSpace(dj.ORM(t, `for t in PeriodicTask.objects.order_by('name'):
    print(t.name, t.enabled, t.total_run_count, t.last_run_at and t.last_run_at.isoformat())
`))
			}
			ctx := context.Background()
			ro, err := OpenDCB(url, time.Second, false)
			if err != nil {
				t.Fatal(err)
			}
			defer ro.Close()
			m := New(Config{})
			if _, err := ro.Poll(ctx, m, nil); err != nil {
				t.Fatal(err)
			}
			marker, _ := ro.Marker(ctx)
			t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			hist := fakeHistory{"rep": runs(t0, t0.Add(10*time.Second), t0.Add(20*time.Second)), "one": runs(t0.Add(5 * time.Second))}

			// Without --source-write-back the connection is read-only.
			if _, err := (&WriteBack{Source: ro, History: hist, Merger: m}).Once(ctx); err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "-", ""), "readonly") {
				t.Errorf("a read-only source wrote, or failed otherwise: %v", err)
			}
			rw, err := OpenDCB(url, time.Second, true)
			if err != nil {
				t.Fatal(err)
			}
			defer rw.Close()
			w := &WriteBack{Source: rw, History: hist, Merger: m}
			if n, err := w.Once(ctx); err != nil || n != 2 {
				t.Fatalf("write-back: %d, %v", n, err)
			}
			want := "one False 0 2026-05-01T12:00:05+00:00\nrep True 3 2026-05-01T12:00:20+00:00"
			if got := show(); got != want {
				t.Errorf("after write-back:\n%s\nwant\n%s", got, want)
			}
			// Nothing new: nothing written. A new run: one more.
			if n, err := w.Once(ctx); err != nil || n != 0 {
				t.Errorf("idle write-back: %d, %v", n, err)
			}
			hist["rep"] = runs(t0, t0.Add(10*time.Second), t0.Add(20*time.Second), t0.Add(30*time.Second))
			if n, err := w.Once(ctx); err != nil || n != 1 {
				t.Errorf("write-back of one run: %d, %v", n, err)
			}
			// A restarted beatd (nothing remembered) does not count twice.
			if _, err := (&WriteBack{Source: rw, History: hist, Merger: m}).Once(ctx); err != nil {
				t.Fatal(err)
			}
			want = "one False 0 2026-05-01T12:00:05+00:00\nrep True 4 2026-05-01T12:00:30+00:00"
			if got := show(); got != want {
				t.Errorf("after restart:\n%s\nwant\n%s", got, want)
			}
			if m2, _ := ro.Marker(ctx); m2 != marker {
				t.Errorf("write-back moved dcb's change marker (%s -> %s): beatd would re-read on each run", marker, m2)
			}
		})
	}
}
