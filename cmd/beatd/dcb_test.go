package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestProcessDjangoCeleryBeat runs beatd on a real django-celery-beat
// database (PostgreSQL, migrated by the real dcb 2.4.0 models) and edits
// rows through the Django ORM while it runs: each change reaches the
// broker within a poll interval (plus the entry's period); a disabled or
// deleted task stops; a bad row hides nothing; a name the file also has is
// a reported conflict the file wins; a database outage keeps the last good
// set and shows in /readyz and the metrics.
func TestProcessDjangoCeleryBeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PostgreSQL, Django and beatd")
	}
	pg := testutil.MustStartPostgres(t)
	dj := testutil.MustMigrateDjango(t, fmt.Sprintf(`{"ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres", "HOST": "127.0.0.1", "PORT": "%d"}`, pg.Port))
	dj.ORM(t, `
iv, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds')
PeriodicTask.objects.create(name='dcb1', task='tasks.add', interval=iv, args='[1, 1]')
PeriodicTask.objects.create(name='keep', task='tasks.add', interval=iv, args='[7, 7]')
PeriodicTask.objects.create(name='broken', task='tasks.add', interval=iv, args='not json')
PeriodicTask.objects.create(name='shared', task='tasks.add', interval=iv, args='[9, 9]')
`)
	const poll = 300 * time.Millisecond
	c := newCluster(t, "entries:\n  shared: {task: tasks.add, every: 1h}\n", 1,
		"--source", "django-celery-beat="+pg.URL("postgres"), "--source-poll-interval", poll.String())
	lead, _ := c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "dcb1 and keep to fire", func() bool { return len(c.firesOf("dcb1")) > 0 && len(c.firesOf("keep")) > 0 })
	if f := c.firesOf("dcb1")[0]; f.Args != "[1, 1]" && f.Args != "[1,1]" {
		t.Errorf("dcb1 args %s", f.Args)
	}
	// The conflict: reported, the file wins (its entry fires hourly).
	if v, ok := lead.Metric("beatd_source_conflicts"); !ok || v != 1 {
		t.Errorf("beatd_source_conflicts = %v %v", v, ok)
	}
	if v, ok := lead.Metric(`beatd_source_invalid_entries{source="django-celery-beat"}`); !ok || v != 1 {
		t.Errorf("invalid entries metric = %v %v", v, ok)
	}
	st := call(t, "GET", lead.URL("/status"), "", nil)
	if !strings.Contains(st.body, `"winner": "file"`) || !strings.Contains(st.body, `"source": "django-celery-beat"`) || !strings.Contains(st.body, "args must be a JSON list") {
		t.Errorf("status lacks the conflict, the source or the bad row:\n%s", st.body)
	}
	if n := len(c.firesOf("shared")); n != 0 {
		t.Errorf("the dcb side of a conflict the file wins fired %d times", n)
	}

	// A clocked one-off created while beatd runs fires once.
	dj.ORM(t, `
from datetime import datetime, timedelta, timezone as tz
ck = ClockedSchedule.objects.create(clocked_time=datetime.now(tz.utc) + timedelta(seconds=2))
PeriodicTask.objects.create(name='once', task='tasks.add', clocked=ck, one_off=True)
`)

	// Edit a row: the new args fire within a poll interval and a period.
	dj.ORM(t, "t = PeriodicTask.objects.get(name='dcb1'); t.args = '[2, 2]'; t.save()\n")
	edited := time.Now()
	applied := lead.logTime(t, 5*time.Second, `"msg":"entry changed"`, `"entry":"dcb1"`)
	t.Logf("ORM edit committed to applied on the leader: %s (poll %s)", applied.Sub(edited), poll)
	if applied.Sub(edited) > poll+time.Second {
		t.Errorf("the edit applied %s after the commit; want within a poll interval (+1 s)", applied.Sub(edited))
	}
	waitFor(t, 10*time.Second, "the edit to fire", func() bool {
		for _, f := range c.firesOf("dcb1") {
			if strings.Contains(f.Args, "2") {
				return true
			}
		}
		return false
	})
	var firstNew time.Time
	for _, f := range c.firesOf("dcb1") {
		if strings.Contains(f.Args, "2") && (firstNew.IsZero() || f.Slot.Before(firstNew)) {
			firstNew = f.Slot
		}
	}
	t.Logf("ORM edit to first new slot: %s (poll %s, period 1s)", firstNew.Sub(edited), poll)
	if firstNew.Sub(edited) > poll+2*time.Second {
		t.Errorf("edit took %s to fire", firstNew.Sub(edited))
	}

	// A new row while running fires; disable one, delete the other: both stop.
	dj.ORM(t, "PeriodicTask.objects.create(name='dcb2', task='tasks.add', interval=IntervalSchedule.objects.get(every=1, period='seconds'), args='[3, 3]')\n")
	waitFor(t, 10*time.Second, "the new row to fire", func() bool { return len(c.firesOf("dcb2")) > 0 })
	dj.ORM(t, "t = PeriodicTask.objects.get(name='dcb1'); t.enabled = False; t.save()\nPeriodicTask.objects.get(name='dcb2').delete()\n")
	stopped := time.Now()
	time.Sleep(poll + 2500*time.Millisecond) // proves a negative: a poll, then two seconds of would-be fires
	for _, name := range []string{"dcb1", "dcb2"} {
		for _, f := range c.firesOf(name) {
			if f.Slot.After(stopped.Add(poll + time.Second)) {
				t.Errorf("%s fired at %s after being disabled/deleted at %s", name, f.Slot, stopped)
			}
		}
	}

	// The clocked one-off fired exactly once.
	if n := len(c.firesOf("once")); n != 1 {
		t.Errorf("clocked one-off fired %d times, want 1", n)
	}
	c.checkNoDuplicates()

	// PostgreSQL goes away: entries keep firing, /readyz and metrics say it.
	pg.Stop()
	waitFor(t, 10*time.Second, "readyz to report the source", func() bool {
		r := call(t, "GET", lead.URL("/readyz"), "", nil)
		return r.code == http.StatusServiceUnavailable && strings.Contains(r.body, "django-celery-beat")
	})
	if v, ok := lead.Metric(`beatd_source_up{source="django-celery-beat"}`); !ok || v != 0 {
		t.Errorf("beatd_source_up during the outage = %v %v", v, ok)
	}
	before := len(c.firesOf("keep"))
	waitFor(t, 10*time.Second, "the last good set to go on firing during the outage", func() bool { return len(c.firesOf("keep")) > before })
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "readyz after recovery", func() bool {
		resp, err := http.Get(lead.URL("/readyz"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	})
}
