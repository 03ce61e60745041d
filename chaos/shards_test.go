package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
)

func TestShardMoves(t *testing.T) {
	at := func(ms int) string {
		return time.Date(2026, 1, 1, 0, 0, 0, ms*int(time.Millisecond), time.UTC).Format(time.RFC3339Nano)
	}
	line := func(ms int, msg string, shard int) string {
		return `{"time":"` + at(ms) + `","level":"INFO","msg":"` + msg + `","shard":` + string(rune('0'+shard)) + "}\n"
	}
	logs := map[string]string{
		"a": line(0, "elected leader", 1) + line(10, "scheduling", 1) + line(20, "elected leader", 2) + line(30, "scheduling", 2) +
			`{"time":"` + at(40) + `","msg":"fired","entry":"x"}` + "\n" + // no shard: not an event
			line(1000, "handing a shard over to a replica that leads less than its share", 1) +
			line(1030, "handing a shard over to a replica that leads less than its share", 1) + // the same term's: one move
			line(1050, "term over", 1) +
			line(3000, "term over", 2),
		"b": line(1080, "elected leader", 1) + line(1120, "scheduling", 1) + line(3200, "elected leader", 2) + line(3400, "scheduling", 2),
	}
	var evs []ShardEvent
	for _, id := range []string{"b", "a"} {
		e, err := ReadShardEvents(id, strings.NewReader(logs[id]))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e...)
	}
	if len(evs) != 12 {
		t.Fatalf("%d events, want 12: %+v", len(evs), evs)
	}
	moves := ShardMoves(evs)
	want := []struct {
		shard    int
		from, to string
		cause    string
		gap      time.Duration
	}{
		{1, "a", "b", ShardHandover, 120 * time.Millisecond},
		{2, "a", "b", ShardTermOver, 400 * time.Millisecond},
	}
	if len(moves) != len(want) {
		t.Fatalf("moves %+v, want %d", moves, len(want))
	}
	for i, w := range want {
		m := moves[i]
		if m.Shard != w.shard || m.From != w.from || m.To != w.to || m.Cause != w.cause || m.Gap() != w.gap {
			t.Errorf("move %d: %+v (gap %s), want %+v", i, m, m.Gap(), w)
		}
	}
}

// TestReadTermsAudit is the bench's case of an entry defined just after a
// slot (defined_at 21:49:59), whose first owed slot (21:50:50) fell in an
// offline resize: its shard's new leader caught up once, publishing only
// 21:51:50. With nothing published before 21:50:50 the tokens cannot tell
// that drop from a miss; the terms read from the replicas' logs can.
func TestReadTermsAudit(t *testing.T) {
	cfg, err := config.Parse("tenants.yaml", []byte(`entries:
  tenant-0277181: {task: tasks.sync, every: 60s, start_at: '2026-01-01T17:04:50Z', args: [277181]}
`))
	if err != nil {
		t.Fatal(err)
	}
	const name = "tenant-0277181"
	shard := keys.ShardOf(name, 8)
	// The single leader's log (unsharded: no shard field) and the 8-shard
	// replica's, in the daemon's JSON format.
	single := `{"time":"2026-12-05T21:50:21.891Z","level":"INFO","msg":"entry added","entry":"tenant-0000000"}
{"time":"2026-12-05T21:50:23.568662611Z","level":"INFO","msg":"elected leader","id":"single","component":"election","candidate":"single","token":7026,"lease":"1c00a2482ea0318a"}
{"time":"2026-12-05T21:50:29.126801856Z","level":"INFO","msg":"scheduling","id":"single","component":"scheduler","token":7026}
`
	sharded := func(s int) string {
		return fmt.Sprintf(`{"time":"2026-12-05T21:52:03.456663817Z","level":"INFO","msg":"elected leader","id":"b","shard":%d,"component":"election","candidate":"b","token":13018}
{"time":"2026-12-05T21:52:05.61275476Z","level":"INFO","msg":"scheduling","id":"b","shard":%d,"component":"scheduler","token":13018}
`, s, s)
	}
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, "2026-12-05T"+s+"Z")
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	msgs := []Message{{Entry: name, Slot: at("21:51:50"), Token: 13018}, {Entry: name, Slot: at("21:52:50"), Token: 13018}}
	from, to := at("21:50:30"), at("21:53:00")
	for _, tt := range []struct {
		name   string
		logs   map[string]int // a log and its process's shard count
		noLogs bool           // Audit: tokens alone
		missed int
	}{
		{name: "tokens alone", noLogs: true, missed: 1},
		{name: "a term of its shard began in the outage", logs: map[string]int{single: 1, sharded(shard): 8}, missed: 0},
		{name: "only another shard's term began", logs: map[string]int{single: 1, sharded((shard + 1) % 8): 8}, missed: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var rep *Report
			if tt.noLogs {
				rep = Audit(cfg, msgs, from, to)
			} else {
				var terms []Term
				for log, count := range tt.logs {
					ts, err := ReadTerms(strings.NewReader(log), count)
					if err != nil {
						t.Fatal(err)
					}
					terms = append(terms, ts...)
				}
				if len(terms) != 2 {
					t.Fatalf("terms %+v, want the single leader's and one shard's", terms)
				}
				rep = AuditWithTerms(cfg, msgs, from, to, terms)
			}
			if len(rep.Missed) != tt.missed || len(rep.Missed)+len(rep.Dropped) != 1 {
				t.Fatalf("missed %v dropped %v, want %d missed of the one gap (21:50:50)", rep.Missed, rep.Dropped, tt.missed)
			}
			if g := append(rep.Missed, rep.Dropped...)[0].Slot; !g.Equal(at("21:50:50")) {
				t.Fatalf("gap at %s, want 21:50:50", g)
			}
		})
	}
}

// TestAuditCatchupAll: under catch-up all a takeover fires the last
// max_catchup slots owed up to its election; the audit drops the older
// ones of the outage (the 900k bench counted them missed: 100 for each
// probe) and still finds a slot within the last max_catchup not fired.
func TestAuditCatchupAll(t *testing.T) {
	cfg, err := config.Parse("all.yaml", []byte(`entries:
  probe: {task: tasks.probe, every: 1s, catchup: all, max_catchup: 3}
  windowed: {task: tasks.probe, every: 1s, catchup: all, max_catchup: 100, catchup_window: 4s}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return base.Add(time.Duration(n) * time.Second) }
	// Slots 1–5 by term 1; the stop; term 2 elected at 15.5 s.
	terms := []Term{{Start: sec(0), Token: 1}, {Start: sec(15).Add(500 * time.Millisecond), Token: 2}}
	pubs := func(entry string, tok int64, from, to int, skip ...int) []Message {
		var out []Message
		for n := from; n <= to; n++ {
			if !slices.Contains(skip, n) {
				out = append(out, Message{Entry: entry, Slot: sec(n), Token: tok})
			}
		}
		return out
	}
	for _, tt := range []struct {
		name    string
		msgs    []Message
		missed  []int
		dropped int
	}{
		{name: "the last 3 fired", msgs: append(pubs("probe", 1, 1, 5), pubs("probe", 2, 13, 20)...), dropped: 7},
		{name: "one of the last 3 not fired", msgs: append(pubs("probe", 1, 1, 5), pubs("probe", 2, 13, 20, 13)...), missed: []int{13}, dropped: 7},
		{name: "a slot after the takeover not fired", msgs: append(pubs("probe", 1, 1, 5), pubs("probe", 2, 13, 20, 17)...), missed: []int{17}, dropped: 7},
		{name: "window of 4 s", msgs: append(pubs("windowed", 1, 1, 5), pubs("windowed", 2, 12, 20)...), dropped: 6},
		{name: "window: a slot inside it not fired", msgs: append(pubs("windowed", 1, 1, 5), pubs("windowed", 2, 12, 20, 12)...), missed: []int{12}, dropped: 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := AuditWithTerms(cfg, tt.msgs, sec(1), sec(20), terms)
			var missed []int
			for _, m := range rep.Missed {
				if m.Entry == tt.msgs[0].Entry {
					missed = append(missed, int(m.Slot.Sub(base)/time.Second))
				}
			}
			dropped := 0
			for _, d := range rep.Dropped {
				if d.Entry == tt.msgs[0].Entry {
					dropped++
				}
			}
			if !slices.Equal(missed, tt.missed) || dropped != tt.dropped {
				t.Fatalf("missed %v dropped %d (%v), want missed %v dropped %d", missed, dropped, rep.Dropped, tt.missed, tt.dropped)
			}
		})
	}
}

// TestReadTermsElectedAt: a term's catch-up counts up to the instant its
// election was won, which "elected leader" logs as "at"; the line's own
// time is a moment later and may fall in the next second. The 900,000
// bench's two "missed" probe slots were this: elected at 04:33:35.9999
// by the line, 04:33:36.0003 by the term, which fired the last 100 slots
// up to 04:33:36, not up to 04:33:35.
func TestReadTermsElectedAt(t *testing.T) {
	cfg, err := config.Parse("all.yaml", []byte(`entries:
  probe: {task: tasks.probe, every: 1s, catchup: all, max_catchup: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return base.Add(time.Duration(n) * time.Second) }
	var msgs []Message
	for n := 1; n <= 5; n++ {
		msgs = append(msgs, Message{Entry: "probe", Slot: sec(n), Token: 1})
	}
	for n := 8; n <= 14; n++ { // the last 3 up to 10.0003: 8, 9, 10
		msgs = append(msgs, Message{Entry: "probe", Slot: sec(n), Token: 2})
	}
	first := `{"time":"2026-12-06T00:00:00.5Z","level":"INFO","msg":"elected leader","token":1,"at":"2026-12-06T00:00:00.4Z"}` + "\n"
	for _, tt := range []struct {
		name, line string
		missed     int
	}{
		{"the election's instant", `{"time":"2026-12-06T00:00:09.9999Z","level":"INFO","msg":"elected leader","token":2,"at":"2026-12-06T00:00:10.0003Z"}`, 0},
		{"the line's time alone", `{"time":"2026-12-06T00:00:09.9999Z","level":"INFO","msg":"elected leader","token":2}`, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			terms, err := ReadTerms(strings.NewReader(first+tt.line+"\n"), 1)
			if err != nil || len(terms) != 2 {
				t.Fatalf("terms %+v, %v", terms, err)
			}
			rep := AuditWithTerms(cfg, msgs, sec(1), sec(14), terms)
			if len(rep.Missed) != tt.missed || len(rep.Duplicates) != 0 {
				t.Fatalf("missed %v, duplicates %v; want %d missed", rep.Missed, rep.Duplicates, tt.missed)
			}
		})
	}
}
