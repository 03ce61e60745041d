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
	"github.com/redis/go-redis/v9"
)

// The run history lives in Redis, written by the publish script itself:
// a capped list per entry (newest first), and a run count beside each
// entry's mark in the slots hash. It
// costs a few bytes of Redis per fire and nothing in etcd, and every
// replica reads it for status.
//
// A run record is "slot,published,token,task_id,manual": the two times
// as Unix nanoseconds, manual as 0 or 1.

func (p *Publisher) historyKey(entry string) string { return p.prefix + "runs:" + entry }
func (p *Publisher) countsKey() string              { return p.prefix + "runcount" }

func appendRun(dst []byte, f *celery.Fire, token int64, now time.Time) []byte {
	dst = strconv.AppendInt(dst, f.Slot.UnixNano(), 10)
	dst = append(dst, ',')
	dst = strconv.AppendInt(dst, now.UnixNano(), 10)
	dst = append(dst, ',')
	dst = strconv.AppendInt(dst, token, 10)
	dst = append(dst, ',')
	dst = append(dst, f.ID[:]...)
	if f.Manual {
		return append(dst, ",1"...)
	}
	return append(dst, ",0"...)
}

func parseRun(b []byte) (broker.Run, error) {
	var r broker.Run
	f := bytes.Split(b, []byte{','})
	if len(f) != 5 {
		return r, fmt.Errorf("publisher: run record %q: want 5 fields", b)
	}
	slot, err1 := strconv.ParseInt(string(f[0]), 10, 64)
	pub, err2 := strconv.ParseInt(string(f[1]), 10, 64)
	tok, err3 := strconv.ParseInt(string(f[2]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return r, fmt.Errorf("publisher: run record %q: %w", b, err)
	}
	r.Slot, r.PublishedAt = time.Unix(0, slot).UTC(), time.Unix(0, pub).UTC()
	r.Token, r.TaskID, r.Manual = tok, string(f[3]), string(f[4]) == "1"
	return r, nil
}

func at(vals []any, i int) any {
	if i < len(vals) {
		return vals[i]
	}
	return nil
}

// History is what Redis remembers of an entry's runs.
type History struct {
	Runs  []broker.Run // newest first
	Count int64        // runs published since the history began
}

// LastRunAt is when the newest run was published, or zero.
func (h History) LastRunAt() time.Time {
	if len(h.Runs) == 0 {
		return time.Time{}
	}
	return h.Runs[0].PublishedAt
}

// Histories reads the run history of the named entries in one pipelined
// round trip. Entries without runs are absent from the result.
func (p *Publisher) Histories(ctx context.Context, names []string) (map[string]History, error) {
	out := make(map[string]History, len(names))
	if len(names) == 0 || p.keep == 0 {
		return out, nil
	}
	pipe := p.rdb.Pipeline()
	lists := make([]*redis.StringSliceCmd, len(names))
	for i, n := range names {
		lists[i] = pipe.LRange(ctx, p.historyKey(n), 0, int64(p.keep-1))
	}
	counts := pipe.HMGet(ctx, p.slotsKey(), names...)
	legacy := pipe.HMGet(ctx, p.countsKey(), names...)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("publisher: read run history: %w", err)
	}
	vals, old := counts.Val(), legacy.Val()
	for i, n := range names {
		var h History
		for _, s := range lists[i].Val() {
			r, err := parseRun([]byte(s))
			if err != nil {
				return nil, err
			}
			h.Runs = append(h.Runs, r)
		}
		if s, ok := at(vals, i).(string); ok {
			_, runs, _ := strings.Cut(s, " ")
			h.Count, _ = strconv.ParseInt(runs, 10, 64)
		} else if s, ok := at(old, i).(string); ok {
			h.Count, _ = strconv.ParseInt(s, 10, 64) // not run since the upgrade
		}
		if len(h.Runs) > 0 || h.Count > 0 {
			out[n] = h
		}
	}
	return out, nil
}
