package chaos

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// FaultRabbitRestart kills rabbitmq-server (-9) and restarts it; a drill
// on RabbitMQ runs it in place of the Redis restart.
const FaultRabbitRestart = "rabbit-restart"

// AMQPFaults lists every fault kind of a drill on RabbitMQ. partition cuts
// the leader off from etcd or from RabbitMQ.
var AMQPFaults = []string{FaultKill, FaultStop, FaultTerm, FaultEtcdKill, FaultEtcdQuorum, FaultRabbitRestart, FaultPartition, FaultBrokerPartition}

// resendLog is the message of the log line with which the AMQP publisher
// reports each re-send (fields entry, slot, task_id).
const resendLog = "resend"

// Broker kinds of a local drill.
const (
	BrokerRedis = "redis"
	BrokerAMQP  = "amqp"
)

// ReadQueueAMQP takes every message out of queue, in queue order (beatd's
// drill queue has no priorities, so it is FIFO: the order they were
// enqueued in), and returns the beatd ones.
func ReadQueueAMQP(conn *amqp.Connection, queue string) ([]Message, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("chaos: open channel: %w", err)
	}
	defer ch.Close()
	var out []Message
	for {
		m, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, fmt.Errorf("chaos: read %q: %w", queue, err)
		}
		if !ok {
			return out, nil
		}
		entry, _ := m.Headers["beat_entry"].(string)
		slotS, _ := m.Headers["beat_slot"].(string)
		slot, err := time.Parse(time.RFC3339Nano, slotS)
		if entry == "" || err != nil {
			continue
		}
		var token int64
		switch v := m.Headers["beat_fencing_token"].(type) {
		case int32:
			token = int64(v)
		case int64:
			token = v
		}
		manual, _ := m.Headers["beat_manual"].(bool)
		out = append(out, Message{Entry: entry, Slot: slot, Token: token, TaskID: m.CorrelationId, Manual: manual})
	}
}

// FencedPublishes returns the messages enqueued after a message of a newer
// term, msgs being in queue order. A term publishes only once it holds the
// fence, so each of them is a publish of a term that was already fenced.
func FencedPublishes(msgs []Message) []Message {
	return FencedPublishesBy(msgs, func(Message) string { return "" })
}

// FencedPublishesBy is FencedPublishes within each group of fence: on a
// sharded cluster, a shard (its count and index), whose terms alone are
// ordered by token.
func FencedPublishesBy(msgs []Message, fence func(Message) string) []Message {
	var out []Message
	newest := map[string]int64{}
	for _, m := range msgs {
		k := fence(m)
		if m.Token < newest[k] {
			out = append(out, m)
		}
		newest[k] = max(newest[k], m.Token)
	}
	return out
}

// explainResends moves the duplicates that a replica logged as a re-send
// (an (entry, slot) an older term may have published before its journal
// record) out of Duplicates: they are the documented window, and counted.
// The rest stay, and fail the drill.
func explainResends(rep *Report, resent map[string]int) {
	var left []SlotRef
	for _, d := range rep.Duplicates {
		k := d.Entry + "\x00" + d.Slot.UTC().Format(time.RFC3339Nano)
		if resent[k] >= d.Count-1 {
			rep.DuplicatesInWindow = append(rep.DuplicatesInWindow, d)
			continue
		}
		left = append(left, d)
	}
	if left == nil {
		left = []SlotRef{}
	}
	rep.Duplicates = left
	for _, n := range resent {
		rep.Resends += n
	}
	rep.OK = len(rep.Duplicates) == 0 && len(rep.Missed) == 0 && rep.FencedPublishes == 0
}

// extraCopies is how many messages beyond one per slot the duplicates hold.
func extraCopies(dups []SlotRef) int {
	n := 0
	for _, d := range dups {
		n += d.Count - 1
	}
	return n
}

// scrapeSum adds up every series of metric on the replica's /metrics; 0
// when it has none, -1 when the scrape fails.
func scrapeSum(port int, metric string) float64 {
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}
