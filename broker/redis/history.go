package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/outcome"
	"github.com/redis/go-redis/v9"
)

// The run history lives in Redis, written by the publish itself:
// a capped list per entry, newest first. It costs a few bytes of Redis per
// fire and nothing in etcd, and every replica reads it for status. The
// newest record is also the entry's dedup: it carries the high-water mark.
//
// A run record is "<mark> <runs> <slot> <published> <token> <manual>
// [<task id>]": the mark (the last scheduled slot published, Unix
// microseconds, empty before the first) and the run count as the publish
// prepends them, then the slot (Unix nanoseconds), the publish time (Unix
// microseconds), the token, manual as 0 or 1, and a manual run's task id
// (a scheduled run's is its slot's UUIDv5). The previous release wrote
// "slot,published,token,task_id,manual", which parseRun still reads.

func (p *Publisher) historyKey(entry string) string { return p.prefix + "runs:" + entry }
func (p *Publisher) countsKey() string              { return p.prefix + "runcount" }

// appendRun appends what Go knows of a run's record; the publish puts the
// mark and the count in front.
func appendRun(dst []byte, f *celery.Fire, token int64, now time.Time) []byte {
	dst = strconv.AppendInt(dst, f.Slot.UnixNano(), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, now.UnixMicro(), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, token, 10)
	switch {
	case f.Manual:
		dst = append(dst, " 1 "...)
		return append(dst, f.ID[:]...)
	case f.Backfill != "":
		return append(dst, " 2"...)
	}
	return append(dst, " 0"...)
}

// parseRun reads a run record, and the run count it carries (0 for the
// previous release's records, which carried none).
func (p *Publisher) parseRun(entry string, b []byte) (outcome.Run, int64, error) {
	var r outcome.Run
	if bytes.IndexByte(b, ',') >= 0 {
		return parseOldRun(b)
	}
	f := strings.Split(string(b), " ") // the mark, first, may be empty
	if len(f) != 6 && len(f) != 7 {
		return r, 0, fmt.Errorf("redis: run record %q: want 6 or 7 fields", b)
	}
	runs, err1 := strconv.ParseInt(f[1], 10, 64)
	slot, err2 := strconv.ParseInt(f[2], 10, 64)
	pub, err3 := strconv.ParseInt(f[3], 10, 64)
	tok, err4 := strconv.ParseInt(f[4], 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return r, 0, fmt.Errorf("redis: run record %q: %w", b, err)
	}
	r.Slot, r.PublishedAt, r.Token, r.Manual, r.Backfill = time.Unix(0, slot).UTC(), time.UnixMicro(pub).UTC(), tok, f[5] == "1", f[5] == "2"
	if len(f) == 7 {
		r.TaskID = f[6]
	} else {
		id := celery.SlotIDOf(p.cluster, entry, r.Slot)
		r.TaskID = string(id[:])
	}
	return r, runs, nil
}

func parseOldRun(b []byte) (outcome.Run, int64, error) {
	var r outcome.Run
	f := bytes.Split(b, []byte{','})
	if len(f) != 5 {
		return r, 0, fmt.Errorf("redis: run record %q: want 5 fields", b)
	}
	slot, err1 := strconv.ParseInt(string(f[0]), 10, 64)
	pub, err2 := strconv.ParseInt(string(f[1]), 10, 64)
	tok, err3 := strconv.ParseInt(string(f[2]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return r, 0, fmt.Errorf("redis: run record %q: %w", b, err)
	}
	r.Slot, r.PublishedAt = time.Unix(0, slot).UTC(), time.Unix(0, pub).UTC()
	r.Token, r.TaskID, r.Manual = tok, string(f[3]), string(f[4]) == "1"
	return r, 0, nil
}

func at(vals []any, i int) any {
	if i < len(vals) {
		return vals[i]
	}
	return nil
}

// Histories reads the run history of the named entries in one pipelined
// round trip. Entries without runs are absent from the result.
func (p *Publisher) Histories(ctx context.Context, names []string) (map[string]outcome.EntryRuns, error) {
	out := make(map[string]outcome.EntryRuns, len(names))
	if len(names) == 0 || p.keep <= 0 {
		return out, nil
	}
	pipe := p.rdb.Pipeline()
	lists := make([]*redis.StringSliceCmd, len(names))
	for i, n := range names {
		lists[i] = pipe.LRange(ctx, p.historyKey(n), 0, int64(p.keep-1))
	}
	legacy := pipe.HMGet(ctx, p.countsKey(), names...)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis: read run history: %w", err)
	}
	old := legacy.Val()
	for i, n := range names {
		var h outcome.EntryRuns
		for j, s := range lists[i].Val() {
			r, runs, err := p.parseRun(n, []byte(s))
			if err != nil {
				return nil, err
			}
			if j == 0 {
				h.Count = runs
			}
			h.Runs = append(h.Runs, r)
		}
		if h.Count == 0 {
			if s, ok := at(old, i).(string); ok {
				h.Count, _ = strconv.ParseInt(s, 10, 64) // not run since the upgrade
			}
		}
		if len(h.Runs) > 0 || h.Count > 0 {
			out[n] = h
		}
	}
	return out, nil
}

// LastPublished returns the newest run record of each of entries that
// has one: what the last leader published, even after its last state
// write. A new leader reads it for the entries whose overlap policy
// must know a run in progress.
func (p *Publisher) LastPublished(ctx context.Context, entries []string) (map[string]outcome.Run, error) {
	out := make(map[string]outcome.Run, len(entries))
	if len(entries) == 0 {
		return out, nil
	}
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(entries))
	for i, n := range entries {
		cmds[i] = pipe.LIndex(ctx, p.historyKey(n), 0)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis: read the last runs: %w", err)
	}
	for i, n := range entries {
		b, err := cmds[i].Bytes()
		if err != nil {
			continue // none yet
		}
		r, _, err := p.parseRun(n, b)
		if err != nil {
			return nil, err
		}
		out[n] = r
	}
	return out, nil
}

// Runs returns the entry's run history, newest first (the last
// --run-history runs).
func (p *Publisher) Runs(ctx context.Context, entry string) ([]outcome.Run, error) {
	h, err := p.Histories(ctx, []string{entry})
	if err != nil {
		return nil, err
	}
	return h[entry].Runs, nil
}

// EndBackfill drops a finished backfill's cursor, fenced like a publish.
func (p *Publisher) EndBackfill(ctx context.Context, token int64, id string) error {
	n, err := endBackfillScript.Run(ctx, p.rdb, []string{p.fenceKey, p.BackfillKey(id)}, token).Int64()
	if err != nil {
		return fmt.Errorf("redis: end backfill %s: %w", id, err)
	}
	if n < 0 {
		return broker.ErrStale
	}
	return nil
}

// endBackfillScript deletes a backfill's cursor unless a newer leader
// holds the fence. KEYS: fence, cursor. ARGV: token. -1 if stale.
var endBackfillScript = redis.NewScript(`
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then return -1 end
redis.call('DEL', KEYS[2])
return 0
`)
