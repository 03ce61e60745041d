package chaos

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
)

// TestDrillShort is the CI drill: every fault kind at least once, over at
// least 45 s of faults, against a real 3-member etcd, redis-server and
// three beatd processes. Any duplicate or missed slot fails the build.
func TestDrillShort(t *testing.T) {
	rep := runDrill(t, LocalConfig{Duration: 45 * time.Second}, AllFaults)
	if rep.ExpectedSlots < 500 {
		t.Errorf("only %d slots audited", rep.ExpectedSlots)
	}
}

// TestAudit checks the audit's verdicts on hand-made message sets.
func TestAudit(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse("a.yaml", []byte(`entries:
  all: {task: t, every: 1s, relative: true, catchup: all}
  once: {task: t, every: 1s, relative: true, catchup: once}
  skip: {task: t, every: 1s, relative: true, catchup: skip}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	msg := func(entry string, sec int, token int64) Message {
		return Message{Entry: entry, Slot: base.Add(time.Duration(sec) * time.Second), Token: token, TaskID: fmt.Sprint(entry, sec)}
	}
	// 0-9 by token 5, an outage over 10-12, 13-19 by token 9.
	var msgs []Message
	for s := 0; s < 20; s++ {
		tok := int64(5)
		if s >= 13 {
			tok = 9
		}
		for _, e := range []string{"all", "once", "skip"} {
			if s >= 10 && s <= 12 && e != "all" {
				continue // once and skip legitimately drop the outage
			}
			msgs = append(msgs, msg(e, s, tok))
		}
	}
	rep := Audit(cfg, msgs, base, base.Add(19*time.Second))
	if !rep.OK || len(rep.Dropped) != 6 {
		t.Fatalf("clean run: ok=%v dropped=%v missed=%v dups=%v", rep.OK, rep.Dropped, rep.Missed, rep.Duplicates)
	}
	// A duplicate, and a slot lost without a takeover, are both failures.
	bad := append(append([]Message(nil), msgs...), msg("all", 4, 5))
	var lost []Message
	for _, m := range bad {
		if !(m.Entry == "once" && m.Slot.Equal(base.Add(3*time.Second))) {
			lost = append(lost, m)
		}
	}
	rep = Audit(cfg, lost, base, base.Add(19*time.Second))
	if rep.OK || len(rep.Duplicates) != 1 || len(rep.Missed) != 1 {
		t.Fatalf("bad run: dups=%v missed=%v", rep.Duplicates, rep.Missed)
	}

	// A skip entry's very first slot, dropped at a takeover: the tokens
	// cannot tell (nothing was published before it), the term timeline can.
	var first []Message
	for _, m := range msgs {
		if !(m.Entry == "skip" && m.Slot.Before(base.Add(13*time.Second))) {
			first = append(first, m)
		}
	}
	terms := []Term{{Start: base.Add(-time.Minute), Token: 5}, {Start: base.Add(13500 * time.Millisecond), Token: 9}}
	rep = AuditWithTerms(cfg, first, base, base.Add(19*time.Second), terms)
	if !rep.OK {
		t.Fatalf("first slots dropped at a takeover judged missed: %v", rep.Missed)
	}
	// Without a term starting in the run, the same gap is a miss.
	rep = AuditWithTerms(cfg, first, base, base.Add(19*time.Second), terms[:1])
	if rep.OK {
		t.Fatal("a gap with no takeover passed")
	}

	// One term throughout: once and skip slots missing over 10-12 were
	// dropped while pending only if the next published slot (13) was
	// fired more than StepLateness after them (a broker down that long).
	var sameTerm []Message
	for _, m := range msgs {
		m.Token = 5
		sameTerm = append(sameTerm, m)
	}
	for _, tt := range []struct {
		name  string
		fired time.Duration // when slot 13 was fired, from base
		ok    bool
	}{
		{name: "fired 32 s after the outage's last slot", fired: 45 * time.Second, ok: true},
		{name: "fired on time", fired: 13 * time.Second, ok: false},
	} {
		fired := map[string]time.Time{}
		for _, e := range []string{"once", "skip"} {
			fired[FiredKey(e, base.Add(13*time.Second))] = base.Add(tt.fired)
		}
		rep := AuditWithTimeline(cfg, sameTerm, base, base.Add(19*time.Second), []Term{{Start: base.Add(-time.Minute), Token: 5}}, fired)
		if rep.OK != tt.ok {
			t.Errorf("slot 13 %s: ok %v, want %v (missed %v)", tt.name, rep.OK, tt.ok, rep.Missed)
		}
	}

	// Sharded: only a term of the entry's own shard is a takeover of it.
	const n = 4
	skipShard := keys.ShardOf("skip", n)
	for _, tt := range []struct {
		name     string
		takeover func(shard int) bool // the shards a new term began in
		ok       bool
	}{
		{name: "every shard", takeover: func(int) bool { return true }, ok: true},
		{name: "every shard but skip's", takeover: func(i int) bool { return i != skipShard }, ok: false},
	} {
		var sharded []Term
		for i := range n {
			sharded = append(sharded, Term{Start: base.Add(-time.Minute), Token: 5, Shard: i, Count: n})
			if tt.takeover(i) {
				sharded = append(sharded, Term{Start: base.Add(13500 * time.Millisecond), Token: 9, Shard: i, Count: n})
			}
		}
		if rep := AuditWithTerms(cfg, first, base, base.Add(19*time.Second), sharded); rep.OK != tt.ok {
			t.Errorf("a term began in %s: ok %v, want %v (missed %v)", tt.name, rep.OK, tt.ok, rep.Missed)
		}
	}
}

// TestDrillSentinel is the drill with Redis behind Sentinel and the
// redis-failover fault (SENTINEL FAILOVER and kill -9 of the master), with
// every other fault kind. It takes minutes, so it runs only with
// BEATD_DRILL_SENTINEL=1 (or: beatd-drill local --sentinel);
// TestDrillSentinelCI is its short form in make test.
func TestDrillSentinel(t *testing.T) {
	if os.Getenv("BEATD_DRILL_SENTINEL") == "" {
		t.Skip("set BEATD_DRILL_SENTINEL=1 to run the Sentinel drill")
	}
	runDrill(t, LocalConfig{Duration: 60 * time.Second, Sentinel: true, MinEach: 2}, []string{FaultRedisFailover})
}
