package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// The log messages of a sharded replica that move a shard (each carries
// the shard's number).
const (
	ShardElected    = "elected leader"
	ShardScheduling = "scheduling"
	ShardHandover   = "handing a shard over"
	ShardTermOver   = "term over"
)

// ShardEvent is one line of a sharded replica's JSON log about a shard's
// leadership: its election, its scheduling, a handover or a term's end.
type ShardEvent struct {
	At      time.Time
	Replica string
	Shard   int
	Msg     string // one of the Shard* messages
	Token   int64
}

// termLine is what a replica's JSON log line says of a shard's leadership.
type termLine struct {
	Time time.Time `json:"time"`
	// At is an election's own instant ("elected leader"), which its
	// term's catch-up counts up to; the line's Time is a moment later.
	// A string: other lines' "at" is not a time.
	At    string `json:"at"`
	Msg   string `json:"msg"`
	Shard *int   `json:"shard"` // nil in an unsharded replica's log
	Token int64  `json:"token"`
}

// readTermLines calls fn with each JSON line of log.
func readTermLines(log io.Reader, fn func(termLine)) error {
	sc := bufio.NewScanner(log)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l termLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			fn(l)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("chaos: read a replica's log: %w", err)
	}
	return nil
}

// ReadShardEvents reads the shard events of one replica's JSON log.
func ReadShardEvents(replica string, log io.Reader) ([]ShardEvent, error) {
	var out []ShardEvent
	err := readTermLines(log, func(l termLine) {
		if l.Shard == nil {
			return
		}
		msg := l.Msg
		if strings.HasPrefix(msg, ShardHandover) {
			msg = ShardHandover
		}
		switch msg {
		case ShardElected, ShardScheduling, ShardHandover, ShardTermOver:
			out = append(out, ShardEvent{At: l.Time, Replica: replica, Shard: *l.Shard, Msg: msg, Token: l.Token})
		}
	})
	return out, err
}

// ReadTerms reads the terms elected in one replica's JSON log, a process
// that ran with count shards: an unsharded one's (count 1 or less) lead
// every entry. It is the timeline AuditWithTerms needs to tell a slot a
// takeover's catch-up policy dropped from a missed one when nothing of
// the entry was published before it (an entry defined just after its
// previous slot).
func ReadTerms(log io.Reader, count int) ([]Term, error) {
	var out []Term
	err := readTermLines(log, func(l termLine) {
		if l.Msg != ShardElected {
			return
		}
		t := Term{Start: l.Time, Token: l.Token}
		if at, err := time.Parse(time.RFC3339Nano, l.At); err == nil {
			t.Start = at
		}
		if count > 1 {
			if l.Shard == nil {
				return // not a shard's election
			}
			t.Shard, t.Count = *l.Shard, count
		}
		out = append(out, t)
	})
	return out, err
}

// ShardMove is one shard leaving a replica that let it go, a handover to
// a replica below its share or the end of its term (a SIGTERM), until
// the next leader of the shard schedules it: the time no replica
// scheduled the shard.
type ShardMove struct {
	Shard    int
	From, To string
	// Cause is ShardHandover or ShardTermOver.
	Cause              string
	Released, Schedule time.Time
}

// Gap is how long the shard went unscheduled.
func (m ShardMove) Gap() time.Duration { return m.Schedule.Sub(m.Released) }

// ShardMoves pairs each release of a shard in evs (the replicas' events,
// in any order) with the shard's next scheduling by any replica. A
// handover's own "term over" is the same release, not a second one; a
// replica killed logs no release, so its shards' moves are not here.
func ShardMoves(evs []ShardEvent) []ShardMove {
	evs = slices.Clone(evs)
	slices.SortStableFunc(evs, func(a, b ShardEvent) int { return a.At.Compare(b.At) })
	var out []ShardMove
	handing := map[[2]any]bool{} // replica, shard -> a handover not yet ended
	for i, e := range evs {
		key := [2]any{e.Replica, e.Shard}
		switch e.Msg {
		case ShardHandover:
			if handing[key] {
				continue // the same term handed over again (a release that logged it twice): one move, from the first
			}
			handing[key] = true
		case ShardTermOver:
			if handing[key] {
				delete(handing, key)
				continue
			}
		default:
			continue
		}
		for _, f := range evs[i+1:] {
			if f.Msg == ShardScheduling && f.Shard == e.Shard {
				out = append(out, ShardMove{Shard: e.Shard, From: e.Replica, To: f.Replica, Cause: e.Msg, Released: e.At, Schedule: f.At})
				break
			}
		}
	}
	return out
}

func (m ShardMove) String() string {
	return fmt.Sprintf("%d:%s→%s %s", m.Shard, m.From, m.To, m.Gap().Round(time.Millisecond))
}

// ShardsBalanced says whether every one of shards has a leader (leaders:
// shard -> replica) among live, and each of live leads between the floor
// and the ceiling of shards/len(live): the share each replica keeps.
func ShardsBalanced(leaders map[int]string, shards int, live []string) bool {
	if len(leaders) != shards {
		return false
	}
	count := map[string]int{}
	for _, id := range leaders {
		if !slices.Contains(live, id) {
			return false
		}
		count[id]++
	}
	for _, id := range live {
		if c := count[id]; c < shards/len(live) || c > (shards+len(live)-1)/len(live) {
			return false
		}
	}
	return true
}
