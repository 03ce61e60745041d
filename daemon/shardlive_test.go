package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
)

// getJSON reads m's GET path into out.
func getJSON(t *testing.T, m *Main, path string, out any) {
	t.Helper()
	resp, err := http.Get("http://" + m.HTTPAddress() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s on %s: %s", path, m.ID, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s on %s: %v", path, m.ID, err)
	}
}

// listAll pages GET /api/v1/entries?q on m (q's limit, else 3, so a page
// is seldom the whole list) and returns every entry's name and task, and
// how many pages' next was not their last entry (a filtered page that
// read the other shards as far as it may, and goes on from there).
func listAll(t *testing.T, m *Main, q url.Values) (out map[string]string, short int) {
	t.Helper()
	out = map[string]string{}
	if !q.Has("limit") {
		q.Set("limit", "3")
	}
	for pages := 0; ; pages++ {
		if pages > 50 {
			t.Fatalf("GET /api/v1/entries?%s on %s: no end after 50 pages", q.Encode(), m.ID)
		}
		var p api.Page
		getJSON(t, m, "/api/v1/entries?"+q.Encode(), &p)
		if p.Next != "" && (len(p.Entries) == 0 || p.Entries[len(p.Entries)-1].Name != p.Next) {
			short++
		}
		for _, e := range p.Entries {
			if _, dup := out[e.Name]; dup {
				t.Fatalf("GET /api/v1/entries?%s on %s: %s twice", q.Encode(), m.ID, e.Name)
			}
			out[e.Name] = e.Task
		}
		if p.Next == "" {
			return out, short
		}
		q.Set("after", p.Next)
	}
}

// TestShardStatusLive: every replica of a sharded cluster answers for the
// whole cluster. Two replicas at --shards 4; every entry (of the file and
// of the entries API) is triggered once and its message read from Redis.
// Then each replica's /status gives every entry the last result of its
// shard's leader's loop (a trigger: "manual"), its last publish, and the
// run the broker recorded with that message's task id; the entries API's
// ?task= and ?queue= list the runtime entries of every shard, page by
// page; and a name that both the file and a runtime entry define runs,
// and shows, as the runtime entry under --sources-priority api,file on
// both replicas, whichever leads its shard. A shard whose leader is not
// registered, or does not answer, or no longer holds the term, is named
// with why in /status's shards.
func TestShardStatusLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const (
		shards = 4
		prefix = "/live/"
		never  = `'2099-01-01T00:00:00Z'`
	)
	// both-0..3 are in the file and the entries API alike; the names
	// fall in every shard.
	var both []string
	var y strings.Builder
	y.WriteString("entries:\n")
	for i := range 6 {
		fmt.Fprintf(&y, "  file-%d: {task: tasks.file, at: %s}\n", i, never)
	}
	for i := 0; len(both) < shards; i++ {
		name := fmt.Sprintf("both-%d", i)
		if slices.ContainsFunc(both, func(b string) bool { return keys.ShardOf(b, shards) == keys.ShardOf(name, shards) }) {
			continue
		}
		both = append(both, name)
		fmt.Fprintf(&y, "  %s: {task: tasks.file, at: %s}\n", name, never)
	}
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix, "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms",
			"--shards", fmt.Sprint(shards), "--sources-priority", "api,file")
	}
	ctx := context.Background()
	a := start("a")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all 4 shards", func() bool { return len(a.shards.leading()) == shards })
	// Runtime entries: rt-* of tasks.rt on queue rtq, other-* of
	// tasks.other, and both-* (written as the store does: the API refuses
	// a name of the file).
	var docs []api.EntryDoc
	want := map[string]string{} // every entry: its task
	for i := range 30 {
		name := fmt.Sprintf("rt-%02d", i)
		docs = append(docs, api.EntryDoc{Name: name, Spec: []byte(`{"task": "tasks.rt", "at": "2099-01-01T00:00:00Z", "options": {"queue": "rtq"}}`)})
		want[name] = "tasks.rt"
	}
	for i := range 3 {
		name := fmt.Sprintf("other-%d", i)
		docs = append(docs, api.EntryDoc{Name: name, Spec: []byte(`{"task": "tasks.other", "at": "2099-01-01T00:00:00Z"}`)})
		want[name] = "tasks.other"
	}
	if _, err := a.entriesAPI().PutEntries(ctx, docs, nil); err != nil {
		t.Fatal(err)
	}
	var bothDocs []sources.Doc
	for _, name := range both {
		bothDocs = append(bothDocs, sources.Doc{Name: name, Data: []byte(`{"task": "tasks.rt", "at": "2099-01-01T00:00:00Z", "options": {"queue": "rtq"}}`)})
		want[name] = "tasks.rt"
	}
	if _, err := a.entries.Put(ctx, bothDocs, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		want[fmt.Sprintf("file-%d", i)] = "tasks.file"
	}
	b := start("b")
	// While a still holds a shard it handed over (handoverSettle), its
	// /status, paged, counts and shows each entry once all the same.
	held := false
	testutil.EventuallyEvery(t, 15*time.Second, 10*time.Millisecond, "a and b lead 2 shards each", func() bool {
		if len(a.shards.leading()) < 4 && !holdsWhatItLeads(a) && !held {
			held = true
			if shown := statusPages(t, a, 5, len(want)); len(shown) != len(want) {
				t.Errorf("a, holding a shard it handed over: /status paged by 5 shows %d entries, want %d", len(shown), len(want))
			}
		}
		return len(a.shards.leading()) == 2 && len(b.shards.leading()) == 2
	})
	if !held {
		t.Log("a's holding of a shard it handed over was not seen") // the check above did not run
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b hold the entries of the shards they lead alone", func() bool {
		return holdsWhatItLeads(a) && holdsWhatItLeads(b)
	})
	// Every entry is triggered once and sent by its shard's leader.
	since := time.Now()
	for name := range want {
		if _, err := a.store.PutRequest(ctx, store.Request{Op: store.OpTrigger, Entry: name}, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	sent := map[string]chaos.Message{}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "every trigger sent", func() bool {
		clear(sent)
		for _, q := range []string{"celery", "rtq"} {
			msgs, err := chaos.ReadQueue(ctx, rs.Client(), q)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				sent[m.Entry] = m
			}
		}
		return len(sent) == len(want)
	})
	ledBy := func(name string) string {
		if b.shards.leads(keys.ShardOf(name, shards)) {
			return "b"
		}
		return "a"
	}
	for _, m := range []*Main{a, b} {
		// /status: every entry with its shard leader's live fields.
		var st api.Status
		var bad []string
		// remote counts the entries checked whose shard the other replica
		// leads in the term that sent their message. A shard whose lease
		// lapsed on this loaded machine (TTL 2 s under -race) is led in a
		// new term, whose loop never sent the message and so has no last
		// result for it: its entries are left out of that check.
		var remote int
		testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, m.ID+"'s /status gives every entry its shard leader's last result", func() bool {
			st = api.Status{}
			getJSON(t, m, "/status", &st)
			bad, remote = bad[:0], 0
			if len(st.Shards) != shards {
				bad = append(bad, fmt.Sprintf("%d shards", len(st.Shards)))
				return false
			}
			for _, e := range st.Entries {
				msg, ok := sent[e.Name]
				sh := st.Shards[keys.ShardOf(e.Name, shards)]
				moved := ok && msg.Token != sh.FencingToken
				if ok && !moved && sh.LeaderID != m.ID {
					remote++
				}
				switch {
				case !ok:
					bad = append(bad, e.Name+": not triggered")
				case !moved && (e.LastResult != "manual" || e.LastPublishedAt == nil || e.LastPublishedAt.Before(since)):
					bad = append(bad, fmt.Sprintf("%s (led by %s): last_result %q, last_published_at %v", e.Name, ledBy(e.Name), e.LastResult, e.LastPublishedAt))
				case len(e.RecentRuns) == 0 || e.RecentRuns[0].TaskID != msg.TaskID:
					bad = append(bad, e.Name+": the broker's run is not the message's")
				case e.Task != want[e.Name]:
					bad = append(bad, fmt.Sprintf("%s (led by %s): task %s, want %s", e.Name, ledBy(e.Name), e.Task, want[e.Name]))
				}
			}
			for _, sh := range st.Shards {
				if sh.LiveError != "" {
					bad = append(bad, fmt.Sprintf("shard %d: %s", sh.Shard, sh.LiveError))
				}
			}
			return len(st.Entries) == len(want) && len(bad) == 0
		})
		if t.Failed() {
			t.Fatalf("%s's /status (%d entries of %d): %v", m.ID, len(st.Entries), len(want), bad)
		}
		if remote == 0 {
			t.Fatalf("%s's /status: no entry of the other replica's shards kept the term that sent it", m.ID)
		}
		// The console's page of an entry of the other replica's shards
		// shows the definition that runs there.
		for _, name := range append(slices.Clone(both), "rt-00", "rt-01", "rt-02", "rt-03", "rt-04", "rt-05") {
			if ledBy(name) == m.ID {
				continue
			}
			resp, err := http.Get("http://" + m.HTTPAddress() + "/entry/" + name)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "tasks.rt") || strings.Contains(string(body), "tasks.file") {
				t.Errorf("%s's console page of %s (led by %s): %s, tasks.rt %v, tasks.file %v", m.ID, name, ledBy(name), resp.Status,
					strings.Contains(string(body), "tasks.rt"), strings.Contains(string(body), "tasks.file"))
			}
		}
		// A page of /status is the same page, live fields and all.
		var page api.Status
		getJSON(t, m, "/status?limit=4&after=file-1", &page)
		if len(page.Entries) != 4 || page.Entries[0].Name != "file-2" || page.Entries[3].LastResult != "manual" {
			t.Errorf("%s: /status?limit=4&after=file-1: %+v", m.ID, page.Entries)
		}
		// Paged by 5, /status counts what follows each page once: a
		// both-* name, a runtime entry and a file's alike, is one entry
		// on a replica that does not lead its shard as on one that does.
		shown := statusPages(t, m, 5, len(want))
		if len(shown) != len(want) {
			t.Errorf("%s: /status paged by 5 shows %d entries, want %d", m.ID, len(shown), len(want))
		}
		// Both ways of finding the names defined twice find the both-*
		// of the shards this replica does not lead: by the index's names,
		// and by the runtime names (the side with fewer is read).
		var unheld []*sources.Entries
		for i := range shards {
			if !m.shards.leads(i) {
				unheld = append(unheld, m.entries.Shard(i))
			}
		}
		var twice []string
		for _, name := range both {
			if !m.shards.leads(keys.ShardOf(name, shards)) {
				twice = append(twice, name)
			}
		}
		slices.Sort(twice)
		for _, sides := range [][2]int{{999, 1000}, {1000, 999}} {
			if got, exact, err := m.definedTwice(ctx, unheld, "", "", sides[0], sides[1]); err != nil || !exact || !slices.Equal(got, twice) {
				t.Errorf("%s: definedTwice reading the side of %d names: %v (exact %v), %v; want %v", m.ID, min(sides[0], sides[1]), got, exact, err, twice)
			}
		}
		// /status names every both-* a conflict won by the runtime entry
		// (--sources-priority api,file), those of the shards this replica
		// leads from its merger, the others' from the names defined twice.
		var whole api.Status
		getJSON(t, m, "/status", &whole)
		var conflicts []string
		for _, c := range whole.Conflicts {
			if c.Winner != sources.API || !slices.Equal(c.Sources, []string{sources.API, sources.File}) {
				t.Errorf("%s: /status conflict %+v, want won by api over file", m.ID, c)
			}
			conflicts = append(conflicts, c.Name)
		}
		if !slices.Equal(conflicts, slices.Sorted(slices.Values(both))) {
			t.Errorf("%s: /status conflicts %v, want %v", m.ID, conflicts, both)
		}
		// The entries API's filters cover every shard's runtime entries.
		filters := []struct {
			q     url.Values
			want  func(name, task string) bool
			short bool // some page must end where its reads did
		}{
			{url.Values{"task": {"tasks.rt"}}, func(_, task string) bool { return task == "tasks.rt" }, false},
			{url.Values{"queue": {"rtq"}}, func(_, task string) bool { return task == "tasks.rt" }, false},
			{url.Values{"task": {"tasks.other"}}, func(_, task string) bool { return task == "tasks.other" }, false},
			// 3 of 37 runtime entries: a page of 1 reads 8 definitions of
			// the other shards at most, so past other-2 a page ends where
			// its reads did, and its next goes on from there.
			{url.Values{"task": {"tasks.other"}, "limit": {"1"}}, func(_, task string) bool { return task == "tasks.other" }, true},
			{url.Values{"task": {"tasks.file"}}, func(_, task string) bool { return task == "tasks.file" }, false},
			{url.Values{"task": {"tasks.rt"}, "prefix": {"both-"}}, func(name, task string) bool { return task == "tasks.rt" && strings.HasPrefix(name, "both-") }, false},
		}
		for _, f := range filters {
			wantNames := map[string]string{}
			for name, task := range want {
				if f.want(name, task) {
					wantNames[name] = task
				}
			}
			got, short := listAll(t, m, f.q)
			if !maps.Equal(got, wantNames) {
				t.Errorf("%s: GET /api/v1/entries?%s: %v, want %v", m.ID, f.q.Encode(), got, wantNames)
			}
			if f.short && short == 0 {
				t.Errorf("%s: GET /api/v1/entries?%s: no page ended where its reads did", m.ID, f.q.Encode())
			}
		}
	}
	// Why a shard's live fields are missing: a leader not registered, one
	// that does not answer, one that no longer holds the term.
	var bShards []int
	for _, l := range b.shards.leading() {
		bShards = append(bShards, l.Shard)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deaf := ln.Addr().String()
	ln.Close()
	reg, _ := json.Marshal(election.Replica{HTTP: deaf})
	if _, err := a.etcd.Put(ctx, keys.Replicas(prefix)+"deaf", string(reg)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		leader string
		token  func(int64) int64
		want   string
	}{
		{"ghost", func(t int64) int64 { return t }, "has not registered"},
		{"deaf", func(t int64) int64 { return t }, "leader deaf at http://" + deaf + " does not answer"},
		{"b", func(t int64) int64 { return t + 1000 }, "b no longer leads it in the term the election shows"},
	}
	for _, c := range cases {
		st, err := a.api.Status(ctx, api.StatusQuery{Limit: api.DefaultStatusLimit})
		if err != nil {
			t.Fatal(err)
		}
		for i := range st.Entries {
			st.Entries[i].LastResult = ""
		}
		st.Shards = slices.Clone(st.Shards)
		for i := range st.Shards {
			st.Shards[i].LiveError = ""
		}
		terms := make([]int64, shards) // as etcd said, before the change
		for i, sh := range st.Shards {
			terms[i] = sh.FencingToken
		}
		st.Shards[bShards[0]].LeaderID, st.Shards[bShards[0]].FencingToken = c.leader, c.token(terms[bShards[0]])
		a.api.overlayShardsLive(ctx, &st, api.StatusQuery{Limit: api.DefaultStatusLimit})
		for _, sh := range st.Shards {
			if got := sh.LiveError; sh.Shard == bShards[0] && !strings.Contains(got, c.want) || sh.Shard != bShards[0] && got != "" {
				t.Errorf("leader %s: shard %d's live_error %q (want it on shard %d: %q)", c.leader, sh.Shard, got, bShards[0], c.want)
			}
		}
		for _, e := range st.Entries {
			i := keys.ShardOf(e.Name, shards)
			if i != bShards[0] && sent[e.Name].Token != terms[i] {
				continue // its shard's term changed since it was sent (above)
			}
			if gone := i == bShards[0]; gone != (e.LastResult == "") {
				t.Errorf("leader %s: %s (shard %d) has last_result %q", c.leader, e.Name, i, e.LastResult)
			}
		}
	}
}

// statusPages pages m's /status by limit and returns the names shown, in
// order; each page's entries_total must be how many of the total follow
// the pages before it (the cluster's, on a sharded replica).
func statusPages(t *testing.T, m *Main, limit, total int) []string {
	t.Helper()
	var shown []string
	for sq := (api.StatusQuery{Limit: limit}); ; {
		st, err := m.api.Status(context.Background(), sq)
		if err != nil {
			t.Fatal(err)
		}
		if st.EntriesTotal != total-len(shown) {
			t.Errorf("/status on %s after %q: entries_total %d, want %d", m.ID, sq.After, st.EntriesTotal, total-len(shown))
		}
		for _, e := range st.Entries {
			shown = append(shown, e.Name)
		}
		if st.Next == "" {
			return shown
		}
		sq.After = st.Next
	}
}

// holdsWhatItLeads says whether m's merger holds the entries of the
// shards m leads and of no other: a shard handed over is held for
// handoverSettle after, and one loaded for a campaign before its term.
func holdsWhatItLeads(m *Main) bool {
	for i := range m.Shards {
		if m.merger.Holds(i) != m.shards.leads(i) {
			return false
		}
	}
	return true
}
