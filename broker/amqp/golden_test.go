package amqp

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
)

// recorder forwards TCP to a broker and keeps what clients sent.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	sent bytes.Buffer
	wg   sync.WaitGroup
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			r.wg.Add(2)
			go func() { defer r.wg.Done(); _, _ = io.Copy(up, io.TeeReader(c, (*lockedWriter)(r))); up.Close() }()
			go func() { defer r.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

type lockedWriter recorder

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent.Write(p)
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.sent.Bytes()...)
}

// wire decodes client frames into the capture script's JSON shapes:
// tables as [key, type, value] lists, arrays as [type, value] lists.
type wire struct {
	b   []byte
	off int
}

func (w *wire) u8() byte    { v := w.b[w.off]; w.off++; return v }
func (w *wire) u16() uint16 { v := binary.BigEndian.Uint16(w.b[w.off:]); w.off += 2; return v }
func (w *wire) u32() uint32 { v := binary.BigEndian.Uint32(w.b[w.off:]); w.off += 4; return v }
func (w *wire) u64() uint64 { v := binary.BigEndian.Uint64(w.b[w.off:]); w.off += 8; return v }
func (w *wire) short() string {
	n := int(w.u8())
	s := string(w.b[w.off : w.off+n])
	w.off += n
	return s
}
func (w *wire) long() []byte { n := int(w.u32()); s := w.b[w.off : w.off+n]; w.off += n; return s }

func (w *wire) table() []any {
	end := w.off + int(w.u32())
	out := []any{}
	for w.off < end {
		k := w.short()
		t, v := w.field()
		out = append(out, []any{k, t, v})
	}
	return out
}

func (w *wire) field() (string, any) {
	t := string(w.u8())
	switch t {
	case "S":
		return t, string(w.long())
	case "x":
		return t, hex.EncodeToString(w.long())
	case "t":
		return t, w.u8() != 0
	case "b":
		return t, int8(w.u8())
	case "B":
		return t, w.u8()
	case "s":
		return t, int16(w.u16())
	case "u":
		return t, w.u16()
	case "I":
		return t, int32(w.u32())
	case "i":
		return t, w.u32()
	case "l", "L":
		return t, int64(w.u64())
	case "f":
		return t, math.Float32frombits(w.u32())
	case "d":
		return t, math.Float64frombits(w.u64())
	case "T":
		return t, w.u64()
	case "F":
		return t, w.table()
	case "A":
		end := w.off + int(w.u32())
		items := []any{}
		for w.off < end {
			ft, fv := w.field()
			items = append(items, []any{ft, fv})
		}
		return t, items
	case "V":
		return t, nil
	}
	panic("field type " + t)
}

var propNames = []string{"content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
	"reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"}

func decodeFrames(t *testing.T, stream []byte) (methods, messages []map[string]any) {
	t.Helper()
	if !bytes.HasPrefix(stream, []byte("AMQP\x00\x00\x09\x01")) {
		t.Fatalf("no AMQP protocol header: %q", stream[:min(8, len(stream))])
	}
	off := 8
	var cur map[string]any
	bits := func(w *wire, m map[string]any, names ...string) {
		b := w.u8()
		for i, n := range names {
			m[n] = b&(1<<i) != 0
		}
	}
	for off+7 <= len(stream) {
		typ := stream[off]
		size := int(binary.BigEndian.Uint32(stream[off+3:]))
		if off+8+size > len(stream) {
			break
		}
		payload := stream[off+7 : off+7+size]
		off += 8 + size
		w := &wire{b: payload}
		switch typ {
		case 1:
			cls, meth := w.u16(), w.u16()
			switch {
			case cls == 40 && meth == 10:
				w.u16()
				m := map[string]any{"method": "exchange.declare", "exchange": w.short(), "type": w.short()}
				bits(w, m, "passive", "durable", "auto_delete", "internal", "nowait")
				m["arguments"] = w.table()
				methods = append(methods, m)
			case cls == 50 && meth == 10:
				w.u16()
				m := map[string]any{"method": "queue.declare", "queue": w.short()}
				bits(w, m, "passive", "durable", "exclusive", "auto_delete", "nowait")
				m["arguments"] = w.table()
				methods = append(methods, m)
			case cls == 50 && meth == 20:
				w.u16()
				m := map[string]any{"method": "queue.bind", "queue": w.short(), "exchange": w.short(), "routing_key": w.short()}
				bits(w, m, "nowait")
				m["arguments"] = w.table()
				methods = append(methods, m)
			case cls == 60 && meth == 40:
				w.u16()
				cur = map[string]any{"exchange": w.short(), "routing_key": w.short()}
				bits(w, cur, "mandatory", "immediate")
				messages = append(messages, cur)
			}
		case 2:
			w.u16()
			w.u16()
			w.u64()
			flags := w.u16()
			props := map[string]any{}
			for i, name := range propNames {
				if flags&(1<<(15-i)) == 0 {
					continue
				}
				switch name {
				case "headers":
					props[name] = w.table()
				case "delivery_mode", "priority":
					props[name] = w.u8()
				case "timestamp":
					props[name] = w.u64()
				default:
					props[name] = w.short()
				}
			}
			cur["properties"] = props
			cur["body"] = ""
		case 3:
			cur["body"] = cur["body"].(string) + string(payload)
		}
	}
	return methods, messages
}

// normalize round-trips v through JSON so both sides compare alike.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

type amqpCapture struct {
	Call     string           `json:"call"`
	Methods  []map[string]any `json:"methods"`
	Messages []map[string]any `json:"messages"`
}

// headerMap turns a decoded table into key -> [type, value].
func headerMap(tbl any) map[string]any {
	out := map[string]any{}
	for _, kv := range tbl.([]any) {
		e := kv.([]any)
		out[e[0].(string)] = []any{e[1], e[2]}
	}
	return out
}

func TestAMQPGoldenAgainstCelery(t *testing.T) {
	rb := sharedRabbit(t)
	ctx := context.Background()
	// The exchange the capture's call sends to exists on the workers' side.
	conn, err := rb.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	if err := ch.ExchangeDeclare("mail", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("emails", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("emails", "mail.send", "mail", false, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		capture   string
		amqp      string // the config's amqp section
		entry     string
		argsTuple bool
	}{
		{capture: "plain", entry: "{task: tasks.add, every: 1s, args: [2, 3]}", argsTuple: true},
		{capture: "kwargs_unicode", entry: `{task: tasks.hello, every: 1s, kwargs: {who: "Zoë ☃"}}`},
		{capture: "custom_headers", argsTuple: true, entry: `{task: tasks.add, every: 1s, args: [5, 5], options: {headers: {x-tenant: acme, x-n: 7, x-neg: -3, x-big: 1099511627776, x-f: 1.5, x-t: true, x-none: null, x-list: [1, a, null, true], x-map: {k: v, n: 2}}}}`},
		{capture: "expires_seconds", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {expires: 120}}", argsTuple: true},
		{capture: "priority", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {priority: 5}}", argsTuple: true},
		{capture: "queue", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {queue: reports}}", argsTuple: true},
		{capture: "queue_celery", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {queue: celery}}", argsTuple: true},
		{capture: "limits", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {time_limit: 30, soft_time_limit: 20.5, ignore_result: true}}", argsTuple: true},
		{capture: "send_task_by_name", entry: "{task: remote.only.task, every: 1s, args: [1], kwargs: {a: [1, 2, {b: null}]}}"},
		{capture: "exchange_routing_key", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {exchange: mail, routing_key: mail.send}}", argsTuple: true},
		{capture: "max_priority", amqp: "amqp: {task_queue_max_priority: 10}\n", entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {queue: prio, priority: 7}}", argsTuple: true},
		{capture: "queue_arguments", amqp: "amqp: {queues: {lazyq: {queue_arguments: {x-queue-mode: lazy, x-max-priority: 5}, exchange: celery, routing_key: celery}}}\n",
			entry: "{task: tasks.add, every: 1s, args: [1, 1], options: {queue: lazyq}}", argsTuple: true},
	}
	for i, tt := range tests {
		t.Run(tt.capture, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "celery-wire-amqp", tt.capture+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var want amqpCapture
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Parse("golden.yaml", []byte(tt.amqp+"entries:\n  e:\n    "+tt.entry+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder(t, fmt.Sprintf("127.0.0.1:%d", rb.Port))
			var term termCheck
			term.current.Store(int64(100 + i))
			a, err := NewAMQP(AMQPOptions{URL: fmt.Sprintf("amqp://guest:guest@%s//", rec.ln.Addr()), Cluster: uniq("golden"),
				Verify: term.verify, Queues: func() Queues { return cfg.AMQP }})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			tctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if err := a.RaiseFence(tctx, int64(100+i)); err != nil {
				t.Fatal(err)
			}
			task, err := celery.Compile(cfg.Entries[0].Spec(), "beatd/test", "beatd@vm", "")
			if err != nil {
				t.Fatal(err)
			}
			fires := []celery.Fire{{Task: task, Slot: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}}
			res := make([]broker.Result, 1)
			if err := a.Publish(tctx, int64(100+i), fires, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish: %v %v", res, err)
			}
			a.Close()
			methods, messages := decodeFrames(t, rec.bytes())
			// beatd's own declarations (fence lock, journal) and its
			// passive existence check are not Celery's.
			var got []map[string]any
			for _, m := range methods {
				if q, _ := m["queue"].(string); strings.HasPrefix(q, "beatd.") || m["passive"] == true {
					continue
				}
				got = append(got, m)
			}
			// An AMQP table's order carries no meaning, and the Go client
			// writes a map's entries in map order: compare the arguments
			// tables as sets.
			if g, w := sortArguments(normalize(t, got)), sortArguments(normalize(t, want.Methods)); !reflect.DeepEqual(g, w) {
				t.Errorf("declarations\n got %v\nwant %v", g, w)
			}
			var msgs []map[string]any
			for _, m := range messages {
				if !strings.HasPrefix(m["routing_key"].(string), "beatd.") {
					msgs = append(msgs, m)
				}
			}
			if len(msgs) != 1 || len(want.Messages) != 1 {
				t.Fatalf("%d messages, capture %d", len(msgs), len(want.Messages))
			}
			compareAMQPMessage(t, normalize(t, msgs[0]).(map[string]any), normalize(t, want.Messages[0]).(map[string]any), tt.argsTuple)
		})
	}
}

func compareAMQPMessage(t *testing.T, got, want map[string]any, argsTuple bool) {
	t.Helper()
	for _, k := range []string{"exchange", "routing_key", "immediate", "body"} {
		if got[k] != want[k] {
			t.Errorf("%s = %q, Celery %q", k, got[k], want[k])
		}
	}
	// beatd publishes mandatory, so an unroutable message is an error
	// rather than silently dropped; Celery does not.
	if got["mandatory"] != true || want["mandatory"] != false {
		t.Errorf("mandatory = %v (Celery %v)", got["mandatory"], want["mandatory"])
	}
	gp, wp := got["properties"].(map[string]any), want["properties"].(map[string]any)
	gh, wh := headerMap(gp["headers"]), headerMap(wp["headers"])
	delete(gp, "headers")
	delete(wp, "headers")
	id := gh["id"].([]any)[1]
	if gh["root_id"].([]any)[1] != id || gp["correlation_id"] != id {
		t.Errorf("id %v, root_id %v, correlation_id %v differ", id, gh["root_id"], gp["correlation_id"])
	}
	if r, _ := gp["reply_to"].(string); len(r) != 36 {
		t.Errorf("reply_to = %q", gp["reply_to"])
	}
	for _, k := range []string{"correlation_id", "reply_to"} {
		delete(gp, k)
		delete(wp, k)
	}
	// The Go client cannot write a zero priority property; the worker
	// reads an absent priority as Kombu's default, 0.
	if wp["priority"] == 0.0 {
		delete(wp, "priority")
	}
	if !reflect.DeepEqual(gp, wp) {
		t.Errorf("properties\n got %v\nwant %v", gp, wp)
	}
	// expires: same type (null or string), a time; origin: beatd's.
	if g, w := gh["expires"].([]any)[0], wh["expires"].([]any)[0]; g != w {
		t.Errorf("expires type %v, Celery %v", g, w)
	}
	if o := gh["origin"].([]any)[1].(string); !strings.HasPrefix(o, "beatd@") {
		t.Errorf("origin = %q", o)
	}
	for _, k := range testutil.GoldenVaryingHeaders {
		delete(gh, k)
		delete(wh, k)
	}
	for _, k := range testutil.GoldenBeatdHeaders {
		if _, ok := gh[k]; !ok {
			t.Errorf("header %q missing", k)
		}
		delete(gh, k)
	}
	if argsTuple {
		r := wh["argsrepr"].([]any)[1].(string)
		wh["argsrepr"] = []any{"S", "[" + strings.TrimSuffix(strings.TrimPrefix(r, "("), ")") + "]"}
	}
	// py-amqp writes an int beyond 32 bits as 'L'; this client can only
	// write 'l', which py-amqp reads back as the same (positive) value.
	for k, v := range wh {
		if tv := v.([]any); tv[0] == "L" {
			if g, ok := gh[k].([]any); ok && g[0] == "l" && g[1] == tv[1] {
				gh[k] = v
			}
		}
	}
	// An AMQP table is a map to the worker; the Go client writes it in
	// map order, so nested tables compare as sets.
	if !reflect.DeepEqual(sortTables(gh), sortTables(wh)) {
		t.Errorf("headers\n got %v\nwant %v", gh, wh)
	}
}

// sortTables orders the entries of every nested 'F' table by key.
func sortTables(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = sortTables(e)
		}
	case []any:
		if len(x) == 2 {
			if ty, ok := x[0].(string); ok && ty == "F" {
				entries := x[1].([]any)
				sort.Slice(entries, func(i, j int) bool {
					return entries[i].([]any)[0].(string) < entries[j].([]any)[0].(string)
				})
				for _, e := range entries {
					kv := e.([]any)
					kv[2] = sortTables([]any{kv[1], kv[2]}).([]any)[1]
				}
				return x
			}
		}
		for i, e := range x {
			x[i] = sortTables(e)
		}
	}
	return v
}

// sortArguments orders the entries of every method's "arguments" table by
// key, in decoded methods as normalize returns them.
func sortArguments(v any) any {
	for _, m := range v.([]any) {
		method, ok := m.(map[string]any)
		if !ok {
			continue
		}
		if args, ok := method["arguments"].([]any); ok {
			sort.Slice(args, func(i, j int) bool {
				return fmt.Sprint(args[i].([]any)[0]) < fmt.Sprint(args[j].([]any)[0])
			})
		}
	}
	return v
}
