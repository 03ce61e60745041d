package sources

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/testkit/testutil"
)

var pgOnce struct {
	sync.Once
	pg  *testutil.Postgres
	err error
}

// postgres starts one PostgreSQL for the package (TestMain stops it).
func postgres(t *testing.T) *testutil.Postgres {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	pgOnce.Do(func() {
		pgOnce.pg, pgOnce.err = testutil.StartPostgres(testutil.FreePort(t))
		if pgOnce.err == nil {
			pgStop = pgOnce.pg.Close
		}
	})
	if pgOnce.err != nil {
		t.Fatal(pgOnce.err)
	}
	return pgOnce.pg
}

// dcbRows creates the rows every backend is checked with, through the ORM.
const dcbRows = `
from datetime import datetime, timezone as tz
iv, _ = IntervalSchedule.objects.get_or_create(every=30, period='seconds')
days, _ = IntervalSchedule.objects.get_or_create(every=2, period='days')
cr = CrontabSchedule.objects.create(minute='15', hour='3', day_of_week='1-5', day_of_month='*', month_of_year='*', timezone='Europe/Berlin')
ck = ClockedSchedule.objects.create(clocked_time=datetime(2030, 1, 2, 3, 4, 5, tzinfo=tz.utc))
sol = SolarSchedule.objects.create(event='sunrise', latitude=48.1, longitude=11.6)
PeriodicTask.objects.create(name='every30', task='app.tasks.add', interval=iv, args='[1, 2]', kwargs='{"z": 1, "a": 2}',
    queue='low', priority=5, headers='{"x-tenant": "t1"}', expire_seconds=60)
PeriodicTask.objects.create(name='weekdays', task='app.tasks.report', crontab=cr, exchange='ex', routing_key='rk')
PeriodicTask.objects.create(name='clocked', task='app.tasks.once', clocked=ck, one_off=True)
PeriodicTask.objects.create(name='off', task='app.tasks.add', interval=days, enabled=False, start_time=datetime(2029, 5, 1, tzinfo=tz.utc))
PeriodicTask.objects.create(name='badargs', task='app.tasks.add', interval=iv, args='[1, 2')
PeriodicTask.objects.create(name='solar', task='app.tasks.add', solar=sol)
PeriodicTask.objects.create(name='once', task='app.tasks.add', interval=iv, one_off=True)
`

func TestDCBRead(t *testing.T) {
	backends := []struct {
		name string
		db   func(t *testing.T) (dj *testutil.Django, url string)
	}{
		{"postgres", func(t *testing.T) (*testutil.Django, string) {
			pg := postgres(t)
			dj, db := testutil.MustDjangoPostgres(t, pg, strings.ToLower(strings.NewReplacer("/", "_").Replace(t.Name())))
			return dj, pg.URL(db)
		}},
		{"sqlite", func(t *testing.T) (*testutil.Django, string) {
			dj, path := testutil.MustDjangoSQLite(t)
			return dj, "sqlite:///" + path // dj-database-url's absolute form, sqlite:////abs
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if testing.Short() {
				t.Skip("runs Django")
			}
			dj, url := b.db(t)
			dj.ORM(t, dcbRows)
			src, err := OpenDCB(url, time.Second, false)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			ctx := context.Background()
			marker, err := src.Marker(ctx)
			if err != nil || marker == "" {
				t.Fatalf("marker %q, %v", marker, err)
			}
			docs, bad, err := src.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantBad, wantEntries := 2, 5
			if SolarSupported {
				wantBad, wantEntries = 1, 6
			} else if !strings.Contains(bad["solar"], "solar") {
				t.Errorf("solar row: %q", bad["solar"])
			}
			if !strings.Contains(bad["badargs"], "args must be a JSON list") || len(bad) != wantBad {
				t.Errorf("bad rows: %v", bad)
			}
			entries := map[string]*config.Entry{}
			for name, doc := range docs {
				e, err := (*config.Config)(nil).ParseEntry(name, doc)
				if err != nil {
					t.Fatalf("%s: %s: %v", name, doc, err)
				}
				entries[name] = e
			}
			if len(entries) != wantEntries {
				t.Fatalf("entries %v", docs)
			}
			at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			e := entries["every30"]
			if fmt.Sprint(e.Schedule) != "every 30s" || e.Options.Queue != "low" || *e.Options.Priority != 5 ||
				e.Options.Expires.After != time.Minute || e.Kwargs.Keys[0] != "z" || len(e.Args) != 2 || e.Options.Headers.Keys[0] != "x-tenant" {
				t.Errorf("every30: %s -> %+v", docs["every30"], e)
			}
			e = entries["weekdays"]
			if e.Location.String() != "Europe/Berlin" || e.Options.Exchange != "ex" || e.Options.RoutingKey != "rk" ||
				!e.Schedule.Next(at).Equal(time.Date(2030, 1, 1, 3, 15, 0, 0, e.Location)) {
				t.Errorf("weekdays: %s -> next %s", docs["weekdays"], e.Schedule.Next(at))
			}
			if e := entries["clocked"]; !e.Schedule.Next(at).Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) || !e.Schedule.Next(time.Date(2030, 1, 3, 0, 0, 0, 0, time.UTC)).IsZero() {
				t.Errorf("clocked: %s", docs["clocked"])
			}
			if e := entries["off"]; e.Enabled || !e.Schedule.Next(at).After(time.Date(2029, 5, 1, 0, 0, 0, 0, time.UTC)) {
				t.Errorf("off: %s", docs["off"])
			}
			// A one-off interval is one slot: the first after the row's change.
			if e := entries["once"]; !strings.Contains(string(docs["once"]), `"at"`) || !e.Schedule.Next(e.Schedule.Next(time.Time{})).IsZero() {
				t.Errorf("once: %s", docs["once"])
			}
			if !SolarSupported {
				// The row's mapping is ready for when the schema has solar.
				SolarSupported = true
				docs2, _, err := src.Read(ctx)
				SolarSupported = false
				if err != nil || !strings.Contains(string(docs2["solar"]), `"solar":{"event":"sunrise","lat":48.1,"lon":11.6}`) {
					t.Errorf("solar document: %s, %v", docs2["solar"], err)
				}
			} else {
				// Munich's sunrise on 2030-01-01 is about 06:02 UTC.
				next := entries["solar"].Schedule.Next(at)
				if next.Before(at.Add(5*time.Hour)) || next.After(at.Add(8*time.Hour)) {
					t.Errorf("solar: %s -> next %s", docs["solar"], next)
				}
			}
			// An edit moves the marker.
			dj.ORM(t, "t = PeriodicTask.objects.get(name='every30'); t.args = '[3, 4]'; t.save()\n")
			m2, err := src.Marker(ctx)
			if err != nil || m2 == marker {
				t.Errorf("marker after an edit: %q (was %q), %v", m2, marker, err)
			}
		})
	}
}

// TestDCBKeepsLastGoodSet stops PostgreSQL under a running source: the
// entries stay, the failure is reported, and recovery clears it.
func TestDCBKeepsLastGoodSet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PostgreSQL and Django")
	}
	pg := testutil.MustStartPostgres(t) // its own: this test stops it
	dj := testutil.MustMigrateDjango(t, testutil.PostgresDB(pg, "postgres"))
	dj.ORM(t, "iv, _ = IntervalSchedule.objects.get_or_create(every=10, period='seconds')\nPeriodicTask.objects.create(name='a', task='t.a', interval=iv)\n")
	src, err := OpenDCB(pg.URL("postgres"), 100*time.Millisecond, false)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var mu sync.Mutex
	var current *config.Config
	m := New(Config{Apply: func(c *config.Config) error { mu.Lock(); current = c; mu.Unlock(); return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { src.Sync(ctx, m, false, "") })
	defer func() { cancel(); wg.Wait() }()
	has := func(name string) bool {
		mu.Lock()
		defer mu.Unlock()
		return current != nil && current.Entry(name) != nil
	}
	waitUntil(t, "entry a", func() bool { return has("a") })
	pg.Stop()
	waitUntil(t, "the failure to be reported", func() bool { return m.Err() != nil })
	if !has("a") || !strings.Contains(m.Err().Error(), DCB) {
		t.Errorf("after failure: has a %v, err %v", has("a"), m.Err())
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	dj.ORM(t, "iv = IntervalSchedule.objects.get(every=10, period='seconds')\nPeriodicTask.objects.create(name='b', task='t.b', interval=iv)\n")
	waitUntil(t, "recovery with entry b", func() bool { return has("b") && m.Err() == nil })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, 30*time.Second, 20*time.Millisecond, what, cond)
}
