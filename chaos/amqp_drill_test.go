package chaos

import (
	"os"
	"testing"
	"time"
)

func TestFencedPublishes(t *testing.T) {
	at := func(tok ...int64) []Message {
		var out []Message
		for _, k := range tok {
			out = append(out, Message{Entry: "e", Token: k})
		}
		return out
	}
	tests := []struct {
		tokens []int64
		want   int
	}{
		{nil, 0},
		{[]int64{3, 3, 5, 5, 9}, 0},
		{[]int64{3, 5, 3}, 1},       // token 3 enqueued after term 5 published
		{[]int64{3, 9, 5, 7, 9}, 2}, // 5 and 7 after 9
	}
	for _, tt := range tests {
		if got := len(FencedPublishes(at(tt.tokens...))); got != tt.want {
			t.Errorf("%v: %d fenced publishes, want %d", tt.tokens, got, tt.want)
		}
	}
	// Per fence (a shard): shard b's older term publishing after shard
	// a's newer one is fine; within b, 4 after 6 is not.
	msgs := []Message{{Entry: "a", Token: 9}, {Entry: "b", Token: 4}, {Entry: "b", Token: 6}, {Entry: "b", Token: 4}, {Entry: "a", Token: 9}}
	byEntry := func(m Message) string { return m.Entry }
	if got := FencedPublishesBy(msgs, byEntry); len(got) != 1 || got[0] != msgs[3] {
		t.Errorf("by shard: %v, want only the second token 4 of b", got)
	}
	if got := len(FencedPublishes(msgs)); got != 3 {
		t.Errorf("one fence: %d fenced publishes, want 3", got)
	}
}

func TestExplainResends(t *testing.T) {
	s1 := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
	s2 := s1.Add(time.Second)
	key := func(e string, s time.Time) string { return e + "\x00" + s.Format(time.RFC3339Nano) }
	rep := &Report{Duplicates: []SlotRef{{Entry: "a", Slot: s1, Count: 2}, {Entry: "b", Slot: s2, Count: 3}}, Missed: []SlotRef{}}
	// a's duplicate was logged as a re-send; b's second copy was, its third
	// was not.
	explainResends(rep, map[string]int{key("a", s1): 1, key("b", s2): 1, key("c", s1): 1})
	if len(rep.DuplicatesInWindow) != 1 || rep.DuplicatesInWindow[0].Entry != "a" {
		t.Fatalf("in window: %+v", rep.DuplicatesInWindow)
	}
	if len(rep.Duplicates) != 1 || rep.Duplicates[0].Entry != "b" || rep.OK {
		t.Fatalf("unexplained: %+v ok=%v", rep.Duplicates, rep.OK)
	}
	if rep.Resends != 3 {
		t.Fatalf("resends %d", rep.Resends)
	}
	rep = &Report{Duplicates: []SlotRef{{Entry: "a", Slot: s1, Count: 2}}, Missed: []SlotRef{}, FencedPublishes: 1}
	explainResends(rep, map[string]int{key("a", s1): 1})
	if rep.OK {
		t.Fatal("a publish from a fenced term passed")
	}
}

// TestDrillAMQP is the drill on RabbitMQ: every fault kind against a real
// 3-member etcd, rabbitmq-server and three beatd processes. It takes
// minutes, so it runs with BEATD_DRILL_AMQP=1 (make drill-amqp); any
// missed slot, unexplained duplicate or publish from a fenced term fails.
// TestDrillAMQPCI is its short form in make test.
func TestDrillAMQP(t *testing.T) {
	if os.Getenv("BEATD_DRILL_AMQP") == "" {
		t.Skip("set BEATD_DRILL_AMQP=1 (make drill-amqp) to run the drill on RabbitMQ")
	}
	dur := 60 * time.Second
	if v, err := time.ParseDuration(os.Getenv("BEATD_DRILL_DURATION")); err == nil {
		dur = v
	}
	runDrill(t, LocalConfig{Duration: dur, Broker: BrokerAMQP, MinEach: 2}, AMQPFaults)
}
