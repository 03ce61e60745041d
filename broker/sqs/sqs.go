package sqs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsretry "github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/retry"
)

// Options configure an SQS dispatcher.
type Options struct {
	// URL is the Celery broker URL, sqs://… (ParseURL).
	URL string
	// Etcd and Prefix are the cluster's etcd, where the send records are
	// kept under the leader's fence.
	Etcd   *clientv3.Client
	Prefix string
	// AWS is the SDK config; nil loads the standard chain
	// (config.LoadDefaultConfig: environment, shared config and
	// credentials files, web identity).
	AWS        *aws.Config
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	Clock      clockwork.Clock
}

// SQS sends fires to Amazon SQS as Kombu's SQS transport does.
//
// The fence. SQS has no transaction, so nothing in it can refuse a
// deposed leader's send. Instead every batch is first written to etcd as
// an intent record (each message's queue, body and ids) in a transaction
// guarded by the term's election.Fence: a deposed leader's write fails,
// and it sends nothing. After the send the record is rewritten as done
// (the task ids SQS took, and the messages whose outcome is unknown).
//
// A new leader resolves every older term's record before it publishes
// (RaiseFence): it re-sends each message of an intent with no done
// record, and each message left unknown, with the same body, task id and,
// on a .fifo queue, the same MessageDeduplicationId (the task id, derived
// from the entry and slot), so SQS drops the copy it already holds
// within its 5-minute deduplication interval. The task ids of done
// records are answered as duplicates if the scheduler, whose state in
// etcd trails the broker, fires those slots again.
//
// What remains. On a standard queue a re-send of a message that SQS had
// taken is a duplicate: a leader killed or deposed between its send and
// its done record, or a send whose reply was lost (timeout, connection
// reset), or a leader paused between its intent record and its send that
// resumes after a new leader resolved the record. Every re-send is
// counted in beatd_sqs_resends_total (deduplicated="false" where SQS
// does not drop the copy) and logged as resend. Consumers can deduplicate
// on the task id, which is the slot's.
type SQS struct {
	url    URL
	opts   Options
	log    *slog.Logger
	clock  clockwork.Clock
	aws    aws.Config
	client *awssqs.Client

	resends   *prometheus.CounterVec
	throttled prometheus.Counter

	qmu    sync.Mutex
	queues map[string]string // SQS name -> URL

	mu     sync.Mutex // one publish or fence at a time
	fence  election.Fence
	done   map[string]bool // task ids an older term's records say SQS took
	unsure map[string]bool // this term's sends whose outcome is unknown
	seq    uint64
	trimAt uint64
}

// New returns a dispatcher for opts. It loads the AWS config but calls no
// AWS API: Check does, at start.
func New(ctx context.Context, opts Options) (*SQS, error) {
	u, err := ParseURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Etcd == nil {
		return nil, errors.New("sqs: SQS needs etcd for its send records")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	opts.Prefix = keys.Prefix(opts.Prefix)
	s := &SQS{url: u, opts: opts, log: opts.Logger.With("component", "sqs"), clock: opts.Clock,
		queues: map[string]string{}, done: map[string]bool{}, unsure: map[string]bool{},
		resends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_sqs_resends_total",
			Help: "Slots sent to SQS again that SQS may already hold (an older term's unconfirmed send, or a send whose reply was lost); deduplicated=\"true\" where SQS drops the copy (a .fifo queue within its 5-minute deduplication interval)."},
			[]string{"entry", "deduplicated"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_sqs_throttled_total",
			Help: "SQS calls or batch entries throttled (or failed on SQS's side) and retried with backoff."}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.resends, s.throttled} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("sqs: register metrics: %w", err)
			}
		}
	}
	if opts.AWS != nil {
		s.aws = opts.AWS.Copy()
	} else {
		var lo []func(*awsconfig.LoadOptions) error
		if u.Region != "" {
			lo = append(lo, awsconfig.WithRegion(u.Region))
		}
		if s.aws, err = awsconfig.LoadDefaultConfig(ctx, lo...); err != nil {
			return nil, fmt.Errorf("sqs: load the AWS config (environment, shared config files): %w", err)
		}
	}
	if u.Region != "" {
		s.aws.Region = u.Region
	}
	if s.aws.Region == "" {
		s.aws.Region = "us-east-1" // Kombu's default_region
	}
	// Throttling is retried here, with the project's one backoff, and
	// counted; the SDK's own retryer would hide it.
	s.aws.Retryer = func() aws.Retryer { return aws.NopRetryer{} }
	s.client = awssqs.NewFromConfig(s.aws, func(o *awssqs.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
	})
	return s, nil
}

// Resends is the re-send counter, by entry and whether SQS drops the copy.
func (s *SQS) Resends() *prometheus.CounterVec { return s.resends }

// Throttled is the count of throttled calls and entries retried.
func (s *SQS) Throttled() prometheus.Counter { return s.throttled }

// Region is the region in use.
func (s *SQS) Region() string { return s.aws.Region }

// Check is the start-up check: the AWS chain yields credentials, and
// every task's queue can be routed and exists or may be created (a
// rejected credential or a region with no SQS endpoint fails here).
func (s *SQS) Check(ctx context.Context, tasks ...*celery.Task) error {
	if _, err := s.aws.Credentials.Retrieve(ctx); err != nil {
		return fmt.Errorf("sqs: no AWS credentials from the standard chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "+
			"the shared credentials and config files with AWS_PROFILE, web identity with AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, or an instance role): %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for _, t := range tasks {
		name, err := s.queueName(t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		if _, err := s.queueURL(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Ping reports whether SQS answers with these credentials: a queue list
// (sqs:ListQueues, which Kombu's own queue cache needs too), or with
// predefined_queues, where Kombu lists nothing, a read of one queue's
// ARN (sqs:GetQueueAttributes).
func (s *SQS) Ping(ctx context.Context) error {
	for _, u := range s.url.PredefinedQueues {
		_, err := s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(u),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
		if err != nil {
			return s.explain("read the attributes of "+u, err)
		}
		return nil
	}
	_, err := s.client.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1), QueueNamePrefix: aws.String(s.url.QueueNamePrefix)})
	if err != nil {
		return s.explain("list queues", err)
	}
	return nil
}

// credentialCodes are the error codes of a credential SQS rejects.
var credentialCodes = map[string]bool{"InvalidClientTokenId": true, "SignatureDoesNotMatch": true, "UnrecognizedClientException": true,
	"InvalidSecurity": true, "ExpiredToken": true, "MissingAuthenticationToken": true, "IncompleteSignature": true,
	"AuthFailure": true, "InvalidAccessKeyId": true}

// explain wraps an SQS error with what it means for the operator.
func (s *SQS) explain(what string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		switch {
		case credentialCodes[code]:
			return fmt.Errorf("sqs: %s: AWS rejected the credentials (%s): check the AWS chain's access key, secret, session token or role: %w", what, code, err)
		case code == "AccessDenied" || code == "AccessDeniedException" || strings.HasSuffix(code, "AccessDenied"):
			return fmt.Errorf("sqs: %s: the credentials are not allowed to: %w", what, err)
		}
		return fmt.Errorf("sqs: %s: %w", what, err)
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && s.url.Endpoint == "" {
		return fmt.Errorf("sqs: %s: region %q has no SQS endpoint that resolves (%s): check region=, or set endpoint_url= (a VPC endpoint, an emulator): %w",
			what, s.aws.Region, dns.Name, err)
	}
	return fmt.Errorf("sqs: %s: %w", what, err)
}

// message is one message as it is (or was) sent, kept in a send record.
type message struct {
	ID    string `json:"id"`
	Entry string `json:"entry"`
	Slot  string `json:"slot"`
	Queue string `json:"queue"` // SQS name
	URL   string `json:"url"`
	Body  string `json:"body"`
	// Group and Dedup are a .fifo queue's MessageGroupId and
	// MessageDeduplicationId.
	Group string `json:"group,omitempty"`
	Dedup string `json:"dedup,omitempty"`

	outcome outcome
	err     error
	fire    int // index in the batch
}

type outcome int8

const (
	notSent outcome = iota // SQS refused it, or it was not attempted
	sent                   // SQS took it
	unknown                // the call's reply was lost: SQS may hold it
)

// record is one batch's send record in etcd.
type record struct {
	Token int64     `json:"token"`
	Seq   uint64    `json:"seq"`
	At    time.Time `json:"at"` // when it was written, before the send
	Done  bool      `json:"done"`
	// IDs are the task ids SQS took (in a done record).
	IDs []string `json:"ids,omitempty"`
	// Msgs are the messages to re-send if this term ends: all of an
	// intent's, and those of a done record whose outcome is unknown.
	Msgs []message `json:"msgs,omitempty"`
}

func (s *SQS) recordKey(token int64, seq uint64) string {
	return fmt.Sprintf("%s%020d/%020d", keys.SQSIntents(s.opts.Prefix), token, seq)
}

// putRecord writes r guarded by the fence: false if the term is over.
func (s *SQS) putRecord(ctx context.Context, key string, r record) (bool, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	resp, err := s.opts.Etcd.Txn(ctx).If(s.fence.Held()).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return false, fmt.Errorf("sqs: write send record: %w", err)
	}
	return resp.Succeeded, nil
}

// dedupWindow is how long after an intent record a re-send on a .fifo
// queue is surely within SQS's 5-minute deduplication interval of the
// first send (the send follows the record within a batch's budget).
const dedupWindow = 5*time.Minute - sendBudget - 30*time.Second

// RaiseFence starts token's term: it takes the term's fence from etcd
// (an error wrapping ErrStale if a newer term exists), then resolves
// every older term's send records: the messages an older term may not
// have sent are sent again, and counted.
func (s *SQS) RaiseFence(ctx context.Context, token int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fence.Token == token {
		return nil
	}
	f, err := election.CurrentFence(ctx, s.opts.Etcd, s.opts.Prefix)
	if errors.Is(err, election.ErrNoLeader) || err == nil && f.Token != token {
		return fmt.Errorf("%w: term %d is not the current one", broker.ErrStale, token)
	}
	if err != nil {
		return err
	}
	resp, err := s.opts.Etcd.Get(ctx, keys.SQSIntents(s.opts.Prefix), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("sqs: read send records: %w", err)
	}
	s.fence = f
	done := map[string]bool{}
	type open struct {
		key string
		r   record
	}
	var todo []open
	for _, kv := range resp.Kvs {
		var r record
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			s.log.Warn("unreadable SQS send record skipped", "key", string(kv.Key), "err", err)
			continue
		}
		if r.Token > token {
			s.fence = election.Fence{}
			return fmt.Errorf("%w: term %d wrote SQS send records", broker.ErrStale, r.Token)
		}
		for _, id := range r.IDs {
			done[id] = true
		}
		if len(r.Msgs) > 0 {
			todo = append(todo, open{string(kv.Key), r})
		}
	}
	s.done, s.unsure = done, map[string]bool{}
	var errs []error
	for _, o := range todo {
		var msgs []*message
		for i := range o.r.Msgs {
			if m := &o.r.Msgs[i]; !done[m.ID] {
				msgs = append(msgs, m)
			}
		}
		if len(msgs) > 0 {
			s.log.Warn("an older term's SQS send was not confirmed; its messages are sent again, and counted",
				"token", token, "older_token", o.r.Token, "messages", len(msgs))
		}
		s.send(ctx, msgs)
		var left []message
		for _, m := range msgs {
			switch m.outcome {
			case sent:
				o.r.IDs = append(o.r.IDs, m.ID)
				done[m.ID] = true
				dedup := m.Dedup != "" && s.clock.Since(o.r.At) < dedupWindow
				s.countResend(m, dedup, token, o.r.Token)
			case unknown:
				left = append(left, *m)
				errs = append(errs, m.err)
			default:
				// SQS refused it (the queue was deleted, the message is
				// too large for it now): re-sending cannot help.
				s.log.Error("an older term's message could not be sent again and is dropped", "entry", m.Entry, "slot", m.Slot,
					"task_id", m.ID, "queue", m.Queue, "err", m.err)
			}
		}
		o.r.Done, o.r.Msgs = true, left
		ok, err := s.putRecord(ctx, o.key, o.r)
		if err == nil && !ok {
			s.fence = election.Fence{}
			return fmt.Errorf("%w: term %d ended while resolving SQS send records", broker.ErrStale, token)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The scheduler raises the fence again; the records left say
		// what is still to resolve.
		s.fence = election.Fence{}
		return fmt.Errorf("sqs: resolve an older term's sends: %w", err)
	}
	s.seq = 0
	return nil
}

func (s *SQS) countResend(m *message, dedup bool, token, older int64) {
	s.resends.WithLabelValues(m.Entry, strconv.FormatBool(dedup)).Inc()
	// chaos audits duplicates against this message: keep it "resend".
	s.log.Warn("resend", "why", "this slot may already be in its SQS queue: it was sent before without a confirmed reply",
		"entry", m.Entry, "slot", m.Slot, "task_id", m.ID, "queue", m.Queue, "deduplicated_by_sqs", dedup,
		"token", token, "older_token", older)
}

// Publish sends fires and stores each outcome in results: an intent
// record under the fence, the sends in batches of ten, then the done
// record. A fire counts as published only when SQS named it among a
// batch's successes. A newer term makes it return an error wrapping
// ErrStale, with nothing sent.
func (s *SQS) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range results {
		results[i] = broker.ResultError
	}
	stale := func(why string) error {
		for i := range results {
			if results[i] == broker.ResultError {
				results[i] = broker.ResultStale
			}
		}
		return fmt.Errorf("%w: %s", broker.ErrStale, why)
	}
	if s.fence.Token != token {
		if token < s.fence.Token {
			return stale(fmt.Sprintf("term %d follows term %d", s.fence.Token, token))
		}
		return fmt.Errorf("sqs: term %d has not raised its fence", token)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Once begun, a batch is finished even if the term's context ends
	// (SIGTERM finishes the publish in flight).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sendBudget+10*time.Second)
	defer cancel()
	now := s.clock.Now()
	var errs []error
	msgs := make([]*message, 0, len(fires))
	var buf []byte
	for i := range fires {
		f := &fires[i]
		f.Task.AssignID(f)
		id := string(f.ID[:])
		// A scheduled slot's id and a manual request's are deterministic,
		// so an older term's record can vouch for them.
		if (!f.Manual || f.Request != "") && s.done[id] {
			results[i] = broker.ResultDuplicate // an older term's record says SQS took it
			continue
		}
		m, err := s.message(ctx, f, i, token, now, &buf)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return errors.Join(errs...)
	}
	// Each record stays well under etcd's request limit (1.5 MiB by
	// default): a batch of large messages takes several records.
	for len(msgs) > 0 {
		n, size := 0, 0
		for n < len(msgs) && (n == 0 || size+len(msgs[n].Body) <= maxRecordBodies) {
			size += len(msgs[n].Body)
			n++
		}
		if err := s.publishRecord(ctx, token, now, fires, results, msgs[:n], &errs); err != nil {
			if errors.Is(err, broker.ErrStale) {
				for i := range results {
					if results[i] == broker.ResultError {
						results[i] = broker.ResultStale
					}
				}
				return err
			}
			return errors.Join(append(errs, err)...)
		}
		msgs = msgs[n:]
	}
	if s.seq >= s.trimAt+trimEvery {
		s.trimAt = s.seq
		s.trim(ctx)
	}
	return errors.Join(errs...)
}

// maxRecordBodies bounds the message bodies one send record holds.
const maxRecordBodies = 768 * 1024

// publishRecord writes msgs' intent record under the fence, sends them,
// and rewrites the record as done; each fire's outcome goes to results,
// each failure to errs. It returns ErrStale (wrapped) when the fence is
// gone, with nothing sent, and an error when the record could not be
// written.
func (s *SQS) publishRecord(ctx context.Context, token int64, now time.Time, fires []celery.Fire, results []broker.Result, msgs []*message, errs *[]error) error {
	s.seq++
	key := s.recordKey(token, s.seq)
	rec := record{Token: token, Seq: s.seq, At: now, Msgs: make([]message, len(msgs))}
	for i, m := range msgs {
		rec.Msgs[i] = *m
	}
	ok, err := s.putRecord(ctx, key, rec)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: term %d's fence in etcd is gone (a newer leader was elected)", broker.ErrStale, token)
	}
	s.send(ctx, msgs)
	rec = record{Token: token, Seq: s.seq, At: now, Done: true}
	for _, m := range msgs {
		f := &fires[m.fire]
		switch m.outcome {
		case sent:
			results[m.fire] = broker.ResultOK
			rec.IDs = append(rec.IDs, m.ID)
			if s.unsure[m.ID] {
				delete(s.unsure, m.ID)
				s.countResend(m, m.Dedup != "", token, token)
			}
		case unknown:
			rec.Msgs = append(rec.Msgs, *m)
			if !f.Manual || f.Request != "" {
				s.unsure[m.ID] = true
			}
			*errs = append(*errs, m.err)
		default:
			*errs = append(*errs, m.err)
		}
	}
	if ok, err := s.putRecord(ctx, key, rec); err != nil || !ok {
		// The sends count; a later leader sees the intent and re-sends,
		// counted.
		s.log.Warn("SQS done record not written", "err", err, "fenced", ok)
	}
	return nil
}

// message builds fire i's SQS message: Kombu's envelope (celery's
// AppendMessage, as the Redis transport pushes it), base64-encoded as
// Kombu's sqs_base64_encoding does, for its queue.
func (s *SQS) message(ctx context.Context, f *celery.Fire, i int, token int64, now time.Time, buf *[]byte) (*message, error) {
	name, err := s.queueName(f.Task)
	if err != nil {
		return nil, err
	}
	qurl, err := s.queueURL(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("sqs: entry %q: %w", f.Task.Name, err)
	}
	*buf = f.Task.AppendMessage((*buf)[:0], f, token, now)
	id := string(f.ID[:])
	m := &message{ID: id, Entry: f.Task.Name, Slot: f.Slot.UTC().Format(time.RFC3339Nano), Queue: name, URL: qurl, fire: i}
	if s.url.Base64 {
		m.Body = base64.StdEncoding.EncodeToString(*buf)
	} else {
		m.Body = string(*buf)
	}
	if strings.HasSuffix(name, ".fifo") {
		// Kombu's defaults are "default" and a random uuid4; beatd's
		// dedup id is the task id, the slot's, so SQS drops a re-send.
		m.Group, m.Dedup = "default", id
	}
	if len(m.Body) > maxMessageBytes {
		return nil, fmt.Errorf("sqs: entry %q: a message of %d bytes is over SQS's limit of %d", f.Task.Name, len(m.Body), maxMessageBytes)
	}
	return m, nil
}

// keepRecords is how many done records are kept (the newest): the
// scheduler persists its state after each batch, so a new leader fires
// again only slots of the last few batches, which these answer as
// duplicates.
const keepRecords = 64

const trimEvery = 16

// trim deletes the done records beyond the newest keepRecords, guarded
// by the fence. An open record (messages still to resolve) is kept.
func (s *SQS) trim(ctx context.Context) {
	resp, err := s.opts.Etcd.Get(ctx, keys.SQSIntents(s.opts.Prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		s.log.Warn("SQS send records not trimmed", "err", err)
		return
	}
	var ops []clientv3.Op
	for i, kv := range resp.Kvs {
		if i < keepRecords {
			continue
		}
		var r record
		if json.Unmarshal(kv.Value, &r) == nil && r.Done && len(r.Msgs) == 0 {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), 64)
		if _, err := s.opts.Etcd.Txn(ctx).If(s.fence.Held()).Then(ops[:n]...).Commit(); err != nil {
			s.log.Warn("SQS send records not trimmed", "err", err)
			return
		}
		ops = ops[n:]
	}
}

// SQS's limits on SendMessageBatch: 10 entries and 256 KiB in all.
const (
	maxBatchEntries = 10
	maxBatchBytes   = 256 * 1024
	maxMessageBytes = 256 * 1024
	// sendBudget bounds the retries of one batch of ten.
	sendBudget = 20 * time.Second
	// sendParallel bounds the SendMessageBatch calls in flight.
	sendParallel = 8
)

// send sends msgs in batches of at most ten per queue, several at once,
// and sets each one's outcome.
func (s *SQS) send(ctx context.Context, msgs []*message) {
	var chunks [][]*message
	byQueue := map[string][]*message{}
	var order []string
	for _, m := range msgs {
		if _, ok := byQueue[m.URL]; !ok {
			order = append(order, m.URL)
		}
		byQueue[m.URL] = append(byQueue[m.URL], m)
	}
	for _, u := range order {
		var cur []*message
		size := 0
		for _, m := range byQueue[u] {
			if len(cur) == maxBatchEntries || size+len(m.Body) > maxBatchBytes {
				chunks = append(chunks, cur)
				cur, size = nil, 0
			}
			cur = append(cur, m)
			size += len(m.Body)
		}
		if len(cur) > 0 {
			chunks = append(chunks, cur)
		}
	}
	sem := make(chan struct{}, sendParallel)
	var wg sync.WaitGroup
	for _, c := range chunks {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.sendBatch(ctx, c)
		})
	}
	wg.Wait()
}

var throttles = awsretry.IsErrorThrottles(awsretry.DefaultThrottles)

// sendBatch sends one SendMessageBatch of up to ten messages to one
// queue, retrying what SQS throttled or failed on its side with the
// project's backoff.
func (s *SQS) sendBatch(ctx context.Context, msgs []*message) {
	b := retry.Backoff(50*time.Millisecond, 2*time.Second)
	deadline := s.clock.Now().Add(sendBudget)
	pending := msgs
	for len(pending) > 0 {
		in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(pending[0].URL)}
		for i, m := range pending {
			e := sqsEntry(i, m)
			in.Entries = append(in.Entries, e)
		}
		out, err := s.client.SendMessageBatch(ctx, in)
		var again []*message
		switch {
		case err != nil && throttles.IsErrorThrottle(err).Bool():
			s.throttled.Inc()
			again = pending
			for _, m := range pending {
				m.outcome, m.err = notSent, s.explain("send to queue "+m.Queue, err)
			}
		case err != nil:
			var ae smithy.APIError
			o := unknown // no answer: SQS may have taken them
			if errors.As(err, &ae) {
				o = notSent // SQS answered with an error: it took none
			}
			for _, m := range pending {
				m.outcome, m.err = o, fmt.Errorf("entry %q: %w", m.Entry, s.explain("send to queue "+m.Queue, err))
			}
			return
		default:
			named := map[int]bool{}
			for _, ok := range out.Successful {
				i, err := strconv.Atoi(aws.ToString(ok.Id))
				if err != nil || i < 0 || i >= len(pending) {
					continue
				}
				named[i] = true
				pending[i].outcome, pending[i].err = sent, nil
			}
			for _, f := range out.Failed {
				i, err := strconv.Atoi(aws.ToString(f.Id))
				if err != nil || i < 0 || i >= len(pending) {
					continue
				}
				named[i] = true
				m := pending[i]
				m.outcome = notSent
				m.err = fmt.Errorf("sqs: entry %q: queue %q refused the message: %s: %s", m.Entry, m.Queue, aws.ToString(f.Code), aws.ToString(f.Message))
				if !f.SenderFault {
					// SQS's side (throttled, internal error): retried.
					s.throttled.Inc()
					again = append(again, m)
				}
			}
			for i, m := range pending {
				if !named[i] {
					m.outcome = unknown
					m.err = fmt.Errorf("sqs: entry %q: SendMessageBatch's reply names %d of its %d entries, not this one: SQS may hold it (an emulator whose JSON batch reply misnames its keys answers this way)",
						m.Entry, len(out.Successful)+len(out.Failed), len(pending))
				}
			}
		}
		if len(again) == 0 {
			return
		}
		wait := b.NextBackOff()
		if s.clock.Now().Add(wait).After(deadline) || !retry.Sleep(ctx, s.clock, wait) {
			return
		}
		pending = again
	}
}

// Window states, for `beatd run --help` and the docs, what SQS leaves of
// the exactly-once guarantee.
const Window = "With SQS, every batch is recorded in etcd under the leader's fence before it is sent, and a new leader " +
	"re-sends what an older term did not confirm: nothing is missed. On a .fifo queue the re-send carries the slot's " +
	"MessageDeduplicationId, so SQS drops a copy within its 5-minute deduplication interval: no duplicate. On a standard " +
	"queue a re-send of a message SQS had taken is a duplicate, with the same task id, counted in beatd_sqs_resends_total " +
	"and logged as resend."
