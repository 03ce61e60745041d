package reshard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxShards is the most shards a cluster may be resized to.
const MaxShards = 256

// ErrRefused means `beatd shards resize` changed nothing: the count
// asked for is out of bounds or the cluster's already, a replica runs, or
// another resize holds the lock.
var ErrRefused = errors.New("shards: resize refused")

// ErrResizing means a replica would not start: a resize runs, or one
// began and did not finish.
var ErrResizing = errors.New("shards: a resize is in progress or unfinished")

// resizeLockTTL is the lease of a resize's lock: a resize killed holds
// it this long, after which a rerun takes it and finishes the move.
const resizeLockTTL = 10 * time.Second

// Options configures Resize.
type Options struct {
	Client *clientv3.Client
	Prefix string // the cluster's (keys.Prefix)
	To     int
	By     string // who resizes: host and pid, shown to a concurrent resize
	Clock  clockwork.Clock
	MaxOps int // etcd's --max-txn-ops; store.MaxOpsPerTxn if 0
	// StepTimeout bounds each step of the resize, not the whole of it:
	// each etcd transaction, each delete of a chunk, each read of a
	// table (DefaultStepTimeout if 0). A resize of a million entries is
	// thousands of steps, and takes minutes; a stuck etcd still fails it
	// within one step's time.
	StepTimeout time.Duration
	Logger      *slog.Logger
	// RaiseFences raises the broker's fences of both counts' shards to at
	// least floor, before anything moves (nil: the broker needs none, as
	// RabbitMQ, whose term is checked in etcd). floor is the lock's
	// revision, above every token a replica of the old count held. It is
	// needed because an entry changes fence: a replica paused through the
	// resize (SIGSTOP past its TTL) wakes holding its old shard's fence,
	// which nobody raises until that shard is led again (never, past the
	// new count), with its entries' marks cached for its term; it could
	// then publish a slot of an entry that moved, which the entry's new
	// shard already published. Raised, its fence refuses it.
	RaiseFences func(ctx context.Context, floor int64, from, to int) error
	// StopAfter is for tests only: it ends the resize after a phase
	// ("staged", "cleared") as a kill would, leaving the plan and the
	// lock's lease, so a test can check that a rerun finishes it.
	StopAfter string
}

// Result is what a resize did.
type Result struct {
	From, To int
	Entries  int  // states moved
	Defs     int  // runtime entries' definitions moved
	Resumed  bool // an unfinished resize's plan was found and finished
	Took     time.Duration
}

// resizePlan is keys.ResizePlan's value.
type resizePlan struct {
	From   int  `json:"from"`
	To     int  `json:"to"`
	Staged bool `json:"staged"` // every state is in the staging table
	// Written: every new table and definition is written from the
	// staging copies, which only then are deleted (in chunks, before the
	// last transaction): a rerun after the mark only finishes deleting
	// them, and never rewrites the tables from a staging table half gone.
	Written bool      `json:"written,omitempty"`
	Since   time.Time `json:"since"`
	By      string    `json:"by"`
}

// DefaultStepTimeout is Options.StepTimeout's default.
const DefaultStepTimeout = time.Minute

// deletePage is the most keys one delete of a resize removes: etcd
// applies a delete of a prefix in one request however many keys it holds,
// and at 900,000 entries such deletes (the staging table, a shard's
// runtime entries) outlasted etcd's request timeout. A chunk is a range
// [first, last] read with this limit.
const deletePage = 5000

// resizeLock is keys.ResizeLock's value.
type resizeLock struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
	From  int       `json:"from"`
	To    int       `json:"to"`
}

// CheckCount refuses a shard count a cluster cannot have.
func CheckCount(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("%w: %d shards: a cluster has 1 to %d", ErrRefused, n, MaxShards)
	}
	return nil
}

// Resize moves a stopped cluster from its shard count to o.To: every
// entry's state goes from its old shard's table to its new one, every
// runtime entry's definition from its old shard's defs to its new one's
// (staged, cleared and rewritten with the states), and the
// count is written (deleted for one shard, which leaves the cluster as an
// unsharded one, key for key). It is offline: it refuses while any
// replica is registered or any election has a holder, and replicas
// refuse to start while it runs (checkShardCount).
//
// It is resumable, not one transaction (a table of a million entries is
// far past etcd's request limits). The plan (keys.ResizePlan) is written
// with the lock and deleted with the count's write, in one transaction,
// at the end; in between:
//  1. every old table is read and copied into one staging table, and the
//     plan marked staged; the old tables are not touched yet, so a rerun
//     before the mark copies them again;
//  2. every old and new table is cleared and the new tables written from
//     the staging table, which a rerun after the mark does again, and the
//     plan marked written;
//  3. the staging copies are deleted, which a rerun after that mark
//     finishes; then the last transaction, which stays small.
//
// Every delete is of at most deletePage keys, and every step has its own
// deadline (Options.StepTimeout), so no request grows with the cluster.
//
// Every write is guarded by the lock key's create revision (a fence), so
// a resize whose lease expired cannot write over the one that took over.
func Resize(ctx context.Context, o Options) (Result, error) {
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.MaxOps <= 0 {
		o.MaxOps = store.MaxOpsPerTxn
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = DefaultStepTimeout
	}
	start := o.Clock.Now()
	res := Result{To: o.To}
	if err := CheckCount(o.To); err != nil {
		return res, err
	}
	cli, prefix := o.Client, o.Prefix
	r := &resize{cli: cli, prefix: prefix, o: o, page: deletePage}
	sctx, cancel := r.step(ctx, 1)
	defer cancel()
	from, _, err := ReadCount(sctx, cli, prefix)
	if err != nil {
		return res, err
	}
	plan, havePlan, err := readPlan(sctx, cli, prefix)
	if err != nil {
		return res, err
	}
	switch {
	case havePlan && plan.To != o.To:
		return res, fmt.Errorf("%w: a resize from %d to %d shards began at %s (by %s) and did not finish; run `beatd shards resize %d` to finish it first",
			ErrRefused, plan.From, plan.To, plan.Since.Format(time.RFC3339), plan.By, plan.To)
	case havePlan:
		from, res.Resumed = plan.From, true
	case from == o.To:
		return res, fmt.Errorf("%w: the cluster at %s has a shard count of %d already", ErrRefused, prefix, from)
	default:
		plan = resizePlan{From: from, To: o.To, Since: start.UTC(), By: o.By}
	}
	res.From = from
	if err := checkStopped(sctx, cli, prefix); err != nil {
		return res, err
	}

	// The lock: on a lease kept alive while this runs, so a resize that
	// dies frees it a TTL later; written only while no replica is
	// registered and the unsharded election is empty.
	lctx, stopLease := context.WithCancel(ctx)
	defer stopLease()
	lease, err := cli.Grant(sctx, int64(resizeLockTTL/time.Second))
	if err != nil {
		return res, fmt.Errorf("shards: resize: grant the lock's lease: %w", err)
	}
	keep, err := cli.KeepAlive(lctx, lease.ID)
	if err != nil {
		return res, fmt.Errorf("shards: resize: keep the lock's lease: %w", err)
	}
	go func() { // ends when lctx does: KeepAlive closes keep
		for range keep {
		}
	}()
	lockKey, planKey := keys.ResizeLock(prefix), keys.ResizePlan(prefix)
	lockVal, _ := json.Marshal(resizeLock{By: o.By, Since: start.UTC(), From: from, To: o.To})
	planVal, _ := json.Marshal(plan)
	ops := []clientv3.Op{clientv3.OpPut(lockKey, string(lockVal), clientv3.WithLease(lease.ID))}
	if !havePlan {
		ops = append(ops, clientv3.OpPut(planKey, string(planVal)))
	}
	txn, err := cli.Txn(sctx).If(append(stoppedCmps(prefix), clientv3.Compare(clientv3.CreateRevision(lockKey), "=", 0))...).
		Then(ops...).Else(clientv3.OpGet(lockKey)).Commit()
	if err != nil {
		return res, fmt.Errorf("shards: resize: take the lock %s: %w", lockKey, err)
	}
	if !txn.Succeeded {
		if kvs := txn.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			var l resizeLock
			_ = json.Unmarshal(kvs[0].Value, &l)
			return res, fmt.Errorf("%w: a resize from %d to %d shards is in progress since %s by %s (%s); it frees the lock within %s of ending",
				ErrRefused, l.From, l.To, l.Since.Format(time.RFC3339), l.By, lockKey, resizeLockTTL)
		}
		return res, fmt.Errorf("%w: a replica started while the resize began; stop every replica first", ErrRefused)
	}
	cancel()
	r.fence = election.Fence{Key: lockKey, Token: txn.Header.Revision}
	o.Logger.Info("resize: lock taken", "from", from, "to", o.To, "resumed", res.Resumed)
	if o.RaiseFences != nil {
		sctx, cancel := r.step(ctx, 1)
		err := o.RaiseFences(sctx, r.fence.Token, from, o.To)
		cancel()
		if err != nil {
			return res, fmt.Errorf("shards: resize: raise the broker's fences to %d: %w", r.fence.Token, err)
		}
	}
	setPlan := func() error {
		planVal, _ := json.Marshal(plan)
		return r.fenced(ctx, clientv3.OpPut(planKey, string(planVal)))
	}

	if !plan.Staged {
		if err := r.stage(ctx, from); err != nil {
			return res, err
		}
		plan.Staged = true
		if err := setPlan(); err != nil {
			return res, err
		}
	}
	if o.StopAfter == "staged" {
		return res, errors.New("shards: resize: stopped after staging (test)")
	}
	if !plan.Written {
		if res.Entries, res.Defs, err = r.write(ctx, from); err != nil {
			return res, err
		}
		plan.Written = true
		if err := setPlan(); err != nil {
			return res, err
		}
	}
	if o.StopAfter == "written" {
		return res, errors.New("shards: resize: stopped after writing the new tables (test)")
	}
	// The staging copies go in chunks, so the last transaction is small.
	if _, err := r.clear(ctx, keys.ResizeStaging(prefix)); err != nil {
		return res, err
	}

	// The end, in one transaction: the count, and the plan and lock
	// gone (and what else is left under keys.Resize: nothing but them);
	// only while still no replica is registered.
	countOp := clientv3.OpDelete(keys.ShardCount(prefix))
	if o.To > 1 {
		countOp = clientv3.OpPut(keys.ShardCount(prefix), strconv.Itoa(o.To))
	}
	sctx, cancel = r.step(ctx, 1)
	defer cancel()
	txn, err = cli.Txn(sctx).If(append(stoppedCmps(prefix), r.fence.Held())...).
		Then(countOp, clientv3.OpDelete(keys.Resize(prefix), clientv3.WithPrefix())).Commit()
	if err != nil {
		return res, fmt.Errorf("shards: resize: write the count: %w", err)
	}
	if !txn.Succeeded {
		return res, fmt.Errorf("shards: resize: a replica registered, or the lock was lost, before the count was written; stop every replica and rerun `beatd shards resize %d` to finish", o.To)
	}
	stopLease()
	rctx, cancelRevoke := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancelRevoke()
	_, _ = cli.Revoke(rctx, lease.ID) // its key is deleted: this only frees the lease early
	res.Took = o.Clock.Since(start)
	o.Logger.Info("resize: done", "from", from, "to", o.To, "entries", res.Entries, "defs", res.Defs, "took", res.Took)
	return res, nil
}

// resize is one run of Resize once it holds the lock.
type resize struct {
	cli    *clientv3.Client
	prefix string
	o      Options
	fence  election.Fence // the lock key's create revision
	page   int            // deletePage; a test's is smaller
}

// stepEntries is how many entries' states a table read or write of a
// resize moves per StepTimeout: store.Load and store.Save read and write
// a whole table, in pages and transactions of their own, under one
// context, so their deadline grows with the table.
const stepEntries = 100_000

// step is the context of one step of the resize: steps StepTimeouts (a
// table of n entries: 1 + n/stepEntries).
func (r *resize) step(ctx context.Context, steps int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, time.Duration(max(steps, 1))*r.o.StepTimeout)
}

// stage copies every old shard's table into the staging table, and its
// runtime entries' definitions into the staging definitions, replacing
// any copy a killed run left. The old tables are not touched.
func (r *resize) stage(ctx context.Context, from int) error {
	cli, prefix, o := r.cli, r.prefix, r.o
	t := store.NewTable()
	for i := range from {
		sctx, cancel := r.step(ctx, 1)
		old, err := store.New(cli, keys.Shard(prefix, i, from)).Load(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("shards: resize: read shard %d of %d: %w", i, from, err)
		}
		old.Range(func(st store.EntryState) bool { t.Set(st); return true })
	}
	t.Fit()
	// A run killed in this phase left part of a staging table: it is
	// written again whole.
	if _, err := r.clear(ctx, keys.ResizeStaging(prefix)); err != nil {
		return err
	}
	sctx, cancel := r.step(ctx, 1+t.Len()/stepEntries)
	err := store.New(cli, keys.ResizeStaging(prefix)).WithMaxOps(o.MaxOps).Save(sctx, r.fence, t, nil)
	cancel()
	if err != nil {
		return fmt.Errorf("shards: resize: stage %d states: %w", t.Len(), err)
	}
	// The runtime entries' definitions are staged beside the states: each
	// shard's keys.Defs, which the old tables' shards keep until the plan
	// says staged. Each shard's is read whole before any is written, at
	// one revision, in pages.
	var puts []clientv3.Op
	for i := range from {
		p := keys.Defs(keys.Shard(prefix, i, from))
		sctx, cancel := r.step(ctx, 1)
		_, err := etcdscan.Prefix(sctx, cli, p, defsPage, func(kv *mvccpb.KeyValue) {
			puts = append(puts, clientv3.OpPut(stagingDefs(prefix)+strings.TrimPrefix(string(kv.Key), p), string(kv.Value)))
		})
		cancel()
		if err != nil {
			return fmt.Errorf("shards: resize: read shard %d of %d's runtime entries: %w", i, from, err)
		}
	}
	if err := r.fencedBatches(ctx, puts); err != nil {
		return fmt.Errorf("shards: resize: stage %d runtime entries: %w", len(puts), err)
	}
	o.Logger.Info("resize: staged", "entries", t.Len(), "defs", len(puts))
	return nil
}

// write clears every table and definitions of both counts (a shard's
// prefix does not name its count: shard 3 of 4 and of 8 share one), and
// writes the new ones from the staging copies; a rerun does it again. It
// returns the states and definitions written.
func (r *resize) write(ctx context.Context, from int) (states, defs int, err error) {
	cli, prefix, o := r.cli, r.prefix, r.o
	sctx, cancel := r.step(ctx, 1)
	all, err := store.New(cli, keys.ResizeStaging(prefix)).Load(sctx)
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("shards: resize: read the staging table: %w", err)
	}
	tables := map[string]bool{}
	for _, n := range []int{from, o.To} {
		for i := range n {
			tables[keys.Shard(prefix, i, n)] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(tables)) {
		for _, sub := range []string{keys.State(p), keys.LegacyEntries(p), keys.Defs(p)} {
			if _, err := r.clear(ctx, sub); err != nil {
				return 0, 0, err
			}
		}
	}
	if o.StopAfter == "cleared" {
		return 0, 0, errors.New("shards: resize: stopped after clearing the tables (test)")
	}
	parts := make([]*store.Table, o.To)
	for i := range parts {
		parts[i] = store.NewTable()
	}
	all.Range(func(st store.EntryState) bool { parts[keys.ShardOf(st.Name, o.To)].Set(st); return true })
	for i, t := range parts {
		t.Fit()
		sctx, cancel := r.step(ctx, 1+t.Len()/stepEntries)
		err := store.New(cli, keys.Shard(prefix, i, o.To)).WithMaxOps(o.MaxOps).Save(sctx, r.fence, t, nil)
		cancel()
		if err != nil {
			return 0, 0, fmt.Errorf("shards: resize: write shard %d of %d: %w", i, o.To, err)
		}
	}
	// Each definition goes to its shard among o.To, from the staging
	// copy, which a rerun before the plan says written writes again.
	var puts []clientv3.Op
	sctx, cancel = r.step(ctx, 1)
	_, err = etcdscan.Prefix(sctx, cli, stagingDefs(prefix), defsPage, func(kv *mvccpb.KeyValue) {
		name := strings.TrimPrefix(string(kv.Key), stagingDefs(prefix))
		puts = append(puts, clientv3.OpPut(keys.Defs(keys.Shard(prefix, keys.ShardOf(name, o.To), o.To))+name, string(kv.Value)))
	})
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("shards: resize: read the staged runtime entries: %w", err)
	}
	if err := r.fencedBatches(ctx, puts); err != nil {
		return 0, 0, fmt.Errorf("shards: resize: write %d runtime entries: %w", len(puts), err)
	}
	o.Logger.Info("resize: written", "entries", all.Len(), "defs", len(puts))
	return all.Len(), len(puts), nil
}

// clear deletes every key under p in chunks of at most r.page keys:
// a keys-only read of that many, then a fenced delete of the range from
// the first key read to the last. Nothing else writes under the cluster
// while the resize holds its lock (every write of a replica needs a
// registration or an election key, which the fence's comparisons refuse),
// so a range holds the keys read and no others. It returns the
// deletes it made.
func (r *resize) clear(ctx context.Context, p string) (chunks int, err error) {
	from, end := p, clientv3.GetPrefixRangeEnd(p)
	for {
		sctx, cancel := r.step(ctx, 1)
		resp, err := r.cli.Get(sctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(r.page)))
		cancel()
		if err != nil {
			return chunks, fmt.Errorf("shards: resize: read the keys of %s to delete: %w", p, err)
		}
		if len(resp.Kvs) == 0 {
			return chunks, nil
		}
		last := string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		if err := r.fenced(ctx, clientv3.OpDelete(string(resp.Kvs[0].Key), clientv3.WithRange(last))); err != nil {
			return chunks, err
		}
		chunks++
		if !resp.More {
			return chunks, nil
		}
		from = last
	}
}

// defsPage is how many definitions one read of a resize takes.
const defsPage = 5000

// stagingDefs is where a resize stages the runtime entries' definitions.
func stagingDefs(prefix string) string { return keys.Defs(keys.ResizeStaging(prefix)) }

// fencedBatches commits ops in transactions of at most MaxOps, each
// fenced and each its own step.
func (r *resize) fencedBatches(ctx context.Context, ops []clientv3.Op) error {
	for len(ops) > 0 {
		n := min(len(ops), r.o.MaxOps)
		if err := r.fenced(ctx, ops[:n]...); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// fenced commits ops, as one step, while the resize holds its lock and
// no replica has registered since it began (a replica that read no
// resize an instant before the lock was taken): then the resize stops
// where it is, and the plan makes replicas refuse to start until it is
// finished.
func (r *resize) fenced(ctx context.Context, ops ...clientv3.Op) error {
	sctx, cancel := r.step(ctx, 1)
	defer cancel()
	txn, err := r.cli.Txn(sctx).If(append(stoppedCmps(r.prefix), r.fence.Held())...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("shards: resize: %d ops: %w", len(ops), err)
	}
	if !txn.Succeeded {
		return fmt.Errorf("shards: resize: the lock %s was lost (its lease expired) or a replica registered; stop every replica and rerun to finish", r.fence.Key)
	}
	return nil
}

// stoppedCmps holds while no replica is registered and the unsharded
// election is empty. A replica registers as it starts to campaign, so no
// registration also means no shard leader but a dead one's, whose key
// checkStopped finds.
func stoppedCmps(prefix string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(keys.Replicas(prefix)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(keys.Leaders(prefix)), "=", 0).WithPrefix(),
	}
}

// checkStopped refuses while any replica is registered or any election
// (the unsharded one, or any of MaxShards shards') has a candidate.
func checkStopped(ctx context.Context, cli *clientv3.Client, prefix string) error {
	reps, err := election.Replicas(ctx, cli, prefix)
	if err != nil {
		return fmt.Errorf("shards: resize: read the replicas: %w", err)
	}
	if len(reps) > 0 {
		ids := make([]string, len(reps))
		for i, r := range reps {
			ids[i] = r.ID
		}
		return fmt.Errorf("%w: %d replica(s) registered (%s): running, or stopped less than its lease TTL ago; resize is offline; stop every replica first", ErrRefused, len(reps), strings.Join(ids, ", "))
	}
	elections := []string{keys.Leaders(prefix)}
	for i := range MaxShards {
		elections = append(elections, keys.Leaders(keys.Shard(prefix, i, MaxShards)))
	}
	var held *mvccpb.KeyValue
	var at string
	_, err = etcdscan.Prefixes(ctx, cli, elections, func(i int, kvs []*mvccpb.KeyValue) {
		if len(kvs) > 0 && held == nil {
			held, at = kvs[0], elections[i]
		}
	}, clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return fmt.Errorf("shards: resize: read the elections: %w", err)
	}
	if held != nil {
		return fmt.Errorf("%w: the election %s has a candidate (%s): a replica runs, or died less than its lease TTL ago; stop every replica first",
			ErrRefused, at, held.Key)
	}
	return nil
}

// ReadCount is the cluster's shard count, and whether it is
// recorded (keys.ShardCount; a cluster without the key has 1).
func ReadCount(ctx context.Context, cli *clientv3.Client, prefix string) (n int, recorded bool, err error) {
	key := keys.ShardCount(prefix)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return 0, false, fmt.Errorf("shards: read the cluster's shard count (%s): %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 1, false, nil
	}
	n, err = strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil || n < 1 {
		return 0, false, fmt.Errorf("shards: the cluster's shard count at %s is %q, not a count", key, resp.Kvs[0].Value)
	}
	return n, true, nil
}

// readPlan reads an unfinished resize's plan.
func readPlan(ctx context.Context, cli *clientv3.Client, prefix string) (resizePlan, bool, error) {
	var p resizePlan
	key := keys.ResizePlan(prefix)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return p, false, fmt.Errorf("shards: read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return p, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil || p.To < 1 || p.From < 1 {
		return p, false, fmt.Errorf("shards: %s holds %q, not a resize plan", key, resp.Kvs[0].Value)
	}
	return p, true, nil
}

// Info is `beatd shards show`: the count, and a resize begun.
type Info struct {
	Count    int  `json:"count"`
	Resizing *Run `json:"resize,omitempty"`
}

// Run is a resize in progress or unfinished.
type Run struct {
	From    int       `json:"from"`
	To      int       `json:"to"`
	Since   time.Time `json:"since"`
	By      string    `json:"by"`
	Staged  bool      `json:"staged"`
	Running bool      `json:"running"` // its lock is held
}

// String is the resize as `beatd shards show` prints it after "resize: ".
func (r Run) String() string {
	state := "unfinished (its process is gone): rerun `beatd shards resize " + strconv.Itoa(r.To) + "`"
	if r.Running {
		state = "running"
	}
	return fmt.Sprintf("%d -> %d since %s by %s, %s", r.From, r.To, r.Since.Format(time.RFC3339), r.By, state)
}

// Show reads the cluster's count and any resize begun.
func Show(ctx context.Context, cli *clientv3.Client, prefix string) (Info, error) {
	var info Info
	n, _, err := ReadCount(ctx, cli, prefix)
	if err != nil {
		return info, err
	}
	info.Count = n
	plan, ok, err := readPlan(ctx, cli, prefix)
	if err != nil || !ok {
		return info, err
	}
	lock, err := cli.Get(ctx, keys.ResizeLock(prefix), clientv3.WithCountOnly())
	if err != nil {
		return info, fmt.Errorf("shards: read the resize lock: %w", err)
	}
	info.Resizing = &Run{From: plan.From, To: plan.To, Since: plan.Since, By: plan.By, Staged: plan.Staged, Running: lock.Count > 0}
	return info, nil
}

// CheckNotResizing refuses a replica's start while a resize runs or one
// is unfinished: the state tables are half moved.
func CheckNotResizing(ctx context.Context, cli *clientv3.Client, prefix string) error {
	resp, err := cli.Get(ctx, keys.Resize(prefix), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return fmt.Errorf("shards: read %s: %w", keys.Resize(prefix), err)
	}
	if len(resp.Kvs) > 0 {
		return fmt.Errorf("%w (%s): run `beatd shards show`, and finish it with `beatd shards resize M`", ErrResizing, resp.Kvs[0].Key)
	}
	return nil
}
