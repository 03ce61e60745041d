// Package leader owns one replica's leadership lifecycle: campaign for the
// lease, lead for the term, step down and resign, campaign again, until
// the replica stops.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/scheduler"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Elector campaigns for leadership; Etcd adapts election's.
type Elector interface {
	// Campaign blocks until this replica leads, or ctx ends. ctx bounds
	// only the campaign, not the term it wins.
	Campaign(ctx context.Context) (Lease, error)
}

// Lease is one won term.
type Lease interface {
	// Fence is the term's leader key and fencing token.
	Fence() election.Fence
	// Context ends the moment the term is lost or resigned; its cause
	// says why.
	Context() context.Context
	// Resign ends the term so a standby leads at once.
	Resign(ctx context.Context) error
}

// Term is what the leader's work gets for one term.
type Term struct {
	scheduler.Term
	// Lease ends only when the lease is lost or resigned. Lead's ctx also
	// ends when the replica starts to stop; work that should run until the
	// scheduler has finished its last persist (and is stopped by Lead
	// itself) uses Lease instead.
	Lease context.Context
	// Resign ends the term at once, so a standby leads while this
	// replica's work is still winding down (the fence refuses whatever it
	// still sends). Lead's return resigns too; a second call is a no-op.
	Resign func(context.Context) error
}

// Config configures a Loop.
type Config struct {
	Elector Elector
	// Lead does the leader's work for one term and returns once ctx ends:
	// when the term is lost, or when Run's ctx ends. The term is resigned
	// only after Lead returns, so on shutdown Lead finishes (and persists)
	// while still leader.
	Lead func(ctx context.Context, t Term) error
	// Clock times the term's start and the backoff between failed
	// campaigns; the real clock if nil.
	Clock clockwork.Clock
	// Registerer gets the leadership metrics; none if nil.
	Registerer prometheus.Registerer
	// CampaignErrors counts failed campaigns. It is beatd_etcd_errors_total,
	// which other packages count into too, so the caller passes it in.
	CampaignErrors prometheus.Counter
	Logger         *slog.Logger
	// Hold, when set, is asked before each campaign how long this
	// replica must stay out of the election (a leader that handed over
	// for want of a broker waits before it may lead again); 0: campaign.
	Hold func() time.Duration
}

// Backoff between failed campaigns, and how long a resign may take.
const (
	campaignBackoffMin = 100 * time.Millisecond
	campaignBackoffMax = 5 * time.Second
	resignTimeout      = 2 * time.Second
)

// Loop runs the terms. Its accessors are safe from any goroutine.
type Loop struct {
	cfg     Config
	token   atomic.Int64 // the current term's token, 0 when not leading
	elected atomic.Int64 // when the current (else last) term began, Unix ns
	stopped atomic.Bool

	isLeader      prometheus.Gauge
	fencingToken  prometheus.Gauge
	leaderChanges prometheus.Counter
}

// New returns a Loop and registers its metrics; Run starts it.
func New(cfg Config) (*Loop, error) {
	if cfg.Elector == nil || cfg.Lead == nil {
		return nil, errors.New("leader: Elector and Lead are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CampaignErrors == nil {
		cfg.CampaignErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_etcd_errors_total"})
	}
	l := &Loop{cfg: cfg,
		isLeader:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_is_leader", Help: "1 while this replica leads."}),
		fencingToken:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_fencing_token", Help: "The fencing token of this replica's current or last term."}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_leader_changes_total", Help: "Terms this replica started or ended."}),
	}
	if reg := cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{l.isLeader, l.fencingToken, l.leaderChanges} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("leader: register metrics: %w", err)
			}
		}
	}
	return l, nil
}

// Token is the current term's fencing token, 0 when not leading.
func (l *Loop) Token() int64 { return l.token.Load() }

// Term is the current term's token (0 when not leading) and when the
// current, else the last, term began.
func (l *Loop) Term() (token int64, elected time.Time) {
	return l.token.Load(), time.Unix(0, l.elected.Load())
}

// Stopped reports whether Run has returned: a replica whose loop stopped
// will never lead again.
func (l *Loop) Stopped() bool { return l.stopped.Load() }

// Run campaigns, leads each term won and campaigns again when it ends,
// until ctx ends. A term in progress then finishes (Lead returns) and is
// resigned before Run returns.
func (l *Loop) Run(ctx context.Context) {
	defer l.stopped.Store(true)
	b := retry.Backoff(campaignBackoffMin, campaignBackoffMax)
	stale := retry.Backoff(time.Second, time.Minute)
	for ctx.Err() == nil {
		if l.cfg.Hold != nil {
			if d := l.cfg.Hold(); d > 0 {
				l.cfg.Logger.Info("staying out of the election", "for", d.String())
				if !l.sleep(ctx, d) {
					return
				}
				continue
			}
		}
		lease, err := l.cfg.Elector.Campaign(ctx)
		elected := l.cfg.Clock.Now()
		if e, ok := lease.(interface{ ElectedAt() time.Time }); ok && err == nil {
			elected = e.ElectedAt() // the instant the election logged
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.cfg.CampaignErrors.Inc()
			wait := b.NextBackOff()
			l.cfg.Logger.Warn("campaign failed; retrying", "err", err, "backoff", wait.String())
			if !l.sleep(ctx, wait) {
				return
			}
			continue
		}
		b.Reset()
		if err := l.lead(ctx, lease, elected); errors.Is(err, broker.ErrStale) {
			// The broker holds a fence above any token this etcd gave:
			// another cluster shares the broker and prefix, or etcd was
			// replaced or restored. Every new term would end the same
			// way at once; campaigning without a pause made ~50 terms a
			// second. Back off, and say what to do.
			wait := stale.NextBackOff()
			l.cfg.Logger.Error("the broker refused this term's fencing token as stale; campaigning again after a pause",
				"err", err, "backoff", wait.String(),
				"hint", "another beatd cluster uses this broker with the same --prefix, or etcd was replaced or restored from an older snapshot; give each cluster its own --prefix, or, once no other leader runs, clear the broker's fence (docs/operations.md)")
			if !l.sleep(ctx, wait) {
				return
			}
			continue
		}
		stale.Reset()
	}
}

// lead runs one term, from winning it to resigning it, and returns why
// the term's loop ended.
func (l *Loop) lead(ctx context.Context, lease Lease, elected time.Time) error {
	fence := lease.Fence()
	token := fence.Token
	// elected before token: a reader that sees the token sees its start.
	l.elected.Store(elected.UnixNano())
	l.token.Store(token)
	l.isLeader.Set(1)
	l.fencingToken.Set(float64(token))
	l.leaderChanges.Inc()

	termCtx, cancel := context.WithCancel(lease.Context())
	stop := context.AfterFunc(ctx, cancel)
	err := l.cfg.Lead(termCtx, Term{Term: scheduler.Term{Fence: fence, Elected: elected}, Lease: lease.Context(), Resign: lease.Resign})
	stop()
	cancel()

	l.token.Store(0)
	l.isLeader.Set(0)
	l.leaderChanges.Inc()
	// Resign even when the lease is already lost: it releases the session.
	rctx, rcancel := context.WithTimeout(context.Background(), resignTimeout)
	rerr := lease.Resign(rctx)
	rcancel()
	l.cfg.Logger.Info("term over", "token", token, "reason", context.Cause(lease.Context()), "loop", err, "resign", rerr)
	return err
}

// sleep waits d on the clock; false if ctx ended first.
func (l *Loop) sleep(ctx context.Context, d time.Duration) bool {
	t := l.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}

// Etcd adapts an election.Elector to the loop.
func Etcd(e *election.Elector) Elector { return etcdElector{e} }

type etcdElector struct{ e *election.Elector }

func (e etcdElector) Campaign(ctx context.Context) (Lease, error) {
	l, err := e.e.Campaign(ctx)
	if err != nil {
		return nil, err
	}
	return etcdLease{l}, nil
}

type etcdLease struct{ *election.Leadership }

func (l etcdLease) ElectedAt() time.Time { return l.Leadership.Elected }

func (l etcdLease) Fence() election.Fence { return l.Leadership.Fence }
