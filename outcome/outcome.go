package outcome

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
)

// Kind is what a run has reached, in the order a run usually goes
// through them. The zero Kind is unknown.
type Kind uint8

// The kinds of outcome. Published to Retried leave the run unfinished;
// the rest end it.
const (
	Unknown Kind = iota
	Published
	Received
	Started
	Retried
	Succeeded
	Failed
	Revoked
	Expired
	// Lost: no outcome came within the entry's overlap_timeout (a worker
	// killed mid-task, events and result backend both silent).
	Lost
	// Skipped: the slot was not published because the previous run was
	// unfinished (overlap: skip or buffer_one).
	Skipped
	// Unreported: no outcome within the overlap_timeout, while no source
	// reported anything at all (no workers with -E, no result backend):
	// beatd cannot tell a dead worker from its own blindness, so the run
	// stops blocking without counting as a failure.
	Unreported
	numKinds

	// NumKinds is one more than the largest Kind, for arrays by kind.
	NumKinds = numKinds
)

var kindNames = [...]string{"unknown", "published", "received", "started", "retried", "succeeded", "failed", "revoked", "expired", "lost", "skipped", "unreported"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Kinds lists every kind but Unknown, for metrics that pre-declare their
// label values.
func Kinds() []Kind {
	out := make([]Kind, 0, numKinds-1)
	for k := Published; k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// ParseKind is String's inverse.
func ParseKind(s string) (Kind, error) {
	for i, n := range kindNames {
		if n == s {
			return Kind(i), nil
		}
	}
	return Unknown, fmt.Errorf("unknown outcome %q", s)
}

// MarshalText writes the kind's name, for JSON.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	*k = v
	return err
}

// Finished says the run is over: it no longer blocks an overlap policy.
func (k Kind) Finished() bool { return k >= Succeeded }

// rank orders kinds for events that arrive out of order (task events
// and the result backend race): a run never goes back from a later
// kind to an earlier one, except that a retry starts it again.
func (k Kind) rank() int {
	switch k {
	case Published:
		return 1
	case Received, Retried:
		return 2
	case Started:
		return 3
	case Unknown:
		return 0
	default:
		return 4
	}
}

// Supersedes says whether an event of kind k moves a run that is at
// current. A finished run stays finished; a retried run may be received
// and started again.
func (k Kind) Supersedes(current Kind) bool {
	if current.Finished() {
		return false
	}
	if current == Retried {
		return k != Published
	}
	return k.rank() > current.rank() || k == Retried
}

// Event is one report about one task.
type Event struct {
	TaskID string
	Kind   Kind
	At     time.Time // when the worker (or the backend) says it happened
	// Runtime is the task's own run time (task-succeeded's runtime).
	Runtime time.Duration
	Worker  string // the worker's hostname, e.g. celery@host
	// ExcType and ExcMessage describe a failure or a retry's cause,
	// capped at MaxMessage bytes.
	ExcType, ExcMessage string
}

// MaxMessage caps an exception's message as kept: a traceback or a
// repr of a huge argument must not bloat the state.
const MaxMessage = 512

// celeryEvent is the part of a Celery task event that beatd reads.
type celeryEvent struct {
	Type      string   `json:"type"`
	UUID      string   `json:"uuid"`
	Hostname  string   `json:"hostname"`
	Timestamp float64  `json:"timestamp"`
	Runtime   *float64 `json:"runtime"`
	Exception string   `json:"exception"`
	Traceback string   `json:"traceback"`
	Expired   bool     `json:"expired"`
}

var eventKinds = map[string]Kind{
	"task-received":  Received,
	"task-started":   Started,
	"task-succeeded": Succeeded,
	"task-failed":    Failed,
	"task-retried":   Retried,
	"task-revoked":   Revoked,
	"task-rejected":  Failed,
}

// envelope is Kombu's message as the Redis transport writes it (and the
// AMQP transport's body is the inner body directly).
type envelope struct {
	Body       string `json:"body"`
	Properties struct {
		BodyEncoding string `json:"body_encoding"`
	} `json:"properties"`
}

// ParseRedisEvent decodes an event message as Kombu's Redis transport
// publishes it on the celeryev fanout: a JSON envelope whose body is one
// event or (routing key task.multi: workers buffer task events) a list.
// Events that are not about a task (worker-heartbeat...) are dropped.
func ParseRedisEvent(msg []byte, dst []Event) ([]Event, error) {
	var env envelope
	if err := json.Unmarshal(msg, &env); err != nil {
		return dst, fmt.Errorf("event envelope: %w", err)
	}
	body := []byte(env.Body)
	if env.Properties.BodyEncoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(env.Body)
		if err != nil {
			return dst, fmt.Errorf("event body: %w", err)
		}
		body = b
	}
	return ParseEventBody(body, dst)
}

// ParseEventBody decodes an event message's body: one event or a list.
func ParseEventBody(body []byte, dst []Event) ([]Event, error) {
	var evs []celeryEvent
	b := trimSpace(body)
	if len(b) > 0 && b[0] == '[' {
		if err := json.Unmarshal(b, &evs); err != nil {
			return dst, fmt.Errorf("event list: %w", err)
		}
	} else {
		var one celeryEvent
		if err := json.Unmarshal(b, &one); err != nil {
			return dst, fmt.Errorf("event: %w", err)
		}
		evs = []celeryEvent{one}
	}
	for _, e := range evs {
		kind, ok := eventKinds[e.Type]
		if !ok || e.UUID == "" {
			continue
		}
		if kind == Revoked && e.Expired {
			kind = Expired
		}
		ev := Event{TaskID: e.UUID, Kind: kind, Worker: e.Hostname, At: fromUnix(e.Timestamp)}
		if e.Runtime != nil && *e.Runtime >= 0 {
			ev.Runtime = time.Duration(*e.Runtime * float64(time.Second))
		}
		if kind == Failed || kind == Retried {
			ev.ExcType, ev.ExcMessage = Exception(e.Exception, e.Traceback)
		}
		dst = append(dst, ev)
	}
	return dst, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

func fromUnix(ts float64) time.Time {
	if ts <= 0 || math.IsNaN(ts) || math.IsInf(ts, 0) {
		return time.Time{}
	}
	sec, frac := math.Modf(ts)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// resultMeta is what Celery's key-value result backends store under
// celery-task-meta-<task id>.
type resultMeta struct {
	Status    string          `json:"status"`
	Result    json.RawMessage `json:"result"`
	Traceback string          `json:"traceback"`
	DateDone  string          `json:"date_done"`
	TaskID    string          `json:"task_id"`
	Worker    string          `json:"worker"` // with result_extended
}

var resultKinds = map[string]Kind{
	"RECEIVED": Received,
	"STARTED":  Started,
	"RETRY":    Retried,
	"SUCCESS":  Succeeded,
	"FAILURE":  Failed,
	"REVOKED":  Revoked,
	"REJECTED": Failed,
}

// ParseResult decodes a result backend's task meta. ok is false for a
// state that says nothing (PENDING, or a custom state).
func ParseResult(meta []byte) (ev Event, ok bool, err error) {
	var m resultMeta
	if err := json.Unmarshal(meta, &m); err != nil {
		return ev, false, fmt.Errorf("task meta: %w", err)
	}
	kind, known := resultKinds[m.Status]
	if !known {
		return ev, false, nil
	}
	ev = Event{TaskID: m.TaskID, Kind: kind, Worker: m.Worker}
	if t, err := time.Parse("2006-01-02T15:04:05.999999", m.DateDone); err == nil {
		ev.At = t.UTC()
	} else if t, err := time.Parse(time.RFC3339Nano, m.DateDone); err == nil {
		ev.At = t.UTC()
	}
	if kind == Failed || kind == Retried {
		var exc struct {
			Type    string          `json:"exc_type"`
			Message json.RawMessage `json:"exc_message"`
		}
		if json.Unmarshal(m.Result, &exc) == nil && exc.Type != "" {
			ev.ExcType, ev.ExcMessage = exc.Type, capped(excMessage(exc.Message))
		} else {
			ev.ExcType, ev.ExcMessage = Exception("", m.Traceback)
		}
	}
	return ev, true, nil
}

// excMessage reads exc_message: a list of the exception's args (one
// string, usually) or, from older Celerys, a string.
func excMessage(raw json.RawMessage) string {
	var args []any
	if json.Unmarshal(raw, &args) == nil {
		parts := make([]string, len(args))
		for i, a := range args {
			if s, ok := a.(string); ok {
				parts[i] = s
			} else {
				b, _ := json.Marshal(a)
				parts[i] = string(b)
			}
		}
		return strings.Join(parts, ", ")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}
