package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/beatd/beatd/store"
)

// persister writes entry state behind the loop, so etcd latency never
// delays a publish. It coalesces snapshots per entry. Losing a write it had
// not made yet is safe: the next leader re-publishes those slots and the
// dedup keys make that a no-op. Items are handled in order, so a request's
// completion never races an older snapshot of the same entry.
type persister struct {
	store StateStore
	guard store.Guard
	log   *slog.Logger
	m     *Metrics

	in   chan persistItem
	errc chan struct{} // closed when the term's writes are refused

	mu       sync.Mutex
	err      error
	inFlight map[string]bool // admin requests queued but not yet completed (loop-owned)
}

type persistItem struct {
	states   []*store.EntryState
	req      *store.Request
	reqState *store.EntryState
	flush    chan error
}

// minWriteInterval spaces state writes. State may lag publishes by this
// much; a crash in between only means the next leader re-publishes slots
// that dedup.
const minWriteInterval = 50 * time.Millisecond

// writeAttemptTimeout bounds one guarded write before it is retried.
const writeAttemptTimeout = time.Second

func newPersister(s StateStore, g store.Guard, log *slog.Logger, m *Metrics) *persister {
	return &persister{store: s, guard: g, log: log, m: m, in: make(chan persistItem, 256),
		errc: make(chan struct{}), inFlight: map[string]bool{}}
}

func (p *persister) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *persister) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
		close(p.errc)
	}
}

func (p *persister) send(it persistItem) {
	select {
	case p.in <- it:
	case <-p.errc:
		if it.flush != nil {
			it.flush <- p.failed()
		}
	}
}

// save queues state snapshots.
func (p *persister) save(states []*store.EntryState) { p.send(persistItem{states: states}) }

// complete queues an admin request's completion with the entry's state.
func (p *persister) complete(r store.Request, st *store.EntryState) {
	p.inFlight[r.ID] = true
	p.send(persistItem{req: &r, reqState: st})
}

func (p *persister) markSeen(id string)  { p.inFlight[id] = true }
func (p *persister) seen(id string) bool { return p.inFlight[id] }

// flush waits until everything queued so far is written.
func (p *persister) flush(ctx context.Context) error {
	done := make(chan error, 1)
	p.send(persistItem{flush: done})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("scheduler: flush state: %w", ctx.Err())
	}
}

func (p *persister) run(ctx context.Context) {
	pending := map[string]*store.EntryState{}
	var order []string
	write := func() bool {
		if len(pending) == 0 {
			return true
		}
		batch := make([]*store.EntryState, 0, len(order))
		for _, n := range order {
			batch = append(batch, pending[n])
		}
		backoff := 50 * time.Millisecond
		for {
			// A request stuck on a dead etcd member must not hold up the
			// writes (or a shutdown) until etcd's own timeout: retry soon.
			actx, cancel := context.WithTimeout(ctx, writeAttemptTimeout)
			err := p.store.Save(actx, p.guard, batch)
			cancel()
			if err == nil {
				clear(pending)
				order = order[:0]
				return true
			}
			if errors.Is(err, store.ErrNotLeader) {
				p.fail(fmt.Errorf("%w: %v", ErrTermEnded, err))
				return false
			}
			p.m.EtcdErrors.Inc()
			if ctx.Err() != nil {
				return false
			}
			p.log.Warn("persist state failed; retrying", "err", err, "entries", len(batch))
			select {
			case <-ctx.Done():
				return false
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
		}
	}
	handle := func(it persistItem) bool {
		for _, st := range it.states {
			if _, ok := pending[st.Name]; !ok {
				order = append(order, st.Name)
			}
			pending[st.Name] = st
		}
		if it.req != nil {
			if !write() {
				return false
			}
			err := p.store.CompleteRequest(ctx, p.guard, *it.req, it.reqState)
			if errors.Is(err, store.ErrNotLeader) {
				p.fail(fmt.Errorf("%w: %v", ErrTermEnded, err))
				return false
			}
			if err != nil {
				p.m.EtcdErrors.Inc()
				p.log.Warn("complete admin request", "op", it.req.Op, "entry", it.req.Entry, "err", err)
			}
		}
		if it.flush != nil {
			ok := write()
			it.flush <- p.failed()
			return ok
		}
		return true
	}
	var lastWrite time.Time
	for {
		var it persistItem
		select {
		case <-ctx.Done():
			return
		case it = <-p.in:
		}
		if !handle(it) {
			p.drainAfterFailure(ctx)
			return
		}
		// Coalesce for at least minWriteInterval since the last write, so a
		// burst of fires becomes one write per entry.
		wait := time.NewTimer(max(time.Until(lastWrite.Add(minWriteInterval)), 0))
	more:
		for {
			select {
			case it = <-p.in:
				if !handle(it) {
					wait.Stop()
					p.drainAfterFailure(ctx)
					return
				}
			case <-wait.C:
				break more
			case <-ctx.Done():
				wait.Stop()
				return
			}
		}
		lastWrite = time.Now()
		if !write() {
			p.drainAfterFailure(ctx)
			return
		}
	}
}

// drainAfterFailure answers flushes until the term's context ends, so no
// sender blocks.
func (p *persister) drainAfterFailure(ctx context.Context) {
	if p.failed() == nil {
		p.fail(fmt.Errorf("%w: persister stopped", ErrTermEnded))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-p.in:
			if it.flush != nil {
				it.flush <- p.failed()
			}
		}
	}
}
