package celery

import (
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// Kombu's Redis transport conventions.
const (
	kombuSep          = "\x06\x16"
	bindingKeyPrefix  = "_kombu.binding."
	maxReprLen        = 1024 // Celery's saferepr limit for argsrepr/kwargsrepr
	defaultOriginHost = "localhost"
	defaultQueue      = "celery" // Celery's task_default_queue
)

var priorityStepsDefault = [...]int{0, 3, 6, 9}

// namespace is the UUIDv5 namespace of beatd task ids,
// uuid5(NAMESPACE_URL, "beatd") = 0f679077-44ce-532c-9c82-f906c94d7265, so any
// consumer can recompute an id from entry and slot.
var namespace = [16]byte{0x0f, 0x67, 0x90, 0x77, 0x44, 0xce, 0x53, 0x2c, 0x9c, 0x82, 0xf9, 0x06, 0xc9, 0x4d, 0x72, 0x65}

// part is a piece of a message: static bytes, or a value filled per fire.
type part struct {
	static []byte
	fill   fillKind
}

type fillKind uint8

const (
	fillNone fillKind = iota
	fillID
	fillExpires    // the "expires" header value: null, or a quoted ISO time
	fillExpiration // `"expiration": "ms", ` when an expiry is set
	fillSlot
	fillToken
	fillManual
	fillDeliveryTag
)

// Task is an entry compiled into everything about its messages that never
// changes, so a fire costs a few appends.
type Task struct {
	Name          string
	QueueKey      string // the Redis list, with Kombu's priority suffix
	BindingKey    string
	BindingMember string
	parts         []part
	idPrefix      []byte // "<cluster>/<entry>/" for the UUIDv5 name
	expires       Expiry
	lateExpires   time.Duration // SendOptions.LateExpires
	amqp          amqpParts
	// sent is the task-sent event's fields that never change (name, args
	// and kwargs reprs, routing), for --send-task-events.
	sent        []byte
	sentRouting []byte // queue, "exchange": …, "routing_key": …
	// dyn is set when each fire renders its own message (a chain, a
	// template); nil for the plain entries most are.
	dyn     *dynamic
	replyTo [36]byte
}

// header is one Celery message header: its JSON for the Redis envelope and
// its value for an AMQP table, or a value filled per fire.
type header struct {
	key   string
	value []byte // JSON
	val   any    // nil, bool, int64, float64, string, []any, *Map
	fill  fillKind
}

// amqpHeader is a header as the AMQP transport sends it: a table value,
// or one filled per fire. Kept apart from header, without its JSON: a
// template holds one for each of Celery's ~19 headers.
type amqpHeader struct {
	key  string
	val  any
	fill fillKind
}

// amqpParts are the pieces of the message that the AMQP transport sends
// apart: the body, the headers and the routing (amqp.go).
type amqpParts struct {
	body                 []byte
	headers              []amqpHeader
	queue                string // the queue declared, as Celery declares it
	exchange, bindingKey string // its exchange (direct) and binding
	pubExchange, pubKey  string // where the message is published
	priority             *int   // nil: no priority property
}

// Validate reports whether e can be compiled, without building anything.
func Validate(e *Spec) error { return ValidateOptions(e.Name, &e.Options) }

// ValidateOptions is Validate of the entry called name sending with o:
// what a Spec adds to them cannot fail. A leader validates every entry it
// loads, and building a Spec for it copied the options each time.
func ValidateOptions(name string, o *SendOptions) error {
	for i := 0; i < o.Headers.Len(); i++ {
		if k := o.Headers.Keys[i]; ReservedHeaders[k] {
			return fmt.Errorf("celery: entry %q: header %q is reserved", name, k)
		}
	}
	return nil
}

// Compile builds e's message template. cluster namespaces task ids; origin
// is the origin header, e.g. "beatd@host".
func Compile(e *Spec, cluster, origin, kombuPrefix string) (*Task, error) {
	if err := Validate(e); err != nil {
		return nil, err
	}
	if e.Options.Canvas == nil && !e.Options.Templated {
		return compile(e, nil, replyTo, cluster, origin, kombuPrefix), nil
	}
	// A chain's step ids and a template's values change with the slot:
	// the body is rendered per fire (dynamic). The template compiled here
	// from the spec as written serves what does not change (the routing).
	rt := clusterReplyTo(cluster)
	t := compile(e, nil, rt, cluster, origin, kombuPrefix)
	t.dyn = &dynamic{spec: e, cluster: cluster, origin: origin, prefix: kombuPrefix, replyTo: rt}
	return t, nil
}

// dynamic is what a chained or templated entry's fires render from.
type dynamic struct {
	spec                    *Spec
	cluster, origin, prefix string
	// replyTo is the cluster's, not the process's: it is in a chained
	// step's options, in the body, and a slot's body must be the same
	// whichever leader renders it.
	replyTo [36]byte
}

// clusterReplyTo is the reply_to of a cluster's rendered messages:
// UUIDv5 of "<cluster>/reply_to" in beatd's namespace. Like the
// process's, it names no queue anyone consumes (only Celery's RPC result
// backend reads it).
func clusterReplyTo(cluster string) [36]byte {
	return uuid5([]byte(cluster + "/reply_to"))
}

// task is the template of f's own message: e's values rendered for its
// slot and its embed for its task id (f.ID must be assigned). It costs a
// Compile per fire, paid only by entries with a chain or a template.
func (d *dynamic) task(f *Fire) *Task {
	e := *d.spec
	o := &e.Options
	if o.Templated {
		vars := &SlotVars{Name: e.Name, Slot: f.Slot, Zone: e.Zone, Attempt: 1}
		if e.Prev != nil {
			vars.Prev = e.Prev(f.Slot)
		}
		e.Args, _ = RenderValue(e.Args, vars).([]any)
		e.Kwargs, _ = RenderValue(e.Kwargs, vars).(*Map)
		o.Headers, _ = RenderValue(o.Headers, vars).(*Map)
		if c := o.Canvas; c != nil {
			o.Canvas = &Canvas{Chain: renderSteps(c.Chain, vars), Link: renderSteps(c.Link, vars), LinkError: renderSteps(c.LinkError, vars)}
		}
	}
	embed := o.Canvas.appendEmbed(nil, f.ID, d.replyTo)
	o.Canvas, o.Templated = nil, false
	return compile(&e, embed, d.replyTo, d.cluster, d.origin, d.prefix)
}

func renderSteps(steps []Step, vars *SlotVars) []Step {
	if len(steps) == 0 {
		return nil
	}
	out := make([]Step, len(steps))
	for i, s := range steps {
		out[i] = s
		out[i].Args, _ = RenderValue(s.Args, vars).([]any)
		out[i].Kwargs, _ = RenderValue(s.Kwargs, vars).(*Map)
		out[i].Options, _ = RenderValue(s.Options, vars).(*Map)
	}
	return out
}

// forFire is the template f's message is built from: t itself, unless
// t renders per fire. f.ID must be assigned.
func (t *Task) forFire(f *Fire) *Task {
	if t.dyn == nil {
		return t
	}
	return t.dyn.task(f)
}

// compile builds e's template; embed is the body's third element, nil
// for Celery's empty one, and rt its reply_to.
func compile(e *Spec, embed []byte, rt [36]byte, cluster, origin, kombuPrefix string) *Task {
	o := e.Options
	queue := o.Queue
	if queue == "" {
		queue = defaultQueue
	}
	prio := 0
	if o.Priority != nil {
		prio = *o.Priority
	}
	// A queue Celery creates on demand gets an exchange and routing key of
	// its own name; Celery goes through the anonymous exchange unless both
	// an exchange and a routing key are given.
	exchange, rkey := o.Exchange, o.RoutingKey
	deliveryExchange, deliveryKey := "", queue
	if exchange != "" && rkey != "" {
		deliveryExchange, deliveryKey = exchange, rkey
	}
	if exchange == "" {
		exchange = queue
	}
	if rkey == "" {
		rkey = queue
	}
	t := &Task{
		Name:          e.Name,
		QueueKey:      kombuPrefix + priorityKey(queue, prio),
		BindingKey:    kombuPrefix + bindingKeyPrefix + exchange,
		BindingMember: rkey + kombuSep + kombuSep + queue,
		idPrefix:      []byte(cluster + "/" + e.Name + "/"),
		replyTo:       rt,
		expires:       o.Expires,
		lateExpires:   o.LateExpires,
	}
	args := e.Args
	if args == nil {
		args = []any{}
	}
	kwargs := e.Kwargs
	if kwargs == nil {
		kwargs = &Map{}
	}
	body := appendJSON(nil, []any{args, kwargs})
	body = append(body[:len(body)-1], ", "...)
	if embed == nil {
		body = append(body, `{"callbacks": null, "errbacks": null, "chain": null, "chord": null}`...)
	} else {
		body = append(body, embed...)
	}
	body = append(body, ']')

	scratch := builderBufs.Get().(*[]byte)
	b := builder{buf: (*scratch)[:0]}
	defer func() { *scratch = b.buf[:0]; builderBufs.Put(scratch) }()
	b.static(`{"body": `)
	b.json(base64.StdEncoding.EncodeToString(body))
	b.static(`, "content-encoding": "utf-8", "content-type": "application/json", "headers": {`)

	kwrepr := saferepr(kwargs, maxReprLen)
	arepr := argsRepr(args)
	headers := []header{
		{"lang", []byte(`"py"`), "py", 0},
		{"task", appendJSON(nil, e.Task), e.Task, 0},
		{"id", nil, nil, fillID},
		{"shadow", []byte("null"), nil, 0},
		{"eta", []byte("null"), nil, 0},
		{"expires", nil, nil, fillExpires},
		{"group", []byte("null"), nil, 0},
		{"group_index", []byte("null"), nil, 0},
		{"retries", []byte("0"), int64(0), 0},
		{"timelimit", appendJSON(nil, []any{o.TimeLimit, o.SoftTimeLimit}), []any{o.TimeLimit, o.SoftTimeLimit}, 0},
		{"root_id", nil, nil, fillID},
		{"parent_id", []byte("null"), nil, 0},
		{"argsrepr", appendJSON(nil, arepr), arepr, 0},
		{"kwargsrepr", appendJSON(nil, kwrepr), kwrepr, 0},
		{"origin", appendJSON(nil, origin), origin, 0},
		{"ignore_result", appendJSON(nil, o.IgnoreResult), o.IgnoreResult, 0},
		{"replaced_task_nesting", []byte("0"), int64(0), 0},
		{"stamped_headers", []byte("null"), nil, 0},
		{"stamps", []byte("{}"), &Map{}, 0},
	}
	// Extra headers are merged over Celery's, as headers2.update(headers).
	for i := 0; i < o.Headers.Len(); i++ {
		k, val := o.Headers.Keys[i], o.Headers.Values[i]
		v := appendJSON(nil, val)
		replaced := false
		for j := range headers {
			if headers[j].key == k {
				headers[j].value, headers[j].val, replaced = v, val, true
			}
		}
		if !replaced {
			headers = append(headers, header{k, v, val, 0})
		}
	}
	// A queue Celery creates on demand is bound to a direct exchange of
	// its own name with its name as routing key, whatever exchange the
	// message is sent to (amqp.go may override it from the config).
	ah := make([]amqpHeader, len(headers))
	for i, h := range headers {
		ah[i] = amqpHeader{key: h.key, val: h.val, fill: h.fill}
	}
	t.amqp = amqpParts{body: body, headers: ah, queue: queue, exchange: queue, bindingKey: queue,
		pubExchange: deliveryExchange, pubKey: deliveryKey, priority: o.Priority}
	if o.Priority == nil && !o.QueueSet {
		// Celery drops a None priority when it routes to the default
		// queue, and Kombu then sends 0; with an explicit queue it keeps
		// None and py-amqp sends no priority property.
		t.amqp.priority = new(int)
	}
	for i, h := range headers {
		if i > 0 {
			b.static(", ")
		}
		b.json(h.key)
		b.static(": ")
		switch h.fill {
		case fillID:
			b.static(`"`)
			b.fill(fillID)
			b.static(`"`)
		case fillNone:
			b.raw(h.value)
		default:
			b.fill(h.fill)
		}
	}
	b.static(`, "beat_entry": `)
	b.json(e.Name)
	b.static(`, "beat_slot": "`)
	b.fill(fillSlot)
	b.static(`", "beat_fencing_token": `)
	b.fill(fillToken)
	b.fill(fillManual)
	b.static(`}, "properties": {"correlation_id": "`)
	b.fill(fillID)
	b.static(`", "reply_to": `)
	b.json(string(rt[:]))
	// As django-celery-beat sends it (a send option, so Celery puts it in
	// the properties): django-celery-results links each result to its
	// periodic task by it. py-amqp drops unknown properties, so the AMQP
	// path has nothing to send.
	b.static(`, "periodic_task_name": `)
	b.json(e.Name)
	b.static(`, "delivery_mode": 2, `)
	b.fill(fillExpiration)
	b.static(`"delivery_info": {"exchange": `)
	b.json(deliveryExchange)
	b.static(`, "routing_key": `)
	b.json(deliveryKey)
	b.static(`}, "priority": ` + strconv.Itoa(prio) + `, "body_encoding": "base64", "delivery_tag": "`)
	b.fill(fillDeliveryTag)
	b.static(`"}}`)
	t.parts = b.parts()
	// What Celery's send_task_message adds to the task-sent event after
	// the task's uuid, in its order (root_id and expires are per fire).
	sent := appendJSON(nil, "parent_id")
	sent = append(sent, ": null, \"name\": "...)
	sent = appendJSON(sent, e.Task)
	sent = append(sent, ", \"args\": "...)
	sent = appendJSON(sent, arepr)
	sent = append(sent, ", \"kwargs\": "...)
	sent = appendJSON(sent, kwrepr)
	sent = append(sent, ", \"retries\": 0, \"eta\": null"...)
	t.sent = sent
	t.sentRouting = append(appendJSON(nil, queue), ", \"exchange\": "...)
	t.sentRouting = appendJSON(t.sentRouting, deliveryExchange)
	t.sentRouting = append(t.sentRouting, ", \"routing_key\": "...)
	t.sentRouting = appendJSON(t.sentRouting, deliveryKey)
	return t
}

// SentEvent is what AppendSentEvent needs from the sender: who sends, and
// the Lamport clock Celery's dispatcher keeps.
type SentEvent struct {
	Hostname string // e.g. beatd@host
	PID      int
	Clock    uint64
	Now      time.Time
}

// AppendSentEvent appends the task-sent event of f (published, so its ID
// is set) as Kombu's Redis transport publishes it on the celeryev fanout,
// routing key task.sent: Flower and `celery events` then show beatd's
// sends as they show a producer's with task_send_sent_event.
func (t *Task) AppendSentEvent(dst []byte, f *Fire, ev SentEvent) []byte {
	t = t.forFire(f)
	body := make([]byte, 0, 512)
	body = append(body, `{"hostname": `...)
	body = appendJSON(body, ev.Hostname)
	body = append(body, `, "utcoffset": 0, "pid": `...)
	body = strconv.AppendInt(body, int64(ev.PID), 10)
	body = append(body, `, "clock": `...)
	body = strconv.AppendUint(body, ev.Clock, 10)
	body = append(body, `, "uuid": "`...)
	body = append(body, f.ID[:]...)
	body = append(body, `", "root_id": "`...)
	body = append(body, f.ID[:]...)
	body = append(body, `", `...)
	body = append(body, t.sent...)
	body = append(body, `, "expires": `...)
	if d := t.expiry(f, ev.Now).Deadline(ev.Now); !d.IsZero() {
		body = append(body, '"')
		body = appendISO(body, d)
		body = append(body, '"')
	} else {
		body = append(body, "null"...)
	}
	body = append(body, `, "queue": `...)
	body = append(body, t.sentRouting...)
	body = append(body, `, "timestamp": `...)
	body = strconv.AppendFloat(body, float64(ev.Now.UnixNano())/1e9, 'f', -1, 64)
	body = append(body, `, "type": "task-sent"}`...)
	dst = append(dst, `{"body": "`...)
	dst = base64.StdEncoding.AppendEncode(dst, body)
	dst = append(dst, `", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"hostname": `...)
	dst = appendJSON(dst, ev.Hostname)
	dst = append(dst, `}, "properties": {"delivery_mode": 1, "delivery_info": {"exchange": "celeryev", "routing_key": "task.sent"}, "priority": 0, "body_encoding": "base64", "delivery_tag": "`...)
	tag := newUUID4()
	dst = append(dst, tag[:]...)
	return append(dst, `"}}`...)
}

// argsRepr is Celery's saferepr(args): as_task_v2 does "args = args or ()",
// so empty args print as a tuple.
func argsRepr(args []any) string {
	if len(args) == 0 {
		return "()"
	}
	return saferepr(args, maxReprLen)
}

// priorityKey maps a priority onto Kombu's steps [0, 3, 6, 9]: the bare
// queue for step 0, else queue + "\x06\x16" + step.
func priorityKey(queue string, prio int) string {
	prio = max(0, min(prio, 9))
	step := 0
	for _, s := range priorityStepsDefault {
		if s <= prio {
			step = s
		}
	}
	if step == 0 {
		return queue
	}
	return queue + kombuSep + strconv.Itoa(step)
}

// replyTo stands in for Celery's app.thread_oid; only the RPC result
// backend reads it, and beatd is never a result consumer.
var replyTo = newUUID4()

type builder struct {
	buf   []byte // every static byte, in order
	spans []span
}

// builderBufs holds Compile's scratch: at a million entries most fires
// compile their template.
var builderBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// span is a part while the template is built: its static bytes are
// buf[start:end].
type span struct {
	start, end int
	fill       fillKind
}

func (b *builder) static(s string) {
	b.buf = append(b.buf, s...)
	b.grew()
}

func (b *builder) raw(p []byte) {
	b.buf = append(b.buf, p...)
	b.grew()
}

func (b *builder) json(v any) {
	b.buf = appendJSON(b.buf, v)
	b.grew()
}

// grew extends the last static part to the end of buf, or starts one.
func (b *builder) grew() {
	if n := len(b.spans); n > 0 && b.spans[n-1].fill == fillNone {
		b.spans[n-1].end = len(b.buf)
		return
	}
	start := 0
	if n := len(b.spans); n > 0 {
		start = b.spans[n-1].end
	}
	b.spans = append(b.spans, span{start: start, end: len(b.buf)})
}

func (b *builder) fill(kind fillKind) {
	b.spans = append(b.spans, span{start: len(b.buf), end: len(b.buf), fill: kind})
}

// parts returns the template's parts, their static bytes in one array
// of their exact size. A template is kept for each entry that fires
// often (20,000 of them in a large config): one array without the slack
// of append's doubling, read in order at every fire. With the AMQP
// headers kept without their JSON, a template went from ~4.3 to ~3.0 KB.
func (b *builder) parts() []part {
	mem := make([]byte, len(b.buf))
	copy(mem, b.buf)
	out := make([]part, len(b.spans))
	for i, sp := range b.spans {
		out[i] = part{static: mem[sp.start:sp.end:sp.end], fill: sp.fill}
	}
	return out
}

// Fire is one message to publish: an entry's slot, or a manual trigger.
type Fire struct {
	Task   *Task
	Slot   time.Time
	Manual bool
	// Late marks a scheduled slot published late, after an outage or in a
	// catch-up (the scheduler's one late-slot rule): its message expires as
	// the entry's late_slot_expires says (see Expiry.Late).
	Late bool
	// Request is a manual fire's trigger request id: its task id and its
	// trigger key derive from it, so a new leader that publishes the same
	// request again is deduplicated. Empty: a one-time manual fire.
	Request string
	// Backfill is the backfill job a past slot is published for: the
	// slot's task id is a scheduled fire's, and the broker dedups it
	// against the job's cursor instead of the entry's high-water mark.
	Backfill string
	// ID is the task id; AppendMessage sets it.
	ID [36]byte
}

// RequestKey names a manual fire in its trigger key: its request, else
// its (random) task id.
func (f *Fire) RequestKey() string {
	if f.Request != "" {
		return f.Request
	}
	return string(f.ID[:])
}

// SlotID returns the deterministic task id of (entry, slot): UUIDv5 of
// "<cluster>/<entry>/<slot as RFC 3339 UTC>".
func (t *Task) SlotID(slot time.Time) [36]byte {
	var buf [256]byte
	name := append(buf[:0], t.idPrefix...)
	name = slot.UTC().AppendFormat(name, time.RFC3339Nano)
	return uuid5(name)
}

// SlotIDOf is the task id of (entry, slot) in cluster, without the
// entry's template: the same as Task.SlotID.
func SlotIDOf(cluster, entry string, slot time.Time) [36]byte {
	var buf [256]byte
	name := append(buf[:0], cluster+"/"+entry+"/"...)
	name = slot.UTC().AppendFormat(name, time.RFC3339Nano)
	return uuid5(name)
}

func uuid5(name []byte) [36]byte {
	var buf [512]byte
	data := append(append(buf[:0], namespace[:]...), name...)
	sum := sha1.Sum(data)
	var u [16]byte
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return formatUUID(u)
}

func newUUID4() [36]byte {
	var u [16]byte
	a, c := rand.Uint64(), rand.Uint64()
	for i := 0; i < 8; i++ {
		u[i] = byte(a >> (8 * i))
		u[8+i] = byte(c >> (8 * i))
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return formatUUID(u)
}

func formatUUID(u [16]byte) [36]byte {
	var out [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[j] = '-'
			j++
		}
		out[j], out[j+1] = hexDigits[c>>4], hexDigits[c&0xf]
		j += 2
	}
	return out
}

// AssignID sets f.ID, the task id: UUIDv5 of the slot for a scheduled
// fire, of its request for a manual one (so a new leader that publishes
// the request again sends the same task), a random UUIDv4 for a manual
// fire without a request.
func (t *Task) AssignID(f *Fire) {
	switch {
	case f.Manual && f.Request != "":
		var buf [256]byte
		f.ID = uuid5(append(append(buf[:0], t.idPrefix...), "trigger/"+f.Request...))
	case f.Manual:
		f.ID = newUUID4()
	default:
		f.ID = t.SlotID(f.Slot)
	}
}

// AMQPRoute is where Kombu's AMQP transport sends a task's messages, and
// how it declares their queue.
type AMQPRoute struct {
	Queue                string // the queue, as Celery declares it
	Exchange, BindingKey string // its exchange (direct) and binding
	PubExchange, PubKey  string // where the message is published
}

// AMQPRoute returns t's route.
func (t *Task) AMQPRoute() AMQPRoute {
	p := &t.amqp
	return AMQPRoute{Queue: p.queue, Exchange: p.exchange, BindingKey: p.bindingKey, PubExchange: p.pubExchange, PubKey: p.pubKey}
}

// Header is one message header with its Python value (nil, bool, int64,
// *big.Int, float64, string, []any or *Map), for a transport that sends
// headers as a table.
type Header struct {
	Key   string
	Value any
}

// AMQPMessage is a fire's message as Kombu's AMQP transport sends it:
// the protocol v2 body, Celery's headers in order, and the properties.
type AMQPMessage struct {
	ID      string
	Body    []byte
	Headers []Header
	ReplyTo string
	// Expiration is the message TTL in milliseconds, "" for none.
	Expiration string
	Priority   *int // nil: no priority property
}

// AMQPMessage builds f's AMQP message; f.ID must be assigned.
func (t *Task) AMQPMessage(f *Fire, token int64, now time.Time) AMQPMessage {
	t = t.forFire(f)
	p := &t.amqp
	exp := t.expiry(f, now)
	m := AMQPMessage{ID: string(f.ID[:]), Body: p.body, ReplyTo: string(t.replyTo[:]), Priority: p.priority,
		Headers: make([]Header, 0, len(p.headers)+4)}
	for _, hd := range p.headers {
		v := hd.val
		switch hd.fill {
		case fillID:
			v = m.ID
		case fillExpires:
			v = nil
			if d := exp.Deadline(now); !d.IsZero() {
				v = string(appendISO(nil, d))
			}
		}
		m.Headers = append(m.Headers, Header{hd.key, v})
	}
	m.Headers = append(m.Headers, Header{"beat_entry", t.Name}, Header{"beat_slot", f.Slot.UTC().Format(time.RFC3339Nano)},
		Header{"beat_fencing_token", token})
	if f.Manual {
		m.Headers = append(m.Headers, Header{"beat_manual", true})
	}
	if exp.IsSet() {
		m.Expiration = strconv.FormatInt(exp.TTL(now), 10)
	}
	return m
}

// AppendMessage appends the JSON message of f to dst, as Kombu would LPUSH
// it, and records the task id in f.ID. now is the publish time, from which
// a relative expiry counts, as in Celery.
func (t *Task) AppendMessage(dst []byte, f *Fire, token int64, now time.Time) []byte {
	t.AssignID(f)
	t = t.forFire(f)
	exp := t.expiry(f, now)
	for i := range t.parts {
		p := &t.parts[i]
		switch p.fill {
		case fillNone:
			dst = append(dst, p.static...)
		case fillID:
			dst = append(dst, f.ID[:]...)
		case fillExpires:
			if d := exp.Deadline(now); !d.IsZero() {
				dst = append(dst, '"')
				dst = appendISO(dst, d)
				dst = append(dst, '"')
			} else {
				dst = append(dst, "null"...)
			}
		case fillExpiration:
			if exp.IsSet() {
				dst = append(dst, `"expiration": "`...)
				dst = strconv.AppendInt(dst, exp.TTL(now), 10)
				dst = append(dst, `", `...)
			}
		case fillSlot:
			dst = f.Slot.UTC().AppendFormat(dst, time.RFC3339Nano)
		case fillToken:
			dst = strconv.AppendInt(dst, token, 10)
		case fillManual:
			if f.Manual {
				dst = append(dst, `, "beat_manual": true`...)
			}
		case fillDeliveryTag:
			tag := newUUID4()
			dst = append(dst, tag[:]...)
		}
	}
	return dst
}

// expiry is the expiry f's message carries when published at now.
func (t *Task) expiry(f *Fire, now time.Time) Expiry {
	if f.Late {
		return t.expires.Late(now, t.lateExpires)
	}
	return t.expires
}

// appendISO writes Python's datetime.isoformat(): microseconds only when
// non-zero, and a numeric offset ("+00:00", never "Z").
func appendISO(dst []byte, t time.Time) []byte {
	if t.Nanosecond()/1000 == 0 {
		return t.AppendFormat(dst, "2006-01-02T15:04:05-07:00")
	}
	return t.AppendFormat(dst, "2006-01-02T15:04:05.000000-07:00")
}
