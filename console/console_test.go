package console

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/celery"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
)

func TestTimeline(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	tl := NewTimeline(func() time.Time { return now })
	slot := now.Truncate(time.Second)
	// 100 scheduled fires in minute 10:00: 98 fast, 2 slow; one error.
	for i := 0; i < 98; i++ {
		tl.Observe(7, "a", slot, broker.ResultOK, 2*time.Millisecond, false)
	}
	tl.Observe(7, "a", slot, broker.ResultOK, 3*time.Second, false)
	tl.Observe(7, "b", slot, broker.ResultDuplicate, 3*time.Second, false)
	tl.Observe(7, "b", slot, broker.ResultError, time.Millisecond, false)
	// A manual fire counts as a fire but not in the lag.
	tl.Observe(7, "c", now, broker.ResultOK, time.Hour, true)

	s := tl.Snapshot([]string{"a", "b", "c", "missing"})
	if len(s.Minutes) != 60 || !s.Minutes[59].Start.Equal(now.Truncate(time.Minute)) {
		t.Fatalf("minutes: %d, last %v", len(s.Minutes), s.Minutes[len(s.Minutes)-1].Start)
	}
	last := s.Minutes[59]
	if last.Fires != 101 || last.Errors != 1 {
		t.Errorf("last minute %+v, want 101 fires and 1 error", last)
	}
	// p99 of 100 scheduled lags with 2 at 3 s is the 3 s bucket, within 25%.
	if last.LagP99 < 3*time.Second || last.LagP99 > 3750*time.Millisecond {
		t.Errorf("lag p99 %s, want 3 s (+25%%)", last.LagP99)
	}
	if a := s.Entries["a"]; a.LastHour != 99 || a.Result != "ok" {
		t.Errorf("a: %+v", a)
	}
	if b := s.Entries["b"]; b.LastHour != 1 || b.Result != "error" {
		t.Errorf("b: %+v (the error is its last result and no fire)", b)
	}
	if c := s.Entries["c"]; c.LastHour != 1 || !c.Manual {
		t.Errorf("c: %+v", c)
	}
	if _, ok := s.Entries["missing"]; ok {
		t.Error("an entry that never fired has stats")
	}

	// An hour and a minute later the counts have rolled out.
	now = now.Add(61 * time.Minute)
	tl.Observe(7, "a", now, broker.ResultOK, time.Millisecond, false)
	s = tl.Snapshot([]string{"a"})
	if s.Entries["a"].LastHour != 1 || s.Minutes[0].Fires != 0 || s.Minutes[59].Fires != 1 {
		t.Errorf("after an hour: a %+v, first minute %+v, last %+v", s.Entries["a"], s.Minutes[0], s.Minutes[59])
	}

	// Backlog: a's newest slot is newer than what etcd has.
	persisted := map[string]time.Time{"a": now.Add(-time.Minute), "b": slot}
	n, ok := tl.Backlog(7, func(name string) time.Time { return persisted[name] })
	if !ok || n != 1 {
		t.Errorf("backlog %d %v, want 1 (only a is ahead of etcd)", n, ok)
	}
	persisted["a"] = now
	if n, _ := tl.Backlog(7, func(name string) time.Time { return persisted[name] }); n != 0 {
		t.Errorf("backlog %d once etcd caught up", n)
	}

	// A new term starts over.
	tl.Observe(9, "z", now, broker.ResultOK, time.Millisecond, false)
	s = tl.Snapshot([]string{"a", "z"})
	if s.Term != 9 || s.Entries["z"].LastHour != 1 || len(s.Entries) != 1 || s.Minutes[59].Fires != 1 {
		t.Errorf("new term: %+v", s)
	}
}

func TestSecureHeadersAndCrossOrigin(t *testing.T) {
	var reached int
	h := Secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		w.WriteHeader(http.StatusAccepted)
	}))
	tests := []struct {
		name    string
		method  string
		headers map[string]string
		code    int
	}{
		{"GET from anywhere", http.MethodGet, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusAccepted},
		{"POST without browser headers (curl)", http.MethodPost, nil, http.StatusAccepted},
		{"POST same origin", http.MethodPost, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://beatd.example:8080"}, http.StatusAccepted},
		{"POST cross site", http.MethodPost, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, http.StatusForbidden},
		{"POST from another origin, old browser", http.MethodPost, map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := reached
			r := httptest.NewRequest(tt.method, "http://beatd.example:8080/entries/x/trigger", nil)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.code {
				t.Errorf("status %d, want %d", w.Code, tt.code)
			}
			if (reached > before) != (tt.code == http.StatusAccepted) {
				t.Errorf("handler reached = %v", reached > before)
			}
			for _, k := range []string{"Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy"} {
				if w.Header().Get(k) == "" {
					t.Errorf("no %s header", k)
				}
			}
			if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("CSP %q is not strict", csp)
			}
		})
	}
}

// testServer runs a console on an embedded etcd for a hand-built config
// (names the YAML loader refuses, such as ones with a slash, can be
// tested here).
func testServer(t *testing.T, cfg *config.Config, states ...*store.EntryState) (*Server, *httptest.Server) {
	return testServerAt(t, nil, cfg, states...)
}

func testServerAt(t *testing.T, clock clockwork.Clock, cfg *config.Config, states ...*store.EntryState) (*Server, *httptest.Server) {
	t.Helper()
	return testServerWith(t, func(c *Config) { c.Clock = clock }, cfg, states...)
}

// testServerWith is testServer with the console's Config changed by set.
func testServerWith(t *testing.T, set func(*Config), cfg *config.Config, states ...*store.EntryState) (*Server, *httptest.Server) {
	t.Helper()
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	const prefix = "/beatd/unit/"
	// The state as a leader stores it, and a run of each entry in the
	// history (which the daemon reads from Redis).
	lead, err := cli.Put(context.Background(), prefix+"leader/unit", "unit")
	if err != nil {
		t.Fatal(err)
	}
	tab := store.NewTable()
	runs := fakeRuns{}
	for _, st := range states {
		tab.Set(*st)
		runs[st.Name] = []broker.Run{{Slot: st.LastSlot, PublishedAt: st.LastSlot, Token: 3, TaskID: "tid-" + st.Name}}
	}
	if err := store.New(cli, prefix).Save(context.Background(), election.Fence{Key: prefix + "leader/unit", Token: lead.Header.Revision}, tab, nil); err != nil {
		t.Fatal(err)
	}
	c := Config{Client: cli, Prefix: prefix, ID: "unit", Entries: func() *config.Config { return cfg }, Runs: runs, AdminEnabled: true}
	set(&c)
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler(http.NotFoundHandler()))
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return s, hs
}

func every(name, task string, d time.Duration) *config.Entry {
	return &config.Entry{Name: name, Task: task, Schedule: &schedule.Every{Interval: d}, Location: time.UTC, Enabled: true,
		Options: &celery.SendOptions{Queue: "celery"}, Catchup: config.CatchupOnce, MaxCatchup: 100, CatchupWindow: time.Hour}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return resp.StatusCode, b.String()
}

// TestEscaping: hostile names and tasks are text everywhere: in the table,
// the entry page, attributes, links and the live stream.
func TestEscaping(t *testing.T) {
	const evil = `<script>alert(1)</script>`
	const task = `tasks."quoted" 'single' </code><b>`
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every(evil, task, 5*time.Second)}}
	_, hs := testServer(t, cfg, &store.EntryState{Name: evil, LastSlot: time.Now().Add(-time.Second).UTC().Truncate(time.Second)})

	check := func(where, body string) {
		t.Helper()
		if strings.Contains(body, evil) || strings.Contains(body, "<b>") || strings.Contains(body, `"quoted"`) {
			t.Errorf("%s: unescaped name or task in\n%s", where, body)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") || !strings.Contains(body, "tasks.&#34;quoted&#34; &#39;single&#39; &lt;/code&gt;&lt;b&gt;") {
			t.Errorf("%s: the escaped name or task is missing", where)
		}
		// The only script elements are the console's own file.
		for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(body, -1) {
			if !strings.HasPrefix(m, `<script src="/console/static/console.js?v=`) {
				t.Errorf("%s: script element %s", where, m)
			}
		}
	}
	code, body := get(t, hs.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	check("overview", body)
	if !strings.Contains(body, `href="/entry/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"`) {
		t.Errorf("entry link not path-escaped")
	}
	code, body = get(t, hs.URL+"/entry/%3Cscript%3Ealert%281%29%3C%2Fscript%3E")
	if code != http.StatusOK {
		t.Fatalf("GET entry = %d\n%s", code, body)
	}
	check("entry page", body)
	if !strings.Contains(body, `data-entry="&lt;script&gt;alert(1)&lt;/script&gt;"`) {
		t.Errorf("button attribute not escaped")
	}
	if code, body = get(t, hs.URL+"/entry/%3Cimg%3E"); code != http.StatusNotFound || !strings.Contains(body, "&lt;img&gt;") {
		t.Errorf("unknown entry: %d", code)
	}

	// The live stream's first event carries the same escaped sections
	// (inside JSON, where < is \u003c).
	resp, err := http.Get(hs.URL + "/console/events?view=entry&name=" + "%3Cscript%3Ealert%281%29%3C%2Fscript%3E")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if !strings.Contains(data, `\u0026lt;script\u0026gt;alert(1)`) || strings.Contains(data, "<") {
				t.Errorf("live event not escaped: %s", data)
			}
			break
		}
	}
}

// TestOverview100k: 100,000 entries are filtered, sorted and paginated on
// the server; a page holds 50 rows whatever the size.
func TestOverview100k(t *testing.T) {
	n := 100_000
	if raceEnabled {
		n = 10_000 // the race detector makes it 100 times slower
	}
	cfg := &config.Config{File: "s.yaml"}
	for i := 0; i < n; i++ {
		cfg.Entries = append(cfg.Entries, every(fmt.Sprintf("e%06d", i), fmt.Sprintf("tasks.t%d", i%10), time.Duration(i%3600+1)*time.Second))
	}
	cfg.Entries[4242].Options.Queue = "special"
	_, hs := testServer(t, cfg)
	get(t, hs.URL+"/") // the first view loads etcd state
	start := time.Now()
	code, body := get(t, hs.URL+"/")
	first := time.Since(start)
	start = time.Now()
	get(t, hs.URL+"/?page=2")
	second := time.Since(start)
	t.Logf("overview of %d entries: %s (sort by next fire), then %s (page 2)", n, first.Round(time.Millisecond), second.Round(time.Millisecond))
	if code != http.StatusOK || !strings.Contains(body, thousands(n)+" entries; 1–50 shown") {
		t.Fatalf("GET / = %d", code)
	}
	if rows := strings.Count(body, "<tr data-entry="); rows != 50 {
		t.Errorf("%d rows on a page, want 50", rows)
	}
	if !strings.Contains(body, "Page 1 of "+thousands(n/50)) {
		t.Errorf("no pagination")
	}
	// e000000 fires every second: it is first.
	if i := strings.Index(body, `<tr data-entry="`); !strings.HasPrefix(body[i:], `<tr data-entry="e000000"`) {
		t.Errorf("first row %.40s, want e000000", body[i:])
	}
	_, body = get(t, hs.URL+"/?q=special&in=queue")
	if !strings.Contains(body, "1 of "+thousands(n)+" entries") || !strings.Contains(body, `data-entry="e004242"`) {
		t.Errorf("filter by queue failed")
	}
	_, body = get(t, hs.URL+"/?q=tasks.t3&in=task&page=9999")
	if want := fmt.Sprintf("Page %s of %s", thousands(n/500), thousands(n/500)); !strings.Contains(body, want) {
		t.Errorf("a page past the end does not show the last page")
	}
}

// TestEntryViewDST: the next 20 fire times are in the entry's zone, and the
// slot where the zone's UTC offset changes is marked.
func TestEntryViewDST(t *testing.T) {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	c, err := schedule.ParseCrontab("30 2 * * *", berlin)
	if err != nil {
		t.Fatal(err)
	}
	e := every("nightly", "tasks.n", time.Hour)
	e.Schedule, e.Location = c, berlin
	now := time.Date(2026, 3, 20, 12, 0, 0, 0, time.UTC)
	_, hs := testServerAt(t, clockwork.NewFakeClockAt(now), &config.Config{File: "s.yaml", Entries: []*config.Entry{e}})
	code, body := get(t, hs.URL+"/entry/nightly")
	if code != http.StatusOK {
		t.Fatalf("GET = %d", code)
	}
	rows := regexp.MustCompile(`(?s)<tr( class="dst")?>\s*<th scope="row" data-label="#">(\d+)</th>\s*<td data-label="When">([^<]*)</td>.*?<td data-label="Note">(.*?)</td>`).FindAllStringSubmatch(body, -1)
	if len(rows) != 20 {
		t.Fatalf("%d next fire rows, want 20", len(rows))
	}
	for _, r := range rows {
		n, when, note := r[2], r[3], html.UnescapeString(r[4])
		switch n {
		case "1":
			if when != "Sat 2026-03-21 02:30:00 CET" || note != "" {
				t.Errorf("row 1: %q %q", when, note)
			}
		case "9": // 2026-03-29: 02:30 does not exist; it fires at 03:00 CEST
			if when != "Sun 2026-03-29 03:00:00 CEST" || !strings.Contains(note, "DST: UTC offset +01:00 → +02:00") || r[1] == "" {
				t.Errorf("row 9: %q %q, want the spring-forward slot marked", when, note)
			}
		case "10":
			if when != "Mon 2026-03-30 02:30:00 CEST" || note != "" {
				t.Errorf("row 10: %q %q", when, note)
			}
		default:
			if note != "" {
				t.Errorf("row %s marked %q", n, note)
			}
		}
	}
	if !strings.Contains(body, "at 02:30 (Europe/Berlin)") {
		t.Error("schedule in words missing")
	}
}

// TestChangedCoalesces: any number of Changed calls in a burst wake the
// live pages once, within about 100 ms, and a later call wakes them again.
func TestChangedCoalesces(t *testing.T) {
	clock := clockwork.NewFakeClock()
	c := newCluster(nil, "/p/", clock)
	s := &Server{cluster: c}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch := c.changes()
	for i := 0; i < 10_000; i++ {
		s.Changed()
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal("the burst armed no wake-up")
	}
	clock.Advance(nudgeAfter - time.Nanosecond)
	select {
	case <-ch:
		t.Fatalf("woke before the %s window", nudgeAfter)
	default:
	}
	clock.Advance(time.Nanosecond)
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("no wake-up")
	}
	next := c.changes()
	clock.Advance(3 * nudgeAfter)
	select {
	case <-next:
		t.Fatal("a burst woke the pages twice")
	default:
	}
	s.Changed()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal("a later change armed no wake-up")
	}
	clock.Advance(nudgeAfter)
	select {
	case <-next:
	case <-ctx.Done():
		t.Fatal("a later change did not wake the pages")
	}
}

// fakeRuns is a run history held in memory.
type fakeRuns map[string][]broker.Run

func (f fakeRuns) Recent(_ context.Context, names []string) (map[string][]broker.Run, error) {
	out := map[string][]broker.Run{}
	for _, n := range names {
		if r, ok := f[n]; ok {
			out[n] = r
		}
	}
	return out, nil
}

// TestNextFireOnTheLeadersGrid: an interval without start_at runs on the
// grid its state anchors (Since), so the console shows the slots the
// leader fires, not the epoch grid's: on the entries page and the entry's.
func TestNextFireOnTheLeadersGrid(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	since := now.Add(-7 * time.Second) // 09:59:53: off the epoch's 10 s grid
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every("tick", "tasks.t", 10*time.Second)}}
	_, hs := testServerAt(t, clockwork.NewFakeClockAt(now), cfg, &store.EntryState{Name: "tick", Since: since, LastSlot: since.Add(-10 * time.Second)})
	for _, path := range []string{"/", "/entry/tick"} {
		var body string
		testutil.Eventually(t, 10*time.Second, path+" with the state loaded", func() bool {
			_, body = get(t, hs.URL+path)
			return strings.Contains(body, "10:00:03")
		})
		if strings.Contains(body, "10:00:10") && path == "/" {
			t.Errorf("%s shows the epoch grid's 10:00:10", path)
		}
	}
}

// TestOutcomesShown: what the workers reported shows on the entry page
// (pause reason, last success and failure, the streak) and the cluster
// view lists the last hour's failed runs.
func TestOutcomesShown(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every("boom", "tasks.fail", time.Minute), every("fine", "tasks.add", time.Minute)}}
	failedAt := now.Add(-10 * time.Minute)
	boom := &store.EntryState{Name: "boom", LastSlot: now.Add(-10 * time.Minute), Paused: true, Out: &store.Outcomes{
		Failures: 3, LastFailure: failedAt, LastSuccess: now.Add(-2 * time.Hour),
		PauseReason: "paused after 3 consecutive failed runs; last: ZeroDivisionError: division by zero",
		Runs: []store.Run{{Slot: now.Add(-10 * time.Minute), Kind: outcome.Failed, Published: now.Add(-10 * time.Minute), Updated: failedAt,
			Worker: "celery@w1", ExcType: "ZeroDivisionError", ExcMsg: "division by zero"},
			{Slot: now.Add(-3 * time.Hour), Kind: outcome.Failed, Published: now.Add(-3 * time.Hour), Updated: now.Add(-3 * time.Hour)}}}}
	fine := &store.EntryState{Name: "fine", Out: &store.Outcomes{LastSuccess: now.Add(-time.Minute),
		Runs: []store.Run{{Slot: now.Add(-time.Minute), Kind: outcome.Succeeded, Updated: now.Add(-time.Minute)}}}}
	_, hs := testServerAt(t, clockwork.NewFakeClockAt(now), cfg, boom, fine)
	var body string
	testutil.Eventually(t, 10*time.Second, "the overview's failures", func() bool {
		_, body = get(t, hs.URL+"/")
		return strings.Contains(body, `data-failed="boom"`)
	})
	if !strings.Contains(body, "1 run failed on a worker or lost") || !strings.Contains(body, "ZeroDivisionError: division by zero") ||
		strings.Contains(body, `data-failed="fine"`) {
		t.Errorf("overview failures: one failed run of boom in the hour (the 3 h old one is out), none of fine:\n%s", body)
	}
	_, body = get(t, hs.URL+"/entry/boom")
	for _, want := range []string{`id="pause-reason"`, "ZeroDivisionError: division by zero", "3 in a row", `id="last-success"`} {
		if !strings.Contains(body, want) {
			t.Errorf("entry page lacks %q", want)
		}
	}
}

// TestHistoryShown: an entry's page shows who changed it, when and why
// (its audit records only, escaped), and its backfills.
func TestHistoryShown(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every("boom", "tasks.fail", time.Minute), every("fine", "tasks.add", time.Minute)}}
	s, hs := testServerAt(t, clockwork.NewFakeClockAt(now), cfg)
	st := store.New(s.cfg.Client, s.cfg.Prefix)
	ctx := context.Background()
	for _, r := range []store.AuditRecord{
		{At: now.Add(-time.Hour), Actor: "alice", Role: "operate", Via: "console", Action: "pause", Entry: "boom", Note: "vendor <b>down</b>"},
		{At: now.Add(-30 * time.Minute), Actor: "ci-bot", Role: "admin", Via: "api", Action: "put", Entries: []string{"boom", "fine"}},
		{At: now.Add(-10 * time.Minute), Actor: "bob", Via: "cli", Action: "trigger", Entry: "fine", Note: "fine's own note"},
	} {
		if err := st.Audit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateBackfill(ctx, &store.Backfill{Entry: "boom", From: now.Add(-2 * time.Hour), To: now.Add(-time.Hour), Rate: 10, Actor: "alice", Note: "replay the outage"}, nil, now); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, hs.URL+"/entry/boom")
	for _, want := range []string{`id="history"`, "alice", "vendor &lt;b&gt;down&lt;/b&gt;", "ci-bot", ">put<", "bf-", "replay the outage", ">queued"} {
		if !strings.Contains(body, want) {
			t.Errorf("boom's page lacks %q", want)
		}
	}
	if strings.Contains(body, "fine&#39;s own note") || strings.Contains(body, "<b>down</b>") {
		t.Error("boom's page shows another entry's record, or an unescaped note")
	}
	if _, body = get(t, hs.URL+"/entry/fine"); !strings.Contains(body, "fine&#39;s own note") || !strings.Contains(body, "No backfill of this entry is on record") {
		t.Errorf("fine's page lacks its own record, or claims a backfill:\n%s", body)
	}
}

// TestMirrorBuckets: the state mirror replaces a bucket's entries whole,
// and the deletion of a bucket an entry has since moved from (a layout
// move writes it to its new key first) keeps the entry.
func TestMirrorBuckets(t *testing.T) {
	c := newCluster(nil, "/p/", clockwork.NewFakeClock())
	st := func(name string, paused bool) store.EntryState { return store.EntryState{Name: name, Paused: paused} }
	names := func() []string { return slices.Sorted(maps.Keys(c.states)) }
	c.setBucket("0a", []store.EntryState{st("a", false), st("b", false)})
	c.setBucket("0b", []store.EntryState{st("c", false)})
	if got := names(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("after two buckets: %v", got)
	}
	// Bucket 0a rewritten without b: b goes.
	c.setBucket("0a", []store.EntryState{st("a", false)})
	if got := names(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after a rewrite: %v", got)
	}
	// The move to four-digit keys writes a and c to their new bucket, then
	// deletes the old ones: both stay, read from the new key.
	c.setBucket("00a1", []store.EntryState{st("a", true), st("c", false)})
	c.setBucket("0a", nil)
	c.setBucket("0b", nil)
	if got := names(); !slices.Equal(got, []string{"a", "c"}) || !c.states["a"].Paused {
		t.Fatalf("after the move: %v, a %+v", got, c.states["a"])
	}
	if len(c.byBucket) != 1 {
		t.Errorf("buckets %v, want only the new one", slices.Collect(maps.Keys(c.byBucket)))
	}
	// A pause on a bucket rewrite moves gen (the table's order), a
	// rewrite that changes nothing of it does not.
	gen := c.gen
	c.setBucket("00a1", []store.EntryState{st("a", true), st("c", false)})
	if c.gen != gen {
		t.Error("a rewrite with no pause changed moved gen")
	}
	c.setBucket("00a1", []store.EntryState{st("a", false), st("c", false)})
	if c.gen == gen {
		t.Error("a resume did not move gen")
	}
}

// TestSourceAsStatusSaysIt: the entries table's Source column and the
// entry page's source say what /status says (api.EntryStatusOf): an
// entry of the entries API is "api", not "file".
func TestSourceAsStatusSaysIt(t *testing.T) {
	filed, dyn, dcb := every("filed", "tasks.a", time.Minute), every("dyn", "tasks.a", time.Minute), every("dcb", "tasks.a", time.Minute)
	dyn.Source, dcb.Source = sources.API, sources.DCB
	filed.Line, filed.Column = 3, 3
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{dcb, dyn, filed}} // by name
	_, hs := testServer(t, cfg)
	code, body := get(t, hs.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	for _, e := range cfg.Entries {
		want := api.EntryStatusOf(e).Source
		row := regexp.MustCompile(`(?s)<tr data-entry="` + e.Name + `">.*?</tr>`).FindString(body)
		if !strings.Contains(row, `<td data-label="Source">`+want+`</td>`) {
			t.Errorf("%s: want source %q (as /status says) in its row:\n%s", e.Name, want, row)
		}
	}
	for name, want := range map[string]string{"dyn": "<dt>source</dt><dd><code>api</code>", "filed": "<dt>source</dt><dd><code>file s.yaml:3:3</code>"} {
		if code, body := get(t, hs.URL+"/entry/"+name); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("entry page of %s: %d, lacks %q", name, code, want)
		}
	}
}
