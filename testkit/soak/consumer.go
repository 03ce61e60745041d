package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LagMode says how a message's lag is measured.
type LagMode int

const (
	// LagSlot: receive time minus the slot the message carries in its
	// beat_slot header (beatd's messages).
	LagSlot LagMode = iota
	// LagGrid: receive time minus the entry's ideal grid time, first
	// receive + k × interval for its k-th message (celery beat's messages
	// carry no slot; an entry is told apart by its task name). A scheduler
	// that drifts or falls behind accumulates lag.
	LagGrid
)

// LagDefinition describes a mode in words, for reports.
func (m LagMode) String() string {
	if m == LagGrid {
		return "receive time - (entry's first receive + k*interval), k-th message of the entry"
	}
	return "receive time - the slot in the beat_slot header"
}

// Window is what the consumer saw between two calls of Take.
type Window struct {
	Start, End time.Time
	Messages   int
	Lag        Hist
	// Period is the time between two receives of the same entry.
	Period Hist
	// Repeats are messages whose slot is not after the entry's previous
	// one (a duplicate or a reordering); Gaps are slots an entry skipped
	// (LagSlot only).
	Repeats, Gaps int
	Unparsed      int
	// Entries is how many distinct entries the window saw.
	Entries int
}

type entryState struct {
	lastSlot  time.Time
	lastRecv  time.Time
	firstRecv time.Time
	n         int64
	window    int64 // the window count when last seen
}

// Consumer drains one Celery queue on Redis and measures every message.
type Consumer struct {
	rdb      *redis.Client
	queue    string
	mode     LagMode
	interval time.Duration
	// every, when set, drains the queue once per period instead of
	// continuously: a Celery worker pool that falls behind and catches up.
	every time.Duration

	mu       sync.Mutex
	entries  map[string]*entryState
	cur      *Window
	windowNo int64
	total    Window
	err      error
	slotMemo map[string]time.Time
	// bySecond counts the messages by their slot's Unix second (LagSlot):
	// what was delivered of each second's due slots, whenever received.
	bySecond map[int64]int

	cancel context.CancelFunc
	done   chan struct{}
}

// StartConsumer starts draining queue until Stop.
func StartConsumer(rdb *redis.Client, queue string, mode LagMode, interval time.Duration) *Consumer {
	return StartConsumerEvery(rdb, queue, mode, interval, 0)
}

// StartConsumerEvery is StartConsumer draining the queue once every
// every (0: continuously).
func StartConsumerEvery(rdb *redis.Client, queue string, mode LagMode, interval, every time.Duration) *Consumer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{rdb: rdb, queue: queue, mode: mode, interval: interval, every: every, entries: map[string]*entryState{},
		cur: &Window{Start: time.Now()}, slotMemo: map[string]time.Time{}, bySecond: map[int64]int{}, cancel: cancel, done: make(chan struct{})}
	c.total.Start = c.cur.Start
	go c.loop(ctx)
	return c
}

// Stop ends the loop and waits for it; it returns the first Redis error
// the loop met, if any.
func (c *Consumer) Stop() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Backlog is the number of messages waiting in the queue: when it grows,
// the consumer is behind and lag includes its delay, not only the
// scheduler's.
func (c *Consumer) Backlog(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := c.rdb.LLen(ctx, c.queue).Result()
	if err != nil {
		return -1
	}
	return n
}

// Take returns the current window and starts a new one.
func (c *Consumer) Take() Window {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.cur
	w.End = now
	c.cur = &Window{Start: now}
	c.windowNo++
	return *w
}

// Total is everything seen since the start.
func (c *Consumer) Total() Window {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.total
	t.End = time.Now()
	t.Entries = len(c.entries)
	return t
}

// SlotCounts is, by Unix second, how many messages carried a slot in that
// second (LagSlot only).
func (c *Consumer) SlotCounts() map[int64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int64]int, len(c.bySecond))
	for k, v := range c.bySecond {
		out[k] = v
	}
	return out
}

const consumeBatch = 2000

func (c *Consumer) loop(ctx context.Context) {
	defer close(c.done)
	var pc *popConn
	defer func() {
		if pc != nil {
			pc.Close()
		}
	}()
	// pop drains one batch, blocking up to block for a message when the
	// queue is empty; on plain TCP over a raw connection (popConn), else
	// with go-redis.
	raw := true
	pop := func(block time.Duration) ([][]byte, error) {
		if raw && pc == nil {
			var err error
			if pc, err = dialPop(ctx, c.rdb.Options()); err != nil {
				raw = false
			}
		}
		if pc != nil {
			msgs, err := pc.pop(c.queue, consumeBatch, block)
			if err != nil {
				pc.Close()
				pc = nil // redialled on the next call
			}
			return msgs, err
		}
		vals, err := c.rdb.RPopCount(ctx, c.queue, consumeBatch).Result()
		if (errors.Is(err, redis.Nil) || err == nil && len(vals) == 0) && block > 0 {
			var kv []string
			kv, err = c.rdb.BRPop(ctx, block, c.queue).Result()
			vals = nil
			if err == nil && len(kv) == 2 {
				vals = kv[1:]
			}
		}
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		msgs := make([][]byte, len(vals))
		for i, v := range vals {
			msgs[i] = []byte(v)
		}
		return msgs, err
	}
	if c.every > 0 {
		c.loopEvery(ctx, pop)
		return
	}
	for ctx.Err() == nil {
		// Empty: block briefly rather than spin, and briefly enough for
		// Stop not to wait on a raw connection's BRPOP.
		msgs, err := pop(200 * time.Millisecond)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.fail(err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if len(msgs) > 0 {
			c.record(time.Now(), msgs)
		}
	}
}

// loopEvery empties the queue once per period, in batches.
func (c *Consumer) loopEvery(ctx context.Context, pop func(time.Duration) ([][]byte, error)) {
	tick := time.NewTicker(c.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for ctx.Err() == nil {
			msgs, err := pop(0)
			if err != nil {
				if ctx.Err() == nil {
					c.fail(err)
				}
				break
			}
			if len(msgs) == 0 {
				break
			}
			c.record(time.Now(), msgs)
		}
	}
}

func (c *Consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = fmt.Errorf("soak: consume %q: %w", c.queue, err)
	}
}

// record measures a batch received at now.
func (c *Consumer) record(now time.Time, vals [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.cur
	for _, raw := range vals {
		var name []byte
		var slot time.Time
		if c.mode == LagSlot {
			var end int
			name, end = headerValueAt(raw, "beat_entry")
			s := headerValue(raw[end:], "beat_slot")
			t, ok := c.slotMemo[string(s)]
			if !ok && len(s) > 0 {
				var err error
				if t, err = time.Parse(time.RFC3339Nano, string(s)); err == nil {
					if len(c.slotMemo) > 100_000 {
						clear(c.slotMemo)
					}
					c.slotMemo[string(s)] = t
					ok = true
				}
			}
			if !ok {
				name = nil
			}
			slot = t
		} else {
			name = headerValue(raw, "task")
		}
		if len(name) == 0 {
			w.Unparsed++
			c.total.Unparsed++
			continue
		}
		e := c.entries[string(name)]
		if e == nil {
			e = &entryState{firstRecv: now, window: -1}
			c.entries[string(name)] = e
		}
		if e.window != c.windowNo {
			e.window = c.windowNo
			w.Entries++
		}
		var lag time.Duration
		if c.mode == LagSlot {
			if c.bySecond == nil {
				c.bySecond = map[int64]int{}
			}
			c.bySecond[slot.Unix()]++
			lag = now.Sub(slot)
			if !e.lastSlot.IsZero() {
				switch {
				case !slot.After(e.lastSlot):
					w.Repeats++
					c.total.Repeats++
				case c.interval > 0 && slot.Sub(e.lastSlot) > c.interval*3/2:
					g := int(slot.Sub(e.lastSlot)/c.interval) - 1
					w.Gaps += g
					c.total.Gaps += g
				}
			}
			if slot.After(e.lastSlot) {
				e.lastSlot = slot
			}
		} else {
			lag = now.Sub(e.firstRecv.Add(time.Duration(e.n) * c.interval))
		}
		if !e.lastRecv.IsZero() {
			w.Period.Add(now.Sub(e.lastRecv))
			c.total.Period.Add(now.Sub(e.lastRecv))
		}
		e.lastRecv = now
		e.n++
		w.Lag.Add(lag)
		c.total.Lag.Add(lag)
		w.Messages++
		c.total.Messages++
	}
}

// headerValue finds "key": "value" in a message's JSON and returns value
// (empty when absent). It is a scan, not a JSON parse, to keep the
// consumer cheap at tens of thousands of messages a second; the values it
// reads (entry names, task names, RFC 3339 times) hold no escapes.
func headerValue(raw []byte, key string) []byte {
	v, _ := headerValueAt(raw, key)
	return v
}

// headerValueAt is headerValue, and where in raw the value ends (0 when
// absent): beatd's beat_slot header follows its beat_entry, and is looked
// for from there.
func headerValueAt(raw []byte, key string) ([]byte, int) {
	// The needle leaves out its opening quote: bytes.Index looks for the
	// needle's first byte, and a JSON message is full of quotes.
	needle := []byte(key + `"`)
	for off := 0; ; {
		i := bytes.Index(raw[off:], needle)
		if i < 0 {
			return nil, 0
		}
		i += off
		off = i + len(needle)
		if i == 0 || raw[i-1] != '"' {
			continue
		}
		rest := bytes.TrimLeft(raw[off:], " \t")
		rest, ok := bytes.CutPrefix(rest, []byte(":"))
		if !ok {
			continue // a value that reads like the key
		}
		rest = bytes.TrimLeft(rest, " \t")
		rest, ok = bytes.CutPrefix(rest, []byte(`"`))
		if !ok {
			return nil, 0 // null, a number
		}
		j := bytes.IndexByte(rest, '"')
		if j < 0 {
			return nil, 0
		}
		end := len(raw) - len(rest) + j
		return rest[:j], end
	}
}
