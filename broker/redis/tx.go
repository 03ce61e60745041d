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
	"github.com/jonboulle/clockwork"
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
// Per flight, Redis sees: WATCH; GET fence, TYPE of each queue, LINDEX of
// each entry's newest run record (its mark and run count) and the
// trigger, backfill or legacy dedup key of the fires that have one; then
// MULTI, one LPUSH per queue with all of its fresh messages, and per
// fresh fire its run record (LPUSH), an LTRIM every History runs, and
// its trigger, cursor or legacy key; EXEC.
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
// messages and run records, and their outcomes.
type flight struct {
	idx   []int    // indexes into the Publish's fires, each entry's in slot order
	msgs  [][]byte // per position: the message
	recs  [][]byte // per position: the run record as Go knows it (appendRun)
	out   []int8   // per position: outPushed ... outFailed
	binds []binding
	// failure says why fires of a flight that otherwise ran got
	// outFailed (a queue of another type); nil when none did.
	failure error
	// wait is the flight's WAIT, when replicas are waited for.
	wait *redis.IntCmd
}

// entryState is what a flight knows of one entry while it decides: its
// mark and run count, from its newest record and then its own pushes.
type entryState struct {
	head   *redis.StringCmd
	counts *redis.StringCmd // the previous release's run count, when the head has none
	mark   string           // "" before the first scheduled publish
	runs   int64
	known  bool // runs is known (a head of this release's format, or counted)
	failed bool // a push of this entry failed: its later fires are not attempted
}

// publishFlight runs fl's transaction, again while EXEC is refused.
func (p *Publisher) publishFlight(ctx context.Context, token int64, fires []celery.Fire, fl *flight, legacy bool, want int) error {
	var (
		err  error
		wait *backoff.ExponentialBackOff
	)
	for range txAttempts {
		err = p.rdb.Watch(ctx, func(tx *redis.Tx) error {
			return p.decide(ctx, tx, token, fires, fl, legacy, want)
		}, p.fenceKey)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		// The jittered backoff spreads attempts that would collide again.
		// It spaces attempts at Redis and reads no schedule time, so it
		// is on the real clock (a test's fake clock would stall the
		// publish).
		if wait == nil {
			wait = retry.Backoff(txBackoffMin, txBackoffMax)
		}
		if !retry.Sleep(ctx, clockwork.NewRealClock(), wait.NextBackOff()) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("publisher: %d attempts refused (the fence kept changing): %w", txAttempts, err)
}

// dedupKey is the key besides the mark that decides whether f is new: a
// manual fire's trigger key, a backfill's cursor, or in the legacy window
// the previous release's per-fire key. "" for a scheduled fire otherwise.
func (p *Publisher) dedupKey(f *celery.Fire, legacy bool) string {
	switch {
	case f.Manual:
		return p.TriggerKey(f.RequestKey())
	case f.Backfill != "":
		return p.BackfillKey(f.Backfill)
	case legacy:
		f.Task.AssignID(f)
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
	fence := reads.Get(ctx, p.fenceKey)
	queues := map[string]*redis.StatusCmd{}
	entries := map[*celery.Task]*entryState{}
	extra := make([]redis.Cmder, len(fl.idx))
	for j, i := range fl.idx {
		f := &fires[i]
		if _, ok := queues[f.Task.QueueKey]; !ok {
			queues[f.Task.QueueKey] = reads.Type(ctx, f.Task.QueueKey)
		}
		if _, ok := entries[f.Task]; !ok {
			entries[f.Task] = &entryState{head: reads.LIndex(ctx, p.historyKey(f.Task.Name), 0)}
		}
		switch k := p.dedupKey(f, legacy); {
		case k == "":
		case f.Backfill != "":
			extra[j] = reads.Get(ctx, k)
		default:
			extra[j] = reads.Exists(ctx, k)
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
	for t, e := range entries {
		head, err := e.head.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("read %s's mark: %w", t.Name, err)
		}
		if e.mark, e.runs, e.known = parseHead(head); !e.known {
			if counts == nil {
				counts = tx.Pipeline()
			}
			e.counts = counts.HGet(ctx, p.countsKey(), t.Name)
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
	// Messages go out in one LPUSH per queue, in the flight's order;
	// pushes[q] is that LPUSH's arguments, and who[q] its fires.
	pushes := map[string][]any{}
	who := map[string][]int{}
	claimed := map[string]bool{}  // trigger keys claimed earlier in this flight
	cursors := map[string]int64{} // backfill cursors moved earlier in this flight
	recs := make([]*redis.IntCmd, len(fl.idx))
	writes := false
	for j, i := range fl.idx {
		f := &fires[i]
		e := entries[f.Task]
		if e.failed {
			fl.out[j] = outFailed
			continue
		}
		fresh := false
		var slot int64
		switch {
		case f.Manual:
			k := p.TriggerKey(f.RequestKey())
			fresh = extra[j].(*redis.IntCmd).Val() == 0 && !claimed[k]
			if fresh {
				claimed[k] = true
			}
		case f.Backfill != "":
			slot = f.Slot.UnixMicro()
			c, ok := cursors[f.Backfill]
			if !ok {
				v, err := extra[j].(*redis.StringCmd).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					return fmt.Errorf("read backfill %s's cursor: %w", f.Backfill, err)
				}
				c, _ = strconv.ParseInt(v, 10, 64) // none or unreadable: the job starts
			}
			fresh = c < slot
		default:
			slot = f.Slot.UnixMicro()
			fresh = e.mark == "" || markBelow(e.mark, slot)
			if fresh && legacy && extra[j].(*redis.IntCmd).Val() == 1 {
				fresh = false
			}
		}
		if !fresh {
			fl.out[j] = outDuplicate
			continue
		}
		q := f.Task.QueueKey
		if t := queues[q].Val(); t != "list" && t != "none" {
			// Not pushed, and nothing of the fire is written: it stays
			// pending, and the entry's later fires wait behind it.
			if fl.failure == nil {
				fl.failure = fmt.Errorf("entry %q: LPUSH to %s failed (does the key hold another type?)", f.Task.Name, q)
			}
			fl.out[j] = outFailed
			if !f.Manual {
				e.failed = true
			}
			continue
		}
		if pushes[q] == nil {
			pushes[q] = []any{"lpush", q}
		}
		pushes[q] = append(pushes[q], fl.msgs[j])
		who[q] = append(who[q], j)
		if !e.known {
			n, err := e.counts.Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("read %s's run count: %w", f.Task.Name, err)
			}
			e.runs, e.known = n, true
			w.HSet(ctx, p.entriesKey(), f.Task.Name, 1)
		}
		switch {
		case f.Manual:
			w.Set(ctx, p.TriggerKey(f.RequestKey()), tok, p.trigTTL)
		case f.Backfill != "":
			cursors[f.Backfill] = slot
			w.Set(ctx, p.BackfillKey(f.Backfill), slot, p.dedupTTL)
		default:
			e.mark = strconv.FormatInt(slot, 10)
			if legacy {
				w.Set(ctx, p.DedupKey(f.ID), tok, p.dedupTTL)
			}
		}
		e.runs++
		hist := p.historyKey(f.Task.Name)
		rec := make([]byte, 0, len(e.mark)+24+len(fl.recs[j]))
		rec = append(rec, e.mark...)
		rec = append(rec, ' ')
		rec = strconv.AppendInt(rec, e.runs, 10)
		rec = append(rec, ' ')
		rec = append(rec, fl.recs[j]...)
		recs[j] = w.LPush(ctx, hist, rec)
		// Every keepArg runs rather than when the list is long: the
		// length is not known inside the transaction. The list stays
		// under twice the history length.
		if e.runs%int64(p.keepTrim) == 0 {
			w.LTrim(ctx, hist, 0, int64(p.keepTrim-1))
		}
		fl.out[j] = outPushed
		writes = true
	}
	qcmds := map[string]*redis.IntCmd{}
	for q, args := range pushes {
		c := redis.NewIntCmd(ctx, args...)
		_ = w.Process(ctx, c)
		qcmds[q] = c
	}
	if want > 0 {
		// WAIT waits for this connection's last write: the marker makes
		// a flight of duplicates wait for what it found too.
		w.Set(ctx, p.repl.syncKey, tok, 0)
		writes = true
	}
	if writes || token > cur || len(fl.binds) > 0 {
		if cmds, err := w.Exec(ctx); err != nil && !isCommandErr(err) {
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
	} else if err := tx.Unwatch(ctx).Err(); err != nil {
		return err
	}
	// A push that failed inside EXEC (the queue was retyped after the
	// check) failed its fires; their records were written all the same.
	for q, c := range qcmds {
		if err := c.Err(); err != nil {
			for _, j := range who[q] {
				fl.out[j] = outFailed
			}
			fl.failure = fmt.Errorf("LPUSH to %s failed inside the transaction, after its type was checked: %w", q, err)
		}
	}
	for j, c := range recs {
		if c != nil && c.Err() != nil {
			fl.out[j] = outFailed
			fl.failure = fmt.Errorf("record %s's run: %w", fires[fl.idx[j]].Task.Name, c.Err())
		}
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
func parseHead(head string) (mark string, runs int64, known bool) {
	i := 0
	for i < len(head) && head[i] >= '0' && head[i] <= '9' {
		i++
	}
	if i == len(head) || head[i] != ' ' {
		return "", 0, false
	}
	j := i + 1
	for j < len(head) && head[j] >= '0' && head[j] <= '9' {
		j++
	}
	if j == i+1 || j == len(head) || head[j] != ' ' {
		return "", 0, false
	}
	n, err := strconv.ParseInt(head[i+1:j], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return head[:i], n, true
}

// markBelow reports whether the mark (Unix microseconds) is below slot.
// An unreadable mark is below every slot, as Lua's comparison made it
// fail open for the slot rather than hold the entry forever.
func markBelow(mark string, slot int64) bool {
	m, err := strconv.ParseInt(mark, 10, 64)
	return err != nil || m < slot
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
