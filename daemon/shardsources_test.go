package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/catalog"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestShardShareSources: the entries of schedules.yaml and of
// django-celery-beat follow the share as runtime entries do. Two replicas
// at --shards 4 over one file and one dcb database (sqlite, made by
// Django's own migrations): each holds, in its merger and its shards'
// schedulers, the file's and dcb's entries of the shards it leads and no
// others, while both report the conflicts of every shard, refuse a
// runtime entry that takes a file's name of a shard they do not lead, and
// list every entry of the cluster in the entries API and /status; a
// trigger asked of one for a dcb entry of the other's shard is sent; a
// row added to dcb, and an entry added to the file and reloaded, are held
// by their shard's leader alone; after a handover
// the moved shards' entries fire on the new leader (its terms' tokens);
// and every slot of every file and dcb entry is in Redis exactly once;
// with --source-write-back each shard's leader writes its dcb entries'
// runs back.
func TestShardShareSources(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd, Redis and a dcb database")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const (
		prefix = "/sharesrc/"
		n      = 4
		each   = 12 // file entries, and dcb entries
		both   = 4  // names in both, which the file wins
	)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "schedules.yaml")
	var yaml strings.Builder
	yaml.WriteString("defaults: {catchup: all}\nentries:\n")
	var fileNames, dcbNames, bothNames []string
	var orm strings.Builder
	orm.WriteString("iv, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds')\n")
	for i := range each {
		fileNames = append(fileNames, fmt.Sprintf("file-%02d", i))
		dcbNames = append(dcbNames, fmt.Sprintf("dcb-%02d", i))
	}
	for i := range both {
		bothNames = append(bothNames, fmt.Sprintf("both-%d", i))
	}
	for _, name := range slices.Concat(fileNames, bothNames) {
		fmt.Fprintf(&yaml, "  %s: {task: tasks.file, every: 1s}\n", name)
	}
	for _, name := range slices.Concat(dcbNames, bothNames) {
		fmt.Fprintf(&orm, "PeriodicTask.objects.create(name=%q, task='tasks.dcb', interval=iv)\n", name)
	}
	if err := os.WriteFile(cfgPath, []byte(yaml.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "dcb.sqlite3")
	dj := testutil.MustMigrateDjango(t, fmt.Sprintf(`{"ENGINE": "django.db.backends.sqlite3", "NAME": %q, "OPTIONS": {"timeout": 30}}`, dbPath))
	dj.ORM(t, orm.String())

	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix, "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", fmt.Sprint(n),
			"--source", sources.DCB+"=sqlite://"+dbPath, "--source-poll-interval", "200ms", "--source-write-back")
	}
	ctx := context.Background()
	// shardsOf is how many of names each shard has.
	shardsOf := func(names []string) []int {
		out := make([]int, n)
		for _, name := range names {
			out[keys.ShardOf(name, n)]++
		}
		return out
	}
	fromFile := slices.Concat(fileNames, bothNames) // the file wins both
	fromDCB := slices.Clone(dcbNames)
	// holds checks that m's merger and shards' schedulers hold the file's
	// and dcb's entries of the shards it leads alone.
	holds := func(m *Main) bool {
		files, dcbs := shardsOf(fromFile), shardsOf(fromDCB)
		heldFile, heldDCB := 0, 0
		for i := range n {
			want := 0
			if m.shards.leads(i) {
				want = files[i] + dcbs[i]
				heldFile += files[i]
				heldDCB += dcbs[i]
			}
			if got := gaugeOf(t, m, "beatd_entries", map[string]string{"shard": fmt.Sprint(i)}); got != float64(want) {
				return false
			}
		}
		return len(m.merger.File().Entries) == heldFile && len(m.runningConfig().Entries) == heldFile+heldDCB &&
			gaugeOf(t, m, "beatd_source_entries", map[string]string{"source": sources.File}) == float64(heldFile) &&
			gaugeOf(t, m, "beatd_source_entries", map[string]string{"source": sources.DCB}) == float64(heldDCB)
	}

	a := start("a")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads every shard, holding every entry", func() bool {
		return len(a.shards.leading()) == n && holds(a)
	})
	b := start("b")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b lead half the shards each, holding their entries alone", func() bool {
		return len(a.shards.leading()) == n/2 && len(b.shards.leading()) == n/2 && holds(a) && holds(b)
	})
	from := time.Now().Truncate(time.Second).Add(time.Second)
	everyName := slices.Sorted(slices.Values(slices.Concat(fileNames, dcbNames, bothNames)))

	// The catalog (what beatd next reads), which shard 0's leader
	// publishes, is the whole file, and counts every entry of the
	// cluster once, though that leader holds its shards' alone.
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the catalog published", func() bool {
		_, h, err := catalog.Load(ctx, a.etcd, prefix)
		return err == nil && h.Token != 0
	})
	published, h, err := catalog.Load(ctx, a.etcd, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if got := entryNamesOf(published); !slices.Equal(got, slices.Sorted(slices.Values(fromFile))) || h.Entries != len(everyName) {
		t.Errorf("the catalog has %v and counts %d entries, want the file's %v and %d", got, h.Entries, fromFile, len(everyName))
	}

	for _, m := range []*Main{a, b} {
		// Every name in both sources is a conflict, on either replica.
		var conflicts []string
		for _, c := range m.merger.Conflicts() {
			if c.Winner != sources.File {
				t.Errorf("%s: conflict %+v won by %s", m.ID, c, c.Winner)
			}
			conflicts = append(conflicts, c.Name)
		}
		if !slices.Equal(conflicts, bothNames) {
			t.Errorf("%s reports conflicts %v, want %v", m.ID, conflicts, bothNames)
		}
		// A runtime entry may not take a file's name, held or not.
		for _, name := range fileNames {
			_, err := m.entriesAPI().PutEntries(ctx, []api.EntryDoc{{Name: name, Spec: []byte(`{"task": "t", "every": "1h"}`)}}, nil)
			if !errors.Is(err, api.ErrFileOwned) {
				t.Errorf("%s: PUT of the file's %s (shard %d, led here %v): %v, want %v", m.ID, name, keys.ShardOf(name, n),
					m.shards.leads(keys.ShardOf(name, n)), err, api.ErrFileOwned)
			}
		}
		// The entries API and /status page through every entry.
		var listed []string
		q := api.ListQuery{Limit: 7}
		for {
			page, err := m.entriesAPI().ListEntries(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Entries {
				if !e.Active || e.Schedule == "" {
					t.Errorf("%s lists %s as not running: %q", m.ID, e.Name, e.Problem)
				}
				if want := map[bool]string{true: sources.DCB, false: sources.File}[strings.HasPrefix(e.Name, "dcb-")]; e.Source != want {
					t.Errorf("%s lists %s from %s, want %s", m.ID, e.Name, e.Source, want)
				}
				listed = append(listed, e.Name)
			}
			if page.Next == "" {
				break
			}
			q.After = page.Next
		}
		if !slices.Equal(listed, everyName) {
			t.Errorf("entries API on %s lists %v, want %v", m.ID, listed, everyName)
		}
		shown := statusPages(t, m, 9, len(everyName))
		if !slices.Equal(shown, everyName) {
			t.Errorf("/status on %s shows %v, want %v", m.ID, shown, everyName)
		}
	}

	// A trigger asked of a, for a dcb entry of one of b's shards, is sent.
	i := slices.IndexFunc(dcbNames, func(name string) bool { return b.shards.leads(keys.ShardOf(name, n)) })
	triggered := dcbNames[i]
	if _, err := a.api.Request(ctx, api.Action{Op: string(store.OpTrigger), Entry: triggered}); err != nil {
		t.Fatalf("trigger %s on a: %v", triggered, err)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the trigger sent", func() bool {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		return err == nil && slices.ContainsFunc(msgs, func(m chaos.Message) bool { return m.Manual && m.Entry == triggered })
	})

	// A row added to dcb is held by its shard's leader alone.
	// SQLite refuses a transaction that would deadlock with another
	// writer (the replicas' write-back) at once, whatever its timeout, as
	// it would refuse a Django app's: the insert is retried whole.
	dj.ORM(t, `import time
from django.db import OperationalError, transaction
for attempt in range(100):
    try:
        with transaction.atomic():
            iv = IntervalSchedule.objects.get(every=1, period='seconds')
            PeriodicTask.objects.create(name='dcb-new', task='tasks.dcb', interval=iv)
        break
    except OperationalError:
        time.sleep(0.05)
else:
    raise SystemExit('database stayed locked')
`)
	newShard := keys.ShardOf("dcb-new", n)
	fromDCB = append(fromDCB, "dcb-new")
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "dcb-new held by its shard's leader alone", func() bool {
		return holds(a) && holds(b) && (a.runningConfig().Entry("dcb-new") != nil) == a.shards.leads(newShard) &&
			(b.runningConfig().Entry("dcb-new") != nil) == b.shards.leads(newShard)
	})

	// A reload: an entry added to the file is held by its shard's leader
	// alone, and both know the file has it.
	if err := os.WriteFile(cfgPath, []byte(yaml.String()+"  file-new: {task: tasks.file, every: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Reload()
	b.Reload()
	fileShard := keys.ShardOf("file-new", n)
	fromFile = append(fromFile, "file-new")
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "file-new held by its shard's leader alone", func() bool {
		return holds(a) && holds(b) && (a.runningConfig().Entry("file-new") != nil) == a.shards.leads(fileShard) &&
			(b.runningConfig().Entry("file-new") != nil) == b.shards.leads(fileShard) && a.merger.FileHas("file-new") && b.merger.FileHas("file-new")
	})

	// b stops: a takes its shards and loads their file and dcb entries.
	moved := b.shards.leading()
	time.Sleep(time.Second)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads every shard again, holding every entry", func() bool {
		return len(a.shards.leading()) == n && holds(a)
	})
	// The moved shards' file and dcb entries fire on a, under its terms.
	firesOnA := func(names []string) bool {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		if err != nil {
			return false
		}
		for _, name := range names {
			i := keys.ShardOf(name, n)
			if !slices.ContainsFunc(moved, func(l shardLead) bool { return l.Shard == i }) {
				continue
			}
			if !slices.ContainsFunc(msgs, func(m chaos.Message) bool {
				return m.Entry == name && m.Slot.After(closed) && m.Token == a.shards.token(i)
			}) {
				return false
			}
		}
		return true
	}
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "the moved shards' entries fire on a", func() bool {
		return firesOnA(fromFile) && firesOnA(fromDCB)
	})
	// The audit wants at least three slots of each entry: when the
	// steps above ran fast, wait for them to come due (and their
	// messages, a second on) rather than audit a shorter window.
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "three slots of every entry due", func() bool {
		return !time.Now().Truncate(time.Second).Add(-time.Second).Before(from.Add(3 * time.Second))
	})
	to := time.Now().Truncate(time.Second).Add(-time.Second)

	// Every slot of every file and dcb entry, across the handover, once.
	msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
	if err != nil {
		t.Fatal(err)
	}
	var audited []*config.Entry
	for _, e := range a.runningConfig().Entries {
		if e.Name != "dcb-new" && e.Name != "file-new" {
			audited = append(audited, e)
		}
	}
	if len(audited) != len(everyName) {
		t.Fatalf("a runs %d entries, want %d", len(audited), len(everyName))
	}
	r := chaos.Audit(a.runningConfig().WithEntries(audited), slices.DeleteFunc(msgs, func(m chaos.Message) bool {
		return m.Manual || m.Entry == "dcb-new" || m.Entry == "file-new"
	}), from, to)
	if !r.OK || r.ExpectedSlots < len(everyName)*3 {
		t.Fatalf("audit of %d slots: %d duplicate (%v), %d missed (%v)", r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed)
	}
	t.Logf("audited %d slots of %d file and dcb entries across the handover of shards %v: 0 duplicate, 0 missed", r.ExpectedSlots, len(audited), moved)

	// Each shard's leader wrote its dcb entries' runs back to dcb (the
	// names the file wins run from the file, and are not written).
	testutil.EventuallyEvery(t, 10*time.Second, 200*time.Millisecond, "every dcb entry's runs written back", func() bool {
		out := dj.ORM(t, "print(PeriodicTask.objects.filter(name__startswith='dcb-', total_run_count__gt=0, last_run_at__isnull=False).count(), "+
			"PeriodicTask.objects.filter(name__startswith='both-', total_run_count__gt=0).count())")
		return strings.TrimSpace(out) == fmt.Sprintf("%d 0", len(fromDCB))
	})
}

// entryNamesOf is cfg's entries' names, in order.
func entryNamesOf(cfg *config.Config) []string {
	var out []string
	for _, e := range cfg.Entries {
		out = append(out, e.Name)
	}
	return out
}
