package celery

import "time"

// SendOptions are the Celery send options beatd understands.
type SendOptions struct {
	Queue      string
	QueueSet   bool // options.queue was given: Celery then sends no priority property unless one is set
	Exchange   string
	RoutingKey string
	Priority   *int
	Expires    Expiry
	// LateExpires (late_slot_expires, beatd's own; 0: none) is the expiry
	// a late slot's message carries, counted from its publish: see
	// Expiry.Late.
	LateExpires   time.Duration
	Headers       *Map // merged over Celery's headers
	TimeLimit     any  // int64 or float64 seconds, nil when unset; kept as written
	SoftTimeLimit any
	IgnoreResult  bool
	// Templated: args, kwargs, headers or the canvas hold placeholders
	// (template.go), so each fire renders its own body.
	Templated bool
	// Canvas is the chain and callbacks sent with the task, nil for none.
	Canvas *Canvas
}

// Expiry is Celery's expires option: relative seconds or an absolute time.
type Expiry struct {
	After time.Duration // relative to the publish, when positive
	At    time.Time     // absolute, when not zero
}

// IsSet reports whether an expiry was configured.
func (e Expiry) IsSet() bool { return e.After > 0 || !e.At.IsZero() }

// Deadline is when a message published at now expires (Celery's expires
// header), or zero when no expiry is set.
func (e Expiry) Deadline(now time.Time) time.Time {
	if e.After > 0 {
		return now.Add(e.After).UTC()
	}
	return e.At
}

// TTL is the message's time to live in milliseconds from now (the broker
// expiration property), at least 0; meaningful only when IsSet.
func (e Expiry) TTL(now time.Time) int64 {
	if !e.At.IsZero() {
		return max(0, e.At.Sub(now).Milliseconds())
	}
	return e.After.Milliseconds()
}

// Late is the expiry of a message published for a late slot when the
// entry's late_slot_expires is late (> 0): whichever of e and late expires
// first, each counted as Celery counts it from the publish at now. An
// entry's own expires is never extended; without one the message expires
// late after its publish.
func (e Expiry) Late(now time.Time, late time.Duration) Expiry {
	if late <= 0 || e.IsSet() && !e.Deadline(now).After(now.Add(late)) {
		return e
	}
	return Expiry{After: late}
}

// ReservedHeaders are the message headers an entry's options.headers may
// not set: they carry the task's identity and the fence, which beatd
// writes. The config rejects them (with the line), and the publisher
// never lets one through.
var ReservedHeaders = map[string]bool{"task": true, "id": true, "root_id": true, "expires": true,
	"beat_entry": true, "beat_slot": true, "beat_fencing_token": true, "beat_manual": true}
