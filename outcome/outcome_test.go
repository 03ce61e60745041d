package outcome

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
)

// captured reads testdata/redis-psubscribe.txt: redis-cli's PSUBSCRIBE *
// output while a real Celery 5.2.6 worker (-P solo -E, results in Redis)
// ran tasks.add, tasks.fail, tasks.flaky (retry once) and an expired
// tasks.add. Its messages are (channel, payload) pairs.
func captured(t *testing.T) (events [][]byte, metas [][]byte) {
	t.Helper()
	for _, m := range testutil.ReadPSubscribe(t, "testdata/redis-psubscribe.txt") {
		switch {
		case strings.Contains(m.Channel, ".celeryev/"):
			events = append(events, m.Payload)
		case strings.HasPrefix(m.Channel, "celery-task-meta-"):
			metas = append(metas, m.Payload)
		}
	}
	return events, metas
}

func TestParseRedisEventsFromCelery(t *testing.T) {
	msgs, _ := captured(t)
	var got []Event
	for _, m := range msgs {
		var err error
		if got, err = ParseRedisEvent(m, got); err != nil {
			t.Fatal(err)
		}
	}
	type want struct {
		id   string
		kind Kind
	}
	wants := []want{
		{"id-add", Received}, {"id-add", Started}, {"id-add", Succeeded},
		{"id-fail", Received}, {"id-fail", Started}, {"id-fail", Failed},
		{"id-flaky", Received}, {"id-flaky", Started}, {"id-flaky", Retried},
		{"id-exp", Expired},
		{"id-flaky", Received}, {"id-flaky", Started}, {"id-flaky", Succeeded},
	}
	if len(got) != len(wants) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(wants), got)
	}
	for i, w := range wants {
		e := got[i]
		if e.TaskID != w.id || e.Kind != w.kind {
			t.Errorf("event %d: %s %s, want %s %s", i, e.TaskID, e.Kind, w.id, w.kind)
		}
		if e.Worker != "cap@h" {
			t.Errorf("event %d: worker %q", i, e.Worker)
		}
		if e.At.Before(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("event %d: time %s", i, e.At)
		}
	}
	if got[2].Runtime <= 0 || got[2].Runtime > time.Second {
		t.Errorf("succeeded runtime %s", got[2].Runtime)
	}
	// The solo pool sends exception "ExceptionWithTraceback()": the type
	// comes from the traceback.
	if f := got[5]; f.ExcType != "ZeroDivisionError" || f.ExcMessage != "division by zero" {
		t.Errorf("failure: %q %q", f.ExcType, f.ExcMessage)
	}
}

func TestParseResultFromCelery(t *testing.T) {
	_, metas := captured(t)
	byID := map[string]Event{}
	for _, m := range metas {
		ev, ok, err := ParseResult(m)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", m, ok, err)
		}
		byID[ev.TaskID] = ev
	}
	if e := byID["id-add"]; e.Kind != Succeeded || e.At.IsZero() {
		t.Errorf("id-add: %+v", e)
	}
	if e := byID["id-fail"]; e.Kind != Failed || e.ExcType != "ZeroDivisionError" || e.ExcMessage != "division by zero" {
		t.Errorf("id-fail: %+v", e)
	}
	if _, ok, err := ParseResult([]byte(`{"status": "PENDING", "task_id": "x"}`)); ok || err != nil {
		t.Errorf("PENDING: ok %v err %v", ok, err)
	}
}

func TestException(t *testing.T) {
	for _, tc := range []struct {
		repr, tb, typ, msg string
	}{
		{"ZeroDivisionError('division by zero')", "", "ZeroDivisionError", "division by zero"},
		{"ExceptionWithTraceback()", "Traceback (most recent call last):\n  File \"t.py\", line 1, in f\n    1/0\nZeroDivisionError: division by zero\n", "ZeroDivisionError", "division by zero"},
		{"KeyError('a')", "Traceback (most recent call last):\n  File \"t.py\"\nKeyError: 'a'", "KeyError", "'a'"},
		{"myapp.errors.Boom(\"it's\")", "", "myapp.errors.Boom", "it's"},
		{"ValueError('a', 2)", "", "ValueError", "'a', 2"},
		{"SystemExit()", "Traceback...\n  File x\n    code line", "SystemExit", ""},
		{"not a repr", "", "", "not a repr"},
		{"", "", "", ""},
	} {
		typ, msg := Exception(tc.repr, tc.tb)
		if typ != tc.typ || msg != tc.msg {
			t.Errorf("Exception(%q, %q) = %q, %q; want %q, %q", tc.repr, tc.tb, typ, msg, tc.typ, tc.msg)
		}
	}
	long := "E('" + strings.Repeat("é", 600) + "')"
	if _, msg := Exception(long, ""); len(msg) > MaxMessage || !strings.HasSuffix(msg, "…") {
		t.Errorf("long message not capped: %d bytes", len(msg))
	}
}

func TestSupersedes(t *testing.T) {
	for _, tc := range []struct {
		ev, cur Kind
		want    bool
	}{
		{Received, Published, true},
		{Started, Received, true},
		{Received, Started, false}, // events out of order
		{Succeeded, Started, true},
		{Started, Succeeded, false},
		{Failed, Succeeded, false},
		{Received, Retried, true},
		{Retried, Started, true},
		{Succeeded, Published, true},
	} {
		if got := tc.ev.Supersedes(tc.cur); got != tc.want {
			t.Errorf("%s supersedes %s = %v, want %v", tc.ev, tc.cur, got, tc.want)
		}
	}
}

// A report that comes before its task id is watched (a leaderless gap, a
// handover) reaches the run once it is; the feed holds a bounded number.
func TestFeedHoldsReportsUntilWatched(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	f := NewFeed(clock, 4)
	ctx := context.Background()
	f.Deliver(ctx, FromEvents, []Event{
		{TaskID: "a", Kind: Received},
		{TaskID: "a", Kind: Started},
		{TaskID: "a", Kind: Succeeded, Runtime: time.Second},
		{TaskID: "b", Kind: Received}, // not worth holding
	})
	f.Watch("a", "ea")
	f.Watch("b", "eb")
	got := f.Early(nil)
	if len(got) != 1 || got[0].Entry != "ea" || got[0].Kind != Succeeded || got[0].Runtime != time.Second {
		t.Fatalf("Early = %+v, want a's newest report, as ea's", got)
	}
	if again := f.Early(nil); len(again) != 0 {
		t.Fatalf("Early twice = %+v", again)
	}
	// Old reports age out, and the count is capped.
	f.Deliver(ctx, FromEvents, []Event{{TaskID: "old", Kind: Failed}})
	clock.Advance(unwatchedAge + time.Second)
	evs := make([]Event, unwatchedCap+10)
	for i := range evs {
		evs[i] = Event{TaskID: fmt.Sprintf("t%d", i), Kind: Succeeded}
	}
	f.Deliver(ctx, FromEvents, evs)
	f.h.mu.Lock()
	held := len(f.h.unwatched.byID)
	f.h.mu.Unlock()
	if held > unwatchedCap {
		t.Errorf("feed holds %d unwatched ids, cap %d", held, unwatchedCap)
	}
	f.Watch("old", "eo")
	f.Watch("t0", "e0") // pushed out by the cap
	f.Watch(fmt.Sprintf("t%d", unwatchedCap+9), "elast")
	got = f.Early(nil)
	if len(got) != 1 || got[0].Entry != "elast" {
		t.Errorf("Early after age and cap = %+v, want only the newest id's", got)
	}
}

// TestFeedSubs: one set of consumers feeds every shard's loop. A report
// reaches only the sub (or the feed) that watches its task id; a sub's
// Clear unwatches only its own ids and hands its unread reports back to
// the held ones, so its next Watch still gets them and a sub nobody reads
// never blocks the others.
func TestFeedSubs(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	root := NewFeed(clock, 4)
	a, b := root.Sub(1), root.Sub(1)
	a.Watch("ta", "ea")
	b.Watch("tb", "eb")
	root.Watch("tr", "er")
	root.Deliver(ctx, FromEvents, []Event{{TaskID: "tb", Kind: Started}, {TaskID: "ta", Kind: Started}, {TaskID: "tr", Kind: Started}})
	for _, tc := range []struct {
		name  string
		f     *Feed
		entry string
	}{{"a", a, "ea"}, {"b", b, "eb"}, {"the feed", root, "er"}} {
		select {
		case r := <-tc.f.Reports():
			if r.Entry != tc.entry {
				t.Errorf("%s got %s's report", tc.name, r.Entry)
			}
		default:
			t.Errorf("%s got no report", tc.name)
		}
		if n := len(tc.f.Reports()); n != 0 {
			t.Errorf("%s has %d more reports", tc.name, n)
		}
	}
	// a's buffer is full and nobody reads it (its term ended): Clear
	// hands the report back, unblocks a Deliver waiting on it, and b's
	// reports flow.
	a.Watch("ta2", "ea")
	root.Deliver(ctx, FromEvents, []Event{{TaskID: "ta", Kind: Succeeded}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		root.Deliver(ctx, FromEvents, []Event{{TaskID: "ta2", Kind: Succeeded}, {TaskID: "tb", Kind: Succeeded}})
	}()
	// Matched counts before the sends, the first of which (ta2) waits.
	testutil.Eventually(t, 5*time.Second, "the second Deliver waits on a's full buffer", func() bool {
		return root.h.matched[FromEvents].Load() == 6
	})
	a.Clear()
	<-done
	if r := <-b.Reports(); r.Entry != "eb" || r.Kind != Succeeded {
		t.Errorf("b got %+v", r)
	}
	if _, still := root.h.watched["tb"]; !still {
		t.Error("a's Clear unwatched b's id")
	}
	a.Clear() // the report sent while it cleared goes back too
	a.Watch("ta", "ea")
	a.Watch("ta2", "ea")
	got := a.Early(nil)
	if len(got) != 2 || len(a.Reports()) != 0 {
		t.Fatalf("after Clear and Watch: early %+v, %d buffered; want both of a's reports early", got, len(a.Reports()))
	}
	if n := root.h.matched[FromEvents].Load(); n != 6 {
		t.Errorf("matched %d reports across the subs, want 6", n)
	}
}

// TestFeedChainSteps: a chain step's task id is watched with its step,
// which its reports carry, held ones too; the result backend's poll reads
// the watched ids in step order, so a failed step's result is delivered
// before the later steps' the backend marks failed with it.
func TestFeedChainSteps(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	f := NewFeed(clock, 8)
	ctx := context.Background()
	f.Deliver(ctx, FromEvents, []Event{{TaskID: "s2", Kind: Failed}})
	for _, w := range []struct {
		id   string
		step int
	}{{"s3", 3}, {"head", 0}, {"s2", 2}, {"s1", 1}} {
		f.WatchStep(w.id, "etl", w.step)
	}
	if got := f.Early(nil); len(got) != 1 || got[0].Step != 2 || got[0].Entry != "etl" {
		t.Fatalf("Early = %+v, want s2's failure as step 2", got)
	}
	f.Deliver(ctx, FromResults, []Event{{TaskID: "s1", Kind: Succeeded}, {TaskID: "other", Kind: Succeeded}})
	if r := <-f.Reports(); r.TaskID != "s1" || r.Step != 1 || r.Source != FromResults {
		t.Fatalf("report %+v, want s1 as step 1", r)
	}
	clock.Advance(time.Second)
	for range 20 { // map order varies: the sort must not
		if got := f.WatchedSince(clock.Now(), nil); fmt.Sprint(got) != "[head s1 s2 s3]" {
			t.Fatalf("WatchedSince = %v, want the steps in order", got)
		}
	}
}
