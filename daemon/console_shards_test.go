package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
)

// consoleNumbers is what a console page says of the fires: the timeline's
// total, the shards it counts, each entry's fires in the last hour, and
// the persist backlog.
type consoleNumbers struct {
	total   int
	shards  string
	fires   map[string]int
	backlog string
	missing string
	// listed is the entries table's count ("8 entries"), and unlisted
	// what it says it lacks.
	listed, unlisted string
}

var (
	tlTotal   = regexp.MustCompile(`<figcaption id="tl-cap">(\d+) fires? `)
	tlShards  = regexp.MustCompile(`<span id="tl-shards">([^<]*)</span>`)
	rowFires  = regexp.MustCompile(`(?s)<tr data-entry="([^"]+)">.*?class="num">(\d+)</td>`)
	backlogDD = regexp.MustCompile(`<dd id="backlog">([^<]*)</dd>`)
	missingP  = regexp.MustCompile(`<p class="muted" id="leader-data">([^<]*)</p>`)
	countP    = regexp.MustCompile(`<p class="count">([^<;.]*)`)
	unlistedP = regexp.MustCompile(`<p class="muted" id="entries-missing">([^<]*)</p>`)
)

func readConsole(t *testing.T, m *Main) (consoleNumbers, bool) {
	t.Helper()
	resp, err := http.Get("http://" + m.HTTPAddress() + "/")
	if err != nil {
		return consoleNumbers{}, false
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	n := consoleNumbers{fires: map[string]int{}}
	if s := tlTotal.FindSubmatch(page); s != nil {
		n.total, _ = strconv.Atoi(string(s[1]))
	}
	if s := tlShards.FindSubmatch(page); s != nil {
		n.shards = string(s[1])
	}
	for _, s := range rowFires.FindAllSubmatch(page, -1) {
		n.fires[string(s[1])], _ = strconv.Atoi(string(s[2]))
	}
	if s := backlogDD.FindSubmatch(page); s != nil {
		n.backlog = string(s[1])
	}
	if s := missingP.FindSubmatch(page); s != nil {
		n.missing = string(s[1])
	}
	if s := countP.FindSubmatch(page); s != nil {
		n.listed = string(s[1])
	}
	if s := unlistedP.FindSubmatch(page); s != nil {
		n.unlisted = string(s[1])
	}
	return n, true
}

// TestShardConsole: the console of either replica of a sharded cluster
// shows the fires of every shard, each counted by the replica that leads
// the shard and summed, and they match the broker: the timeline's total
// and the count of each entry it lists (every entry of the cluster, the
// other shard leader's part of the table asked of it) equal the messages
// in the queue. Entries fire
// only when triggered (a known count each), so the numbers are exact.
// When a replica stops, the survivor's console counts its shards' current
// terms: the two it kept with their fires, the two it took from none.
func TestShardConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const shards = 4
	var y strings.Builder
	y.WriteString("entries:\n")
	const entries = 8
	for i := range entries {
		fmt.Fprintf(&y, "  e%d: {task: tasks.t, at: '2099-01-01T00:00:00Z'}\n", i)
	}
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Leases long enough that -race on two loaded cores keeps its terms
	// (2s lapsed: shards changed hands mid-test); a stopping replica
	// resigns, so b's takeover below does not wait for it.
	const leaseTTL = "6s"
	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", "/sc/", "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", leaseTTL, "--state-interval", "200ms", "--shards", strconv.Itoa(shards))
	}
	a := start("a")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all 4 shards", func() bool { return len(a.shards.leading()) == shards })
	b := start("b")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b lead 2 shards each", func() bool {
		return len(a.shards.leading()) == 2 && len(b.shards.leading()) == 2
	})
	// Entry ei is triggered i%3+1 times, queued on a whatever shard it is
	// in, and sent by its shard's leader.
	ctx := context.Background()
	want := map[string]int{}
	for i := range entries {
		name := fmt.Sprintf("e%d", i)
		for range i%3 + 1 {
			if _, err := a.store.PutRequest(ctx, store.Request{Op: store.OpTrigger, Entry: name}, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			want[name]++
		}
	}
	sum := func(m map[string]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	sent := func() map[string]int {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, m := range msgs {
			got[m.Entry]++
		}
		return got
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "every trigger sent", func() bool {
		pending, _, err := a.store.PendingRequests(ctx)
		return err == nil && len(pending) == 0 && sum(sent()) == sum(want)
	})
	inQueue := sent()
	// The terms that sent them. A console counts each shard's current
	// term; should a lease lapse all the same, the shard's new term has
	// sent none of them.
	sentIn := map[int]int64{}
	for _, m := range []*Main{a, b} {
		for _, l := range m.shards.leading() {
			sentIn[l.Shard] = l.Token
		}
	}
	wantNow := func() (map[string]int, string) {
		terms := map[int]int64{}
		for _, m := range []*Main{a, b} {
			for _, l := range m.shards.leading() {
				terms[l.Shard] = l.Token
			}
		}
		w := map[string]int{}
		for name, c := range inQueue {
			if sh := keys.ShardOf(name, shards); terms[sh] == sentIn[sh] {
				w[name] = c
			}
		}
		return w, fmt.Sprintf("shard terms %v, sent in %v", terms, sentIn)
	}
	for name, n := range want {
		if inQueue[name] != n {
			t.Fatalf("%s: %d messages in the queue, want %d (triggered)", name, inQueue[name], n)
		}
	}
	// Both consoles say what the broker holds, and that every shard is
	// counted, with nothing left in the backlog once the state is written.
	for _, m := range []*Main{a, b} {
		testutil.EventuallyErr(t, 10*time.Second, 100*time.Millisecond, m.ID+"'s console counts every fire of every shard", func() error {
			n, ok := readConsole(t, m)
			want, terms := wantNow()
			notYet := fmt.Errorf("%s's console: %+v; want %v of the queue %v (%s)", m.ID, n, want, inQueue, terms)
			if !ok || n.total != sum(want) || n.shards != "0, 1, 2, 3" || n.missing != "" ||
				n.backlog != "none: etcd has every publish, in shards 0, 1, 2, 3" ||
				n.listed != fmt.Sprint(entries, " entries") || n.unlisted != "" || len(n.fires) != entries {
				return notYet
			}
			// Its entry list is the cluster's, each entry with its
			// count, whichever replica leads its shard.
			for name := range inQueue {
				if got, listed := n.fires[name]; !listed || got != want[name] {
					return notYet
				}
			}
			return nil
		})
	}
	// a stops: b takes a's shards in new terms, whose timelines start
	// empty; b's own two shards keep their terms and their counts.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "b leads all 4 shards", func() bool { return len(b.shards.leading()) == shards })
	testutil.EventuallyErr(t, 10*time.Second, 100*time.Millisecond, "b's console counts its shards' current terms", func() error {
		n, ok := readConsole(t, b)
		wantB, terms := wantNow()
		notYet := fmt.Errorf("b's console: %+v; want %v of %v (%s)", n, wantB, inQueue, terms)
		if !ok || n.total != sum(wantB) || n.shards != "0, 1, 2, 3" || n.missing != "" ||
			n.listed != fmt.Sprint(entries, " entries") || n.unlisted != "" || len(n.fires) != entries {
			return notYet
		}
		for name := range inQueue {
			if n.fires[name] != wantB[name] {
				return notYet
			}
		}
		return nil
	})
}
