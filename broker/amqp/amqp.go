package amqp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/celery"

	"github.com/beatd/beatd/broker"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPOptions configure an AMQP dispatcher.
type AMQPOptions struct {
	// URL is the Celery broker URL: amqp://, amqps://, pyamqp://,
	// librabbitmq://, or several separated by ";".
	URL string
	// Password overrides the URL's (from a file or the environment).
	Password string
	// Cluster names beatd's own queues on the broker (fence lock and
	// journal) and namespaces task ids.
	Cluster string
	// Shard names the shard of a sharded cluster this dispatcher
	// publishes for: its fence lock and journal are the shard's own
	// (beatd.fence.<Cluster>.<Shard>), so each shard's leader is fenced
	// on its own. Empty for a cluster of one shard, whose names are those
	// of beatd before sharding.
	Shard string
	// Verify reports whether token is still the current term, with a
	// linearizable read of the election in etcd: nil if it is, an error
	// wrapping ErrStale if a newer term exists, any other error if it
	// cannot tell. It is required: it is half of the fence.
	Verify func(ctx context.Context, token int64) error
	// Queues returns how the workers declare their queues, from the
	// running schedule's amqp section. Nil, or a nil result: Celery's
	// defaults.
	Queues func() Queues
	// Registerer receives the AMQP metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Clock is the daemon's clock; a relative expiry counts from its now
	// (default the real clock).
	Clock clockwork.Clock
}

// AMQP publishes fires to RabbitMQ as Kombu's AMQP transport does for
// Celery, with publisher confirms and the mandatory flag.
//
// The fence. RabbitMQ runs no scripts, so the token cannot be compared
// with a fence atomically in the broker. Instead a term publishes only on
// a connection that owns the exclusive queue beatd.fence.<cluster>, a lock
// RabbitMQ gives to one connection at a time and takes back only when that
// connection closes. RaiseFence (and every reconnect) first takes the
// lock, then checks in etcd, with a linearizable read, that the term is
// still the current one. A leader elected later can only take the lock
// after every older connection is closed, and a deposed leader that takes
// the lock afterwards fails the etcd check. So once a new leader has
// raised its fence, a deposed leader can never put a message in a queue:
// its connection is gone, and no new connection passes the check. A paused
// leader's connection is closed by the broker after two missed heartbeats
// (?heartbeat=, default 2 s); until then the new leader waits.
//
// Per-term exchanges (beatd.term.<token>, bound exchange-to-exchange to the
// targets) were rejected: a consumer sees the exchange a message was
// published to, and Celery's Task.retry() re-publishes to it, which would
// fail once that term's exchange is deleted.
//
// Dedup. The claim of a slot lives in etcd (its last slot, written by the
// scheduler after each batch). Each batch is also written to a journal,
// the durable queue beatd.journal.<cluster>: an intent record (the batch's
// task ids) confirmed before the messages are published, a done record
// after they are all confirmed. A new leader reads the journal when it
// raises its fence: a slot of an older term's done record is not
// published again (a duplicate result); a slot of an intent without a done
// record is published again and counted in beatd_amqp_resends_total with a
// warning log (resend), as it may already be in a queue. The window that
// remains: a leader killed (or deposed) after the broker accepted some of
// a batch's messages and before that batch's done record was confirmed; its
// slots are re-sent by the next leader with the same task ids, and every
// such re-send is counted. The same holds within a term for a message
// sent and not confirmed (the broker failed or restarted): publishing it
// again is counted as a re-send. Nothing else is sent twice, provided the
// scheduler's etcd state trails the broker by fewer than journalMaxLength/2
// batches (the scheduler's per-batch state write keeps it at one).
type AMQP struct {
	urls     []AMQPURL
	opts     AMQPOptions
	log      *slog.Logger
	lockName string
	journal  string
	resends  *prometheus.CounterVec
	// allTerms is the re-send count of every term so far, carried from
	// journal record to journal record, so it survives the replica that
	// re-sent; the leader serves it.
	allTerms *prometheus.GaugeVec
	cum      map[string]int64

	mu       sync.Mutex // one publish, fence or release at a time
	conn     *amqp.Connection
	ch       *amqp.Channel // confirm mode
	returns  chan amqp.Return
	fenced   int64 // token verified on conn, 0 if none
	released map[int64]bool
	declared map[string]string // queue -> declaration fingerprint, on conn
	exchOK   map[string]bool   // exchanges known to exist, on conn
	done     map[string]bool   // task ids an older term surely published
	unsure   map[string]int64  // task ids an older term may have published -> its token
	// journalFor is the token done and unsure were read for: they are read
	// once per term, so a reconnect does not count a re-send twice.
	journalFor int64
	seq        uint64
}

// journalMaxLength bounds the journal: RabbitMQ drops the oldest records
// beyond it. Two records per batch; a new leader re-publishes an older
// term's unrecorded batch in its first batches, so far fewer are needed.
const journalMaxLength = 256

// maxChunk bounds the messages in flight per confirm wait, so the buffered
// returns channel can never fill (the client would block on it).
const maxChunk = 1024

// NewAMQP returns a dispatcher for opts. It does not connect: the leader
// connects when it raises its fence.
func NewAMQP(opts AMQPOptions) (*AMQP, error) {
	urls, err := ParseAMQPURLs(opts.URL, opts.Password)
	if err != nil {
		return nil, err
	}
	if opts.Verify == nil {
		return nil, errors.New("amqp: AMQP needs a leadership check (Verify)")
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	a := &AMQP{urls: urls, opts: opts, log: opts.Logger.With("component", "amqp"),
		lockName: lockName(opts.Cluster, opts.Shard), journal: journalName(opts.Cluster, opts.Shard),
		released: map[int64]bool{},
		resends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_amqp_resends_total",
			Help: "Slots published again that may already be in a queue: sent before without a confirm, by an older term stopped before its journal record or before a broker failure."},
			[]string{"entry"}),
		allTerms: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "beatd_amqp_resends_all_terms",
			Help: "Re-sends by every term so far (beatd_amqp_resends_total of all replicas, dead ones included), as recorded in the journal; current on the leader."},
			[]string{"entry"}),
		cum: map[string]int64{}}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{a.resends, a.allTerms} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("amqp: register AMQP metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Resends returns the re-send counter, by entry.
func (a *AMQP) Resends() *prometheus.CounterVec { return a.resends }

var errLocked = errors.New("fence lock held by another connection")

// RaiseFence takes the fence lock for token and checks the term in etcd,
// then reads the journal. It returns an error wrapping ErrStale when a
// newer term exists; any other error is transient (the scheduler retries),
// such as the lock still being held by a previous leader's connection
// that the broker has not yet closed. The lock is released when ctx (the
// term) ends.
func (a *AMQP) RaiseFence(ctx context.Context, token int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.fence(ctx, token); err != nil {
		return err
	}
	if !a.released[token] {
		a.released[token] = false
		context.AfterFunc(ctx, func() { a.release(token) })
	}
	return nil
}

// release closes the connection of a term that ended, which frees the
// lock at once for the next leader.
func (a *AMQP) release(token int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.released[token] = true
	if a.fenced == token {
		a.closeLocked()
	}
}

func (a *AMQP) closeLocked() {
	if a.conn != nil {
		// Bounded: a broker that does not answer (a partition) drops the
		// connection on its own after missed heartbeats. A socket
		// deadline is the OS's wall time, whatever clock the daemon reads.
		_ = a.conn.CloseDeadline(time.Now().Add(2 * time.Second))
	}
	a.conn, a.ch, a.fenced = nil, nil, 0
}

// fence makes sure conn is open, holds the lock, and was verified for
// token. Called with mu held.
func (a *AMQP) fence(ctx context.Context, token int64) error {
	if a.released[token] {
		return fmt.Errorf("%w: term %d ended", broker.ErrStale, token)
	}
	if a.conn != nil && a.conn.IsClosed() {
		a.closeLocked()
	}
	if a.conn != nil && a.fenced == token && a.ch != nil && !a.ch.IsClosed() {
		return nil
	}
	if a.conn == nil {
		if err := a.connect(); err != nil {
			return err
		}
	}
	if err := a.lock(); err != nil {
		if errors.Is(err, errLocked) {
			// Either a newer leader holds it, or an older connection
			// (ours or a deposed leader's) is not closed yet.
			if verr := a.opts.Verify(ctx, token); verr != nil {
				return verr
			}
		}
		return err
	}
	if err := a.opts.Verify(ctx, token); err != nil {
		a.closeLocked() // let the newer leader have the lock
		return err
	}
	if a.journalFor != token {
		if err := a.readJournal(token); err != nil {
			a.closeLocked()
			return err
		}
	}
	if a.ch == nil || a.ch.IsClosed() {
		if err := a.openPublishChannel(); err != nil {
			a.closeLocked()
			return err
		}
	}
	a.fenced = token
	return nil
}

func (a *AMQP) connect() error {
	conn, err := dialAny(a.urls, "beatd "+a.opts.Cluster)
	if err != nil {
		return err
	}
	a.conn = conn
	a.declared = map[string]string{}
	a.exchOK = map[string]bool{}
	return nil
}

// dialAny connects to the first of urls that answers.
func dialAny(urls []AMQPURL, name string) (*amqp.Connection, error) {
	var errs []error
	for _, u := range urls {
		conn, err := u.Dial(name, 0)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	return nil, fmt.Errorf("amqp: connect to RabbitMQ: %w", errors.Join(errs...))
}

// lock declares the exclusive lock queue on conn.
func (a *AMQP) lock() error {
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: open channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(a.lockName, false, false, true, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
		return fmt.Errorf("amqp: %w (%s)", errLocked, a.lockName)
	}
	if err != nil {
		return fmt.Errorf("amqp: take the fence lock %s: %w", a.lockName, err)
	}
	return nil
}

func (a *AMQP) openPublishChannel() error {
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("amqp: confirm mode: %w", err)
	}
	a.returns = ch.NotifyReturn(make(chan amqp.Return, maxChunk+8))
	a.ch = ch
	return nil
}

// The kinds of journal record: a batch about to be sent, the ids of it
// confirmed, and a term's clean end (CloseTerm).
const (
	kindIntent = "intent"
	kindDone   = "done"
	kindClosed = "closed"
)

// journalRecord is one journal message.
type journalRecord struct {
	Token int64    `json:"token"`
	Seq   uint64   `json:"seq"`
	Kind  string   `json:"kind"` // kindIntent, kindDone or kindClosed
	IDs   []string `json:"ids"`
	// Resends is the re-send count of every term so far, by entry,
	// including the re-sends of this batch (in its intent record, which
	// is confirmed before they go out).
	Resends map[string]int64 `json:"resends,omitempty"`
}

func (a *AMQP) journalArgs() amqp.Table {
	return amqp.Table{"x-max-length": int32(journalMaxLength)}
}

// readJournal reads every record without consuming it (the channel is
// closed unacknowledged, so RabbitMQ requeues them in place) and keeps the
// task ids of older terms.
func (a *AMQP) readJournal(token int64) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(a.journal, true, false, false, false, a.journalArgs()); err != nil {
		return fmt.Errorf("amqp: declare journal %s: %w", a.journal, err)
	}
	type key struct {
		token int64
		seq   uint64
	}
	intents := map[key][]string{}
	dones := map[key]bool{}
	done := map[string]bool{}
	var latest key
	var cum map[string]int64
	for i := 0; i < 2*journalMaxLength; i++ {
		m, ok, err := ch.Get(a.journal, false)
		if err != nil {
			return fmt.Errorf("amqp: read journal: %w", err)
		}
		if !ok {
			break
		}
		var r journalRecord
		if err := json.Unmarshal(m.Body, &r); err != nil || r.Token >= token {
			continue
		}
		k := key{r.Token, r.Seq}
		if k.token > latest.token || k.token == latest.token && k.seq >= latest.seq {
			latest, cum = k, r.Resends
		}
		switch r.Kind {
		case kindClosed:
			continue // a clean end: no ids
		case kindDone:
			dones[k] = true
			for _, id := range r.IDs {
				done[id] = true
			}
		default:
			intents[k] = r.IDs
		}
	}
	unsure := map[string]int64{}
	for k, ids := range intents {
		if dones[k] {
			continue
		}
		for _, id := range ids {
			if !done[id] {
				unsure[id] = k.token
			}
		}
	}
	a.done, a.unsure, a.journalFor = done, unsure, token
	a.cum = map[string]int64{}
	a.allTerms.Reset()
	for e, n := range cum {
		a.cum[e] = n
		a.allTerms.WithLabelValues(e).Set(float64(n))
	}
	if len(unsure) > 0 {
		a.log.Warn("an older term was stopped between publishing and its journal record; its slots will be re-sent if due, and counted",
			"token", token, "slots", len(unsure))
	}
	return nil
}

func (a *AMQP) writeJournal(ctx context.Context, r journalRecord) error {
	return publishRecord(ctx, a.ch, a.journal, r)
}

// publishRecord appends r to the journal queue on ch (in confirm mode)
// and waits for the broker's confirm.
func publishRecord(ctx context.Context, ch *amqp.Channel, journal string, r journalRecord) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", journal, true, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		return fmt.Errorf("amqp: journal: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("amqp: journal: %w", err)
	}
	if !ok {
		return errors.New("amqp: journal record not confirmed")
	}
	return nil
}

// Publish publishes fires (in chunks of at most maxChunk) with confirms
// and stores each outcome in results. A fire counts as published only when
// the broker confirmed it and did not return it. Fires that fail keep
// ResultError and are retried by the scheduler; their error names the
// entry. A newer term makes it return an error wrapping ErrStale.
func (a *AMQP) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range results {
		results[i] = broker.ResultError
	}
	if err := a.fence(ctx, token); err != nil {
		if errors.Is(err, broker.ErrStale) {
			for i := range results {
				results[i] = broker.ResultStale
			}
		}
		return err
	}
	var errs []error
	for start := 0; start < len(fires); start += maxChunk {
		end := min(start+maxChunk, len(fires))
		if err := a.publishChunk(ctx, token, fires[start:end], results[start:end]); err != nil {
			errs = append(errs, err)
			if a.ch == nil || a.ch.IsClosed() {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// batchBudget bounds one chunk's publishes and confirm waits once it has
// begun.
const batchBudget = 15 * time.Second

func (a *AMQP) publishChunk(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Once begun, a batch is finished even if the term's context ends
	// (SIGTERM finishes the publish in flight): abandoning the confirm
	// waits would turn messages RabbitMQ already took into re-sends.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchBudget)
	defer cancel()
	now := a.opts.Clock.Now()
	var queues Queues = celeryQueues{}
	if a.opts.Queues != nil {
		if q := a.opts.Queues(); q != nil {
			queues = q
		}
	}
	var errs []error
	todo := make([]int, 0, len(fires))
	var ids []string
	for i := range fires {
		f := &fires[i]
		f.Task.AssignID(f)
		id := string(f.ID[:])
		if !f.Manual && a.done[id] {
			results[i] = broker.ResultDuplicate // an older term's journal says it is in a queue
			continue
		}
		if err := a.declare(f.Task, queues); err != nil {
			errs = append(errs, err)
			continue
		}
		todo = append(todo, i)
		if !f.Manual {
			ids = append(ids, id)
		}
	}
	if len(todo) == 0 {
		return errors.Join(errs...)
	}
	a.seq++
	seq := a.seq
	// Count this batch's re-sends into the all-terms total before they go
	// out: the intent record carries it.
	cum, cloned := a.cum, false
	for _, i := range todo {
		if _, ok := a.unsure[string(fires[i].ID[:])]; ok {
			if !cloned {
				cum, cloned = maps.Clone(a.cum), true
			}
			cum[fires[i].Task.Name]++
		}
	}
	if len(ids) > 0 {
		if err := a.writeJournal(ctx, journalRecord{Token: token, Seq: seq, Kind: kindIntent, IDs: ids, Resends: cum}); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	for e, n := range cum {
		if a.cum[e] != n {
			a.allTerms.WithLabelValues(e).Set(float64(n))
		}
	}
	a.cum = cum
	confirms := make([]*amqp.DeferredConfirmation, len(fires))
	for _, i := range todo {
		f := &fires[i]
		pub, err := publishing(f.Task, f, token, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r := f.Task.AMQPRoute()
		dc, err := a.ch.PublishWithDeferredConfirmWithContext(ctx, r.PubExchange, r.PubKey, true, false, pub)
		if err != nil {
			errs = append(errs, fmt.Errorf("amqp: entry %q: publish: %w", f.Task.Name, err))
			break
		}
		confirms[i] = dc
		if u, ok := a.unsure[string(f.ID[:])]; ok {
			delete(a.unsure, string(f.ID[:]))
			a.resends.WithLabelValues(f.Task.Name).Inc()
			// chaos audits duplicates against this message: keep it "resend".
			a.log.Warn("resend", "why", "this slot may already be in a queue: it was sent before and not confirmed (by an older term stopped before its journal record, or before the broker failed)",
				"entry", f.Task.Name, "slot", f.Slot.UTC().Format(time.RFC3339Nano), "task_id", string(f.ID[:]),
				"token", token, "older_token", u)
		}
	}
	var published []string
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("amqp: entry %q: waiting for the broker's confirm: %w", fires[i].Task.Name, err))
		case !ok:
			errs = append(errs, fmt.Errorf("amqp: entry %q: the broker did not confirm the message (nack or connection lost)", fires[i].Task.Name))
		default:
			results[i] = broker.ResultOK
		}
		if results[i] != broker.ResultOK && !fires[i].Manual {
			// Sent but not confirmed: RabbitMQ may have enqueued it before
			// it failed or restarted. Publishing it again is a re-send.
			a.unsure[string(fires[i].ID[:])] = token
		}
	}
	// A basic.return reaches the returns channel before the confirm of
	// the same message, so every return of this chunk is buffered now.
	returned := map[string]amqp.Return{}
	for drained := false; !drained; {
		select {
		case r, open := <-a.returns:
			// A connection lost mid-chunk closes the returns channel: a
			// closed channel is drained (and would otherwise spin here).
			if !open {
				drained = true
				break
			}
			returned[r.CorrelationId] = r
		default:
			drained = true
		}
	}
	for i := range fires {
		if results[i] != broker.ResultOK {
			continue
		}
		if r, ok := returned[string(fires[i].ID[:])]; ok {
			results[i] = broker.ResultError
			errs = append(errs, fmt.Errorf("amqp: entry %q: unroutable, returned by the broker: %d %s (exchange %q, routing key %q)",
				fires[i].Task.Name, r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey))
			continue
		}
		if !fires[i].Manual {
			published = append(published, string(fires[i].ID[:]))
		}
	}
	if len(published) > 0 && a.ch != nil && !a.ch.IsClosed() {
		if err := a.writeJournal(ctx, journalRecord{Token: token, Seq: seq, Kind: kindDone, IDs: published, Resends: a.cum}); err != nil {
			// The messages are confirmed: they count. A later leader sees
			// the intent without a done record and counts its re-sends.
			a.log.Warn("journal done record not written", "err", err)
		}
	}
	return errors.Join(errs...)
}

// declare declares t's queue, its exchange and binding as Kombu's
// maybe_declare does for a Celery queue, once per connection (again when
// the config changes them), and checks that an explicit exchange exists.
// A failure closes only the declaring channel.
func (a *AMQP) declare(t *celery.Task, queues Queues) error {
	p := t.AMQPRoute()
	exchange, key := p.Exchange, p.BindingKey
	if ex, rk := queues.QueueBinding(p.Queue); ex != "" || rk != "" {
		if ex != "" {
			exchange = ex
		}
		if rk != "" {
			key = rk
		}
	}
	args, err := tableOf(queues.QueueArguments(p.Queue))
	if err != nil {
		return fmt.Errorf("amqp: queue %q: %w", p.Queue, err)
	}
	fp := exchange + "\x00" + key + "\x00" + fingerprint(args)
	needQueue := a.declared[p.Queue] != fp
	needExchange := p.PubExchange != "" && p.PubExchange != exchange && !a.exchOK[p.PubExchange]
	if !needQueue && !needExchange {
		return nil
	}
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: open channel: %w", err)
	}
	defer ch.Close()
	if needQueue {
		if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: entry %q: declare exchange %q: %w", t.Name, exchange, err)
		}
		if _, err := ch.QueueDeclare(p.Queue, true, false, false, false, args); err != nil {
			return fmt.Errorf("amqp: entry %q: declare queue %q as the workers do (amqp.Queues and task_queue_max_priority in the config must match their task_queues): %w", t.Name, p.Queue, err)
		}
		if err := ch.QueueBind(p.Queue, key, exchange, false, nil); err != nil {
			return fmt.Errorf("amqp: entry %q: bind queue %q to exchange %q: %w", t.Name, p.Queue, exchange, err)
		}
		a.declared[p.Queue] = fp
		a.exchOK[exchange] = true
	}
	if needExchange && !a.exchOK[p.PubExchange] {
		// Celery does not declare an exchange it is only told to send to;
		// the workers' task_queues do. Publishing to a missing one would
		// close the publishing channel, so check first.
		if err := ch.ExchangeDeclarePassive(p.PubExchange, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: entry %q: exchange %q does not exist (the workers declare it in task_queues): %w", t.Name, p.PubExchange, err)
		}
		a.exchOK[p.PubExchange] = true
	}
	return nil
}

func fingerprint(t amqp.Table) string {
	if len(t) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(t))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%T:%v;", k, t[k], t[k])
	}
	return b.String()
}

// Ping reports whether the broker answers: the leader's open connection,
// else a fresh connection, closed again.
func (a *AMQP) Ping(ctx context.Context) error {
	a.mu.Lock()
	up := a.conn != nil && !a.conn.IsClosed()
	a.mu.Unlock()
	if up {
		return nil
	}
	u := a.urls[0]
	deadline, ok := ctx.Deadline()
	timeout := u.ConnectTimeout
	if ok {
		// ctx's deadline is the OS's wall time, as the dial's is.
		timeout = min(timeout, time.Until(deadline))
	}
	conn, err := u.Dial("beatd ping "+a.opts.Cluster, max(timeout, time.Millisecond))
	if err != nil {
		return fmt.Errorf("RabbitMQ %s: %w", u, err)
	}
	return conn.Close()
}

// Close closes the connection (and so frees the fence lock).
func (a *AMQP) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closeLocked()
	return nil
}

// publishing is f's message as an amqp.Publishing: Celery's headers as
// a table with py-amqp's types.
func publishing(t *celery.Task, f *celery.Fire, token int64, now time.Time) (amqp.Publishing, error) {
	m := t.AMQPMessage(f, token, now)
	h := make(amqp.Table, len(m.Headers))
	for _, hd := range m.Headers {
		v, err := fieldOf(hd.Value)
		if err != nil {
			return amqp.Publishing{}, fmt.Errorf("amqp: entry %q: header %q: %w", t.Name, hd.Key, err)
		}
		h[hd.Key] = v
	}
	pub := amqp.Publishing{
		Headers:         h,
		ContentType:     "application/json",
		ContentEncoding: "utf-8",
		DeliveryMode:    amqp.Persistent,
		CorrelationId:   m.ID,
		ReplyTo:         m.ReplyTo,
		Body:            m.Body,
		Expiration:      m.Expiration,
	}
	if m.Priority != nil {
		pub.Priority = uint8(*m.Priority)
	}
	return pub, nil
}

// fieldOf converts a config value to the AMQP field type py-amqp writes
// for the same Python value: None 'V', bool 't', int 'I' within
// ±(2^31-1), float 'd', str 'S', list 'A', dict 'F'. py-amqp writes a
// larger int as a signed 64-bit 'L', which this client cannot write; it
// writes 'l', which py-amqp reads back as unsigned, so the same value for
// a positive int and a wrong one for a negative: those are refused.
func fieldOf(v any) (any, error) {
	switch x := v.(type) {
	case nil, bool, float64, string:
		return x, nil
	case int:
		return fieldOf(int64(x))
	case int64:
		if x >= -math.MaxInt32 && x <= math.MaxInt32 {
			return int32(x), nil
		}
		if x < 0 {
			return nil, fmt.Errorf("integer %d below %d cannot be sent as py-amqp would send it", x, -math.MaxInt32)
		}
		return x, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			f, err := fieldOf(e)
			if err != nil {
				return nil, err
			}
			out[i] = f
		}
		return out, nil
	case *celery.Map:
		return tableOf(x)
	}
	return nil, fmt.Errorf("unsupported value %T", v)
}

func tableOf(m *celery.Map) (amqp.Table, error) {
	if m == nil {
		return nil, nil
	}
	t := make(amqp.Table, m.Len())
	for i, k := range m.Keys {
		f, err := fieldOf(m.Values[i])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", k, err)
		}
		t[k] = f
	}
	return t, nil
}

// AMQPWindow states, for `beatd run --help` and the README, what an AMQP
// broker leaves of the exactly-once guarantee.
const AMQPWindow = "With RabbitMQ a slot can still be enqueued twice in one window: a leader killed or deposed after RabbitMQ " +
	"took some of a batch's messages and before that batch's journal record (beatd.journal.<cluster>) was confirmed, or " +
	"RabbitMQ failing after it stored a message and before it confirmed it; the slot is re-sent with the same task id " +
	"and counted in beatd_amqp_resends_total (and logged as resend; beatd_amqp_resends_all_terms on the leader sums every term). " +
	"A deposed leader can never publish after a new leader has fenced (exclusive lock queue beatd.fence.<cluster> + etcd check)."

// Queues says how the workers declare each queue (on RabbitMQ), so beatd
// declares it identically: a declaration that differs is refused.
type Queues interface {
	// QueueArguments are the queue's x-arguments in Kombu's order; nil
	// means none.
	QueueArguments(queue string) *celery.Map
	// QueueBinding is the exchange and routing key the queue is bound
	// with; "" means Celery's default, the queue's own name.
	QueueBinding(queue string) (exchange, routingKey string)
}

// celeryQueues declares every queue as a default Celery app does.
type celeryQueues struct{}

func (celeryQueues) QueueArguments(string) *celery.Map    { return nil }
func (celeryQueues) QueueBinding(string) (string, string) { return "", "" }
