package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/retry"
	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
)

// A publish is an optimistic transaction per flight of fires: WATCH the
// fence, read it and every key a fire's dedup reads, decide in Go, then
// write everything in one MULTI/EXEC. If the fence changed in between (a
// new leader raised it), EXEC does nothing and the flight is read and
// decided again, and then finds itself stale. That is as atomic as a
// script against another leader: a deposed leader either sees the higher
// fence when it reads, or has its EXEC refused.
//
// Only the fence is watched. The entries' histories, triggers and cursors
// are written by no one but the fence's holder, and within one Publisher
// by one publish at a time (Publisher.mu), whose flights hold disjoint
// entries (callPlan). Watching them too cost Redis more than anything
// else per fire: Redis 7.0 checks each key of a WATCH against every key
// the connection already watches, so a flight's 129 keys took ~8,000
// string comparisons.
//
// It replaced a Lua script because Redis turns every argument of a script
// into a Lua string, and Redis 7's Lua hashes each string's every byte
// (the hash-flooding fix): a fire's ~1 KB message cost Redis more to enter
// the script than to push. With the message going straight to a native,
// variadic LPUSH, Redis spends about a third of the CPU per fire
// (docs/performance.md).
//
// Per flight, Redis sees two round trips. First WATCH, GET fence, TYPE of
// each queue, LINDEX of the newest run record (the mark and run count) of
// each entry this term has not published yet, and the trigger, backfill
// or legacy dedup key of the fires that have one. Then MULTI, one LPUSH
// per queue with all of its fresh messages, and per fresh fire its run
// record (LPUSH), an LTRIM every History runs, and its trigger, cursor or
// legacy key; EXEC.
//
// The marks a term wrote itself it remembers (marks): no one else writes
// them while its fence holds, so a busy entry costs one LINDEX a term,
// not one a fire. Only a fire Redis took for certain updates the cache;
// an error, a replica shortfall or Forget drops the entry from it, and
// the next publish reads Redis again.
//
// The queue's type is checked before the push, since a push that fails
// inside EXEC cannot hold back the run record that advances the mark: a
// queue of another type leaves its fires pending (-2), as the script did.
// Only a queue key retyped between the read and the EXEC, microseconds
// apart, would lose that flight's messages for it; the error is returned.

// txAttempts bounds how often a flight whose EXEC was refused (the fence
// changed) is read and decided again before its fires are left pending
// with an error. A refusal needs a fence raise between the read and the
// EXEC: a new leader, and the retry then finds the fence stale.
const txAttempts = 10

// txBackoffMin and txBackoffMax bound the wait between attempts: ten
// attempts span about 40 ms at most.
const (
	txBackoffMin = 100 * time.Microsecond
	txBackoffMax = 10 * time.Millisecond
)

// Per-fire outcomes, as the script returned them.
const (
	outPushed    = 1
	outDuplicate = 0
	outStale     = -1
	outFailed    = -2
)

// flight is one transaction's fires: positions in fires, their encoded
// messages and run records, and their outcomes. Flights are pooled with
// their plan: the slices keep their arrays from publish to publish.
type flight struct {
	idx   []int    // indexes into the Publish's fires, each entry's adjacent, in slot order
	msgs  [][]byte // per position: the message
	recs  [][]byte // per position: the run record as Go knows it (appendRun)
	out   []int8   // per position: outPushed ... outFailed
	grp   []int32  // per position: its entry's index in ents
	ents  []entryState
	binds []binding
	// failure says why fires of a flight that otherwise ran got
	// outFailed (a queue of another type); nil when none did.
	failure error
	// wait is the flight's WAIT, when replicas are waited for.
	wait *redis.IntCmd

	buf []byte // the messages and records are spans of it

	keys []string // per position: the fire's dedupKey, "" for most

	// scratch, reused by every attempt
	extra  []redis.Cmder // per position: the trigger, cursor or legacy read
	queues []queuePush
	recbuf []byte
}

// entryState is what a flight knows of one entry while it decides: its
// mark and run count, from the term's cache or its newest record, and
// then from its own pushes.
type entryState struct {
	name   string
	hist   string
	head   *redis.StringCmd // the newest record, when not cached
	counts *redis.StringCmd // the previous release's run count, when the head has none
	m      mark
	base   mark        // the cached mark each attempt starts from
	slot   *cachedMark // where the cache holds it
	cached bool        // base came from the term's cache
	known  bool        // m.runs is known (cached, a head of this release's format, or counted)
	failed bool        // a push of this entry failed: its later fires are not attempted
}

// mark is an entry's high-water mark and run count.
type mark struct {
	slot int64 // Unix microseconds of the last scheduled slot published
	has  bool  // false before the first scheduled publish
	runs int64
}

// queuePush is one queue's part of a flight: its type, read before the
// push, and the LPUSH of its fresh messages.
type queuePush struct {
	key  string
	typ  *redis.StatusCmd
	args []any // "lpush", key, then the messages
	who  []int // the positions pushed
	cmd  *redis.IntCmd
}

// publishFlight runs fl's transaction, again while EXEC is refused.
func (p *Publisher) publishFlight(ctx context.Context, token int64, fires []celery.Fire, fl *flight, legacy bool, want int) error {
	var (
		err  error
		wait *backoff.ExponentialBackOff
	)
	for range txAttempts {
		// decide sends the WATCH itself, with its reads: Client.Watch
		// would spend a round trip of its own on it, a third of a
		// flight's (docs/performance.md).
		err = p.rdb.Watch(ctx, func(tx *redis.Tx) error {
			err := p.decide(ctx, tx, token, fires, fl, legacy, want)
			if err != nil && !errors.Is(err, redis.TxFailedErr) {
				// No EXEC ended the WATCH: the connection goes back to
				// the pool, and must not take it along.
				_ = tx.Unwatch(ctx).Err()
			}
			return err
		}, p.watchKeys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		// The jittered backoff spreads attempts that would collide again.
		if wait == nil {
			wait = retry.Backoff(txBackoffMin, txBackoffMax)
		}
		if !retry.Sleep(ctx, p.clock, wait.NextBackOff()) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("redis: %d attempts refused (the fence kept changing): %w", txAttempts, err)
}

// dedupKey is the key besides the mark that decides whether f is new: a
// manual fire's trigger key, a backfill's cursor, or in the legacy window
// the previous release's per-fire key. "" for a scheduled fire otherwise.
// f must be encoded: a manual fire without a request is keyed by the task
// id its message carries.
func (p *Publisher) dedupKey(f *celery.Fire, legacy bool) string {
	switch {
	case f.Manual:
		return p.TriggerKey(f.RequestKey())
	case f.Backfill != "":
		return p.BackfillKey(f.Backfill)
	case legacy:
		return p.DedupKey(f.ID)
	}
	return ""
}

// decide is one attempt: read, decide each fire, write. It returns
// redis.TxFailedErr when EXEC was refused.
func (p *Publisher) decide(ctx context.Context, tx *redis.Tx, token int64, fires []celery.Fire, fl *flight, legacy bool, want int) error {
	fl.failure, fl.wait = nil, nil
	// Reads.
	reads := tx.Pipeline()
	// WATCH runs before the reads, in their round trip: a fence raised
	// after it fails the EXEC, one raised before it is read.
	_ = reads.Process(ctx, redis.NewStatusCmd(ctx, "watch", p.fenceKey))
	fence := reads.Get(ctx, p.fenceKey)
	fl.queues = fl.queues[:0]
	for k := range fl.ents {
		e := &fl.ents[k]
		e.head, e.counts, e.failed = nil, nil, false
		if e.cached {
			e.m = e.base // a refused attempt advanced m
		} else {
			e.head = reads.LIndex(ctx, e.hist, 0)
		}
	}
	for j, i := range fl.idx {
		f := &fires[i]
		if fl.queue(f.Task.QueueKey) == nil {
			fl.addQueue(f.Task.QueueKey, reads.Type(ctx, f.Task.QueueKey))
		}
		switch k := fl.keys[j]; {
		case k == "":
			fl.extra[j] = nil
		case f.Backfill != "":
			fl.extra[j] = reads.Get(ctx, k)
		default:
			fl.extra[j] = reads.Exists(ctx, k)
		}
	}
	if err := execReads(ctx, reads); err != nil {
		return err
	}
	cur, err := fence.Int64()
	if errors.Is(err, redis.Nil) {
		cur, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("read the fence: %w", err)
	}
	if token < cur {
		for j := range fl.out {
			fl.out[j] = outStale
		}
		return tx.Unwatch(ctx).Err()
	}
	// An entry whose newest record has no run count (none yet, or the
	// previous release's format) carries on from that release's count.
	var counts redis.Pipeliner
	for k := range fl.ents {
		e := &fl.ents[k]
		if e.cached {
			continue
		}
		head, err := e.head.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("read %s's mark: %w", e.name, err)
		}
		if e.m, e.known = parseHead(head); !e.known {
			if counts == nil {
				counts = tx.Pipeline()
			}
			e.counts = counts.HGet(ctx, p.countsKey(), e.name)
		}
	}
	if counts != nil {
		if err := execReads(ctx, counts); err != nil {
			return err
		}
	}

	// Decide, and queue the writes.
	w := tx.TxPipeline()
	tok := strconv.FormatInt(token, 10)
	if token > cur {
		w.Set(ctx, p.fenceKey, tok, 0)
		w.Set(ctx, p.slotsTermKey(), tok, 0)
	}
	for _, b := range fl.binds {
		w.SAdd(ctx, b.key, b.member)
	}
	var (
		claimed map[string]bool  // trigger keys claimed earlier in this flight
		cursors map[string]int64 // backfill cursors moved earlier in this flight
	)
	recs := fl.recbuf[:0]
	writes := false
	for j, i := range fl.idx {
		f := &fires[i]
		e := &fl.ents[fl.grp[j]]
		if e.failed {
			fl.out[j] = outFailed
			continue
		}
		fresh := false
		slot := f.Slot.UnixMicro()
		switch {
		case f.Manual:
			fresh = fl.extra[j].(*redis.IntCmd).Val() == 0 && !claimed[fl.keys[j]]
			if fresh {
				if claimed == nil {
					claimed = map[string]bool{}
				}
				claimed[fl.keys[j]] = true
			}
		case f.Backfill != "":
			c, ok := cursors[f.Backfill]
			if !ok {
				v, err := fl.extra[j].(*redis.StringCmd).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					return fmt.Errorf("read backfill %s's cursor: %w", f.Backfill, err)
				}
				c, _ = strconv.ParseInt(v, 10, 64) // none or unreadable: the job starts
			}
			fresh = c < slot
		default:
			fresh = !e.m.has || e.m.slot < slot
			if fresh && legacy && fl.extra[j].(*redis.IntCmd).Val() == 1 {
				fresh = false
			}
		}
		if !fresh {
			fl.out[j] = outDuplicate
			continue
		}
		q := fl.queue(f.Task.QueueKey)
		if t := q.typ.Val(); t != "list" && t != "none" {
			// Not pushed, and nothing of the fire is written: it stays
			// pending, and the entry's later fires wait behind it.
			if fl.failure == nil {
				fl.failure = fmt.Errorf("entry %q: LPUSH to %s failed (does the key hold another type?)", f.Task.Name, q.key)
			}
			fl.out[j] = outFailed
			if !f.Manual {
				e.failed = true
			}
			continue
		}
		if len(q.args) == 0 {
			q.args = append(q.args, "lpush", q.key)
		}
		q.args = append(q.args, fl.msgs[j])
		q.who = append(q.who, j)
		if !e.known {
			n, err := e.counts.Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("read %s's run count: %w", e.name, err)
			}
			e.m.runs, e.known = n, true
			w.HSet(ctx, p.entriesKey(), e.name, 1)
		}
		switch {
		case f.Manual:
			w.Set(ctx, fl.keys[j], tok, p.trigTTL)
		case f.Backfill != "":
			if cursors == nil {
				cursors = map[string]int64{}
			}
			cursors[f.Backfill] = slot
			w.Set(ctx, fl.keys[j], slot, p.dedupTTL)
		default:
			e.m.slot, e.m.has = slot, true
			if legacy {
				w.Set(ctx, fl.keys[j], tok, p.dedupTTL)
			}
		}
		e.m.runs++
		start := len(recs)
		if e.m.has {
			recs = strconv.AppendInt(recs, e.m.slot, 10)
		}
		recs = append(recs, ' ')
		recs = strconv.AppendInt(recs, e.m.runs, 10)
		recs = append(recs, ' ')
		recs = append(recs, fl.recs[j]...)
		// The spans stay valid if recs grows: they keep the array they
		// were cut from.
		w.LPush(ctx, e.hist, recs[start:len(recs):len(recs)])
		// Every keepTrim runs rather than when the list is long: the
		// length is not known inside the transaction. The list stays
		// under twice the history length.
		if e.m.runs%int64(p.keepTrim) == 0 {
			w.LTrim(ctx, e.hist, 0, int64(p.keepTrim-1))
		}
		fl.out[j] = outPushed
		writes = true
	}
	fl.recbuf = recs[:0]
	for k := range fl.queues {
		q := &fl.queues[k]
		if len(q.args) > 0 {
			q.cmd = redis.NewIntCmd(ctx, q.args...)
			_ = w.Process(ctx, q.cmd)
		}
	}
	if want > 0 {
		// WAIT waits for this connection's last write: the marker makes
		// a flight of duplicates wait for what it found too.
		w.Set(ctx, p.repl.syncKey, tok, 0)
		writes = true
	}
	if writes || token > cur || len(fl.binds) > 0 {
		cmds, err := w.Exec(ctx)
		if err != nil && !isCommandErr(err) {
			if redis.IsExecAbortError(err) {
				// A queued command was refused (MOVED, NOPERM, OOM): say which.
				for _, c := range cmds {
					if ce := c.Err(); ce != nil && !redis.IsExecAbortError(ce) {
						return fmt.Errorf("%s: %w (EXEC aborted)", c.Name(), ce)
					}
				}
			}
			return err // refused (TxFailedErr), or the connection failed
		}
		// A command that failed inside EXEC (a queue retyped after the
		// check) failed the fires it carried, and the records of the
		// flight were written all the same: say so, and let the entries
		// be read again.
		for _, c := range cmds {
			if ce := c.Err(); ce != nil {
				switch name := c.Name(); name {
				case "lpush", "ltrim":
					for _, j := range fl.positionsOf(c) {
						fl.out[j] = outFailed
					}
					fl.failure = fmt.Errorf("%s %v failed inside the transaction: %w", name, c.Args()[1], ce)
				}
			}
		}
	} else if err := tx.Unwatch(ctx).Err(); err != nil {
		return err
	}
	if want > 0 {
		// WAIT holds the connection, and blocks Redis for nobody; the
		// publish judges every flight's count together (run).
		pipe := tx.Pipeline()
		fl.wait = p.repl.queueWait(ctx, pipe, want)
		_, _ = pipe.Exec(ctx)
	}
	return nil
}

// addQueue adds queue key's part, reusing a pooled one's slices.
func (fl *flight) addQueue(key string, typ *redis.StatusCmd) {
	n := len(fl.queues)
	if n < cap(fl.queues) {
		fl.queues = fl.queues[:n+1]
	} else {
		fl.queues = append(fl.queues, queuePush{})
	}
	q := &fl.queues[n]
	clear(q.args)
	q.key, q.typ, q.args, q.who, q.cmd = key, typ, q.args[:0], q.who[:0], nil
}

// queue returns the flight's part for queue key, or nil.
func (fl *flight) queue(key string) *queuePush {
	for k := range fl.queues {
		if fl.queues[k].key == key {
			return &fl.queues[k]
		}
	}
	return nil
}

// positionsOf lists the positions whose fires a failed command of the
// transaction carried: a queue's LPUSH carries its messages, a history's
// LPUSH or LTRIM every fire of that entry.
func (fl *flight) positionsOf(c redis.Cmder) []int {
	key := fmt.Sprint(c.Args()[1])
	for k := range fl.queues {
		if q := &fl.queues[k]; q.cmd == c {
			return q.who
		}
	}
	var out []int
	for j := range fl.idx {
		if fl.ents[fl.grp[j]].hist == key && fl.out[j] == outPushed {
			out = append(out, j)
		}
	}
	return out
}

// execReads runs a pipeline of reads; a missing key (redis.Nil) is an
// answer, not an error.
func execReads(ctx context.Context, pipe redis.Pipeliner) error {
	cmds, err := pipe.Exec(ctx)
	if err == nil || errors.Is(err, redis.Nil) {
		return nil
	}
	for _, c := range cmds {
		if e := c.Err(); e != nil && !errors.Is(e, redis.Nil) {
			return e
		}
	}
	return err
}

// isCommandErr reports whether EXEC ran and err is only a queued
// command's own error (its outcome is read from each command).
func isCommandErr(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.TxFailedErr) && !redis.IsExecAbortError(err)
}

// parseHead reads the mark and run count that lead a run record of this
// release ("<mark> <runs> ..."); known is false for no record or the
// previous release's format, which carried no count.
func parseHead(head string) (m mark, known bool) {
	i := 0
	for i < len(head) && head[i] >= '0' && head[i] <= '9' {
		i++
	}
	if i == len(head) || head[i] != ' ' {
		return mark{}, false
	}
	j := i + 1
	for j < len(head) && head[j] >= '0' && head[j] <= '9' {
		j++
	}
	if j == i+1 || j == len(head) || head[j] != ' ' {
		return mark{}, false
	}
	runs, err := strconv.ParseInt(head[i+1:j], 10, 64)
	if err != nil {
		return mark{}, false
	}
	m.runs = runs
	if i > 0 {
		// An unreadable mark (past int64) is below every slot, as Lua's
		// comparison made it: it fails open for the slot rather than
		// hold the entry forever.
		if v, err := strconv.ParseInt(head[:i], 10, 64); err == nil {
			m.slot, m.has = v, true
		}
	}
	return m, true
}

// results turns the flight's outcomes into results.
func (fl *flight) results(results []broker.Result) {
	for j, i := range fl.idx {
		switch fl.out[j] {
		case outPushed:
			results[i] = broker.ResultOK
		case outDuplicate:
			results[i] = broker.ResultDuplicate
		case outStale:
			results[i] = broker.ResultStale
		default:
			results[i] = broker.ResultError
		}
	}
}
