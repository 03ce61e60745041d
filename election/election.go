package election

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/beatd/beatd/internal/keys"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultTTL is the lease TTL unless configured.
const DefaultTTL = 5 * time.Second

// ErrNoLeader means nobody holds the election right now.
var ErrNoLeader = errors.New("election: no leader")

// Config configures an Elector.
type Config struct {
	Client *clientv3.Client
	// Prefix is the cluster's key prefix, e.g. "/beatd/default/". The
	// election lives under Prefix + "leader/".
	Prefix string
	// ID names this replica; it is the leader key's value.
	ID string
	// TTL of the lease, in whole seconds (etcd's granularity).
	TTL time.Duration
	// SafetyMargin: leadership ends locally once no keepalive has
	// succeeded for TTL - SafetyMargin, before etcd can expire the lease.
	// Default: TTL/5, at least 500ms.
	SafetyMargin time.Duration
	Logger       *slog.Logger
	// Clock times the keepalives and the local step-down; the real
	// (monotonic) clock if nil.
	Clock clockwork.Clock
}

// Elector campaigns for leadership, again and again.
type Elector struct {
	cfg Config
	log *slog.Logger
}

// New returns an Elector. It does not contact etcd.
func New(cfg Config) (*Elector, error) {
	if cfg.Client == nil || cfg.ID == "" || cfg.Prefix == "" {
		return nil, errors.New("election: Client, ID and Prefix are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("election: TTL %s is below etcd's 1s granularity", cfg.TTL)
	}
	if cfg.SafetyMargin <= 0 {
		cfg.SafetyMargin = max(cfg.TTL/5, 500*time.Millisecond)
	}
	if cfg.SafetyMargin >= cfg.TTL {
		return nil, fmt.Errorf("election: safety margin %s must be below the TTL %s", cfg.SafetyMargin, cfg.TTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Elector{cfg: cfg, log: cfg.Logger.With("component", "election")}, nil
}

// TTL returns the lease TTL in use.
func (e *Elector) TTL() time.Duration { return e.cfg.TTL }

func (e *Elector) electionPrefix() string { return keys.Election(e.cfg.Prefix) }

// Leadership is one term as leader. Its Context is cancelled the moment
// the term ends, for whatever reason; Done closes after cleanup.
type Leadership struct {
	// Fence is the term's leader key and fencing token (its create
	// revision): cluster-wide monotonic, so every later leader's token is
	// larger.
	Fence
	// Elected is when the campaign was won, on the Elector's clock: the
	// instant a term's catch-up counts up to (leader.Term), logged with
	// "elected leader" as "at", so an audit of the log judges it by the
	// same instant and not by the line's own time, a moment later.
	Elected time.Time

	ctx     context.Context
	cancel  context.CancelCauseFunc
	session *concurrency.Session
	elect   *concurrency.Election
	done    chan struct{}
	once    sync.Once
}

// Context is cancelled when leadership ends; context.Cause says why.
func (l *Leadership) Context() context.Context { return l.ctx }

// Done is closed once the term has ended and its goroutines have stopped.
func (l *Leadership) Done() <-chan struct{} { return l.done }

// Reasons leadership ends, as context.Cause of Leadership.Context.
var (
	ErrResigned        = errors.New("election: resigned")
	ErrSessionLost     = errors.New("election: lease lost")
	ErrKeepaliveMissed = errors.New("election: no keepalive within TTL minus the safety margin")
)

// Resign ends the term and deletes the leader key so a standby leads at
// once rather than after the TTL. Safe to call more than once.
func (l *Leadership) Resign(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		l.cancel(ErrResigned)
		if rerr := l.elect.Resign(ctx); rerr != nil {
			err = fmt.Errorf("election: resign: %w", rerr)
		}
		// Revoking the lease also removes any waiting keys of this session.
		if _, rerr := l.session.Client().Revoke(ctx, l.session.Lease()); rerr != nil && err == nil {
			err = fmt.Errorf("election: revoke lease: %w", rerr)
		}
		releaseSession(l.session)
	})
	<-l.done
	return err
}

// Campaign blocks until this replica leads, or ctx ends. ctx bounds only
// the campaign: a won term lasts until it is lost or resigned, so a
// graceful shutdown can persist its last writes as leader, then Resign.
// The caller must Resign every term it wins. Each call uses a fresh lease,
// so a replica that lost leadership campaigns again without a restart.
func (e *Elector) Campaign(ctx context.Context) (*Leadership, error) {
	ttlSecs := int64(e.cfg.TTL / time.Second)
	grant, err := e.cfg.Client.Grant(ctx, ttlSecs)
	if err != nil {
		return nil, fmt.Errorf("election: grant lease: %w", err)
	}
	sess, err := concurrency.NewSession(e.cfg.Client, concurrency.WithLease(grant.ID))
	if err != nil {
		_, _ = e.cfg.Client.Revoke(context.WithoutCancel(ctx), grant.ID)
		return nil, fmt.Errorf("election: session: %w", err)
	}
	// The lease's keepalives are tracked from the moment it is granted, so
	// a campaign that outlives its lease cannot win with a dead lease.
	ka := newKeepalive(leaseRenewer(e.cfg.Client, grant.ID), e.cfg.Clock, e.cfg.TTL, e.cfg.SafetyMargin, e.cfg.Clock.Now())
	kaCtx, kaStop := context.WithCancel(context.WithoutCancel(ctx))
	go ka.run(kaCtx)

	el := concurrency.NewElection(sess, e.electionPrefix())
	campCtx, campCancel := context.WithCancel(ctx)
	go func() {
		// A lost session or a missed keepalive abandons the campaign.
		select {
		case <-sess.Done():
		case <-ka.expired():
		case <-campCtx.Done():
		}
		campCancel()
	}()
	err = el.Campaign(campCtx, e.cfg.ID)
	campCancel()
	if err == nil && ka.isExpired() {
		err = ErrKeepaliveMissed
	}
	if err != nil {
		kaStop()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), min(e.cfg.TTL, 2*time.Second))
		_, _ = e.cfg.Client.Revoke(rctx, grant.ID)
		rcancel()
		releaseSession(sess)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("election: campaign: %w", err)
	}

	lctx, cancel := context.WithCancelCause(context.Background())
	l := &Leadership{
		Fence: Fence{Token: el.Rev(), Key: el.Key()}, Elected: e.cfg.Clock.Now(),
		ctx: lctx, cancel: cancel, session: sess, elect: el, done: make(chan struct{}),
	}
	e.log.Info("elected leader", "candidate", e.cfg.ID, "token", l.Token, "lease", fmt.Sprintf("%x", grant.ID),
		"at", l.Elected.UTC().Format(time.RFC3339Nano))
	go func() {
		defer close(l.done)
		defer kaStop()
		select {
		case <-sess.Done():
			cancel(ErrSessionLost)
		case <-ka.expired():
			cancel(ErrKeepaliveMissed)
		case <-lctx.Done():
		}
		e.log.Warn("leadership ended", "candidate", e.cfg.ID, "token", l.Token, "reason", context.Cause(lctx))
		// Give the lease back if etcd is reachable; harmless if it is not.
		// Bounded, so Done follows promptly even when etcd is unreachable;
		// the context above was cancelled first, so nothing waits on this.
		if context.Cause(lctx) != ErrResigned {
			rctx, rcancel := context.WithTimeout(context.Background(), min(e.cfg.TTL, 2*time.Second))
			_, _ = e.cfg.Client.Revoke(rctx, grant.ID)
			rcancel()
			releaseSession(sess)
		}
	}()
	return l, nil
}

// Leader is who leads, as any replica or CLI can observe it.
type Leader struct {
	ID    string
	Token int64
}

// Observe returns the current leader, or ErrNoLeader.
func Observe(ctx context.Context, cli *clientv3.Client, prefix string) (Leader, error) {
	resp, err := cli.Get(ctx, keys.Leaders(prefix), clientv3.WithFirstCreate()...)
	if err != nil {
		return Leader{}, fmt.Errorf("election: observe: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Leader{}, ErrNoLeader
	}
	kv := resp.Kvs[0]
	return Leader{ID: string(kv.Value), Token: kv.CreateRevision}, nil
}

// CurrentFence returns the current term's Fence (its leader key and
// token), or ErrNoLeader: a broker that guards its own etcd writes with
// the term it was handed a token for (SQS) takes it here.
func CurrentFence(ctx context.Context, cli *clientv3.Client, prefix string) (Fence, error) {
	resp, err := cli.Get(ctx, keys.Leaders(prefix), clientv3.WithFirstCreate()...)
	if err != nil {
		return Fence{}, fmt.Errorf("election: observe: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Fence{}, ErrNoLeader
	}
	return Fence{Key: string(resp.Kvs[0].Key), Token: resp.Kvs[0].CreateRevision}, nil
}

// Observe returns the current leader of e's cluster.
func (e *Elector) Observe(ctx context.Context) (Leader, error) {
	return Observe(ctx, e.cfg.Client, e.cfg.Prefix)
}

// releaseSession stops a session's keepalive. Orphan waits for the etcd
// client's lessor, which can take long while the client redials a dead
// endpoint, so it runs in the background; the client owns that goroutine
// and its Close ends it.
func releaseSession(s *concurrency.Session) {
	go s.Orphan()
}
