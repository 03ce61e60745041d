package chaos

import (
	"strings"
	"testing"
	"time"
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
			line(1000, "handing a shard over to a replica that leads less than its share", 1) + line(1050, "term over", 1) +
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
	if len(evs) != 11 {
		t.Fatalf("%d events, want 11: %+v", len(evs), evs)
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
