package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/spf13/pflag"

	"github.com/beatd/beatd/sources"
)

// sourceFlags are beatd run's flags about where entries come from besides
// schedules.yaml.
type sourceFlags struct {
	Priority      string
	ReadTokenFile string
	DCB           []string // --source django-celery-beat=URL, repeatable
	WriteBack     bool
	PollInterval  time.Duration

	readToken string
	priority  []string
	dcb       *sources.DCBSource
	dcbSynced bool
	dcbMarker string
}

// sourceList is a repeatable --source NAME=URL flag.
type sourceList struct{ dst *[]string }

func (l sourceList) String() string {
	if l.dst == nil {
		return ""
	}
	return strings.Join(*l.dst, ",")
}

// Type names the value in help (and makes it a pflag.Value too).
func (l sourceList) Type() string { return "NAME=URL" }

func (l sourceList) Set(v string) error {
	kind, url, ok := strings.Cut(v, "=")
	if !ok || kind != sources.DCB || url == "" {
		return fmt.Errorf("want %s=postgres://... or %s=sqlite:///path", sources.DCB, sources.DCB)
	}
	*l.dst = append(*l.dst, url)
	return nil
}

func (f *sourceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Priority, "sources-priority", strings.Join(sources.DefaultPriority, ","),
		"which source wins a name claimed by several (conflicts are reported)")
	fs.StringVar(&f.ReadTokenFile, "read-token-file", "", "file holding the bearer token that reading /api/v1/entries needs (else BEATD_READ_TOKEN; none: open)")
	fs.Var(sourceList{&f.DCB}, "source", "an extra, read-only source of entries: django-celery-beat=postgres://... or django-celery-beat=sqlite:///path")
	fs.BoolVar(&f.WriteBack, "source-write-back", false, "the leader writes last_run_at and total_run_count back to django-celery-beat (from the run history, so --run-history > 0) and disables one-off tasks after their run")
	fs.DurationVar(&f.PollInterval, "source-poll-interval", 5*time.Second, "how often django-celery-beat's change marker is polled")
}

// startSources builds the merger over the file's config and the runtime
// entries read once from etcd, and returns the merged config to start
// the scheduler with.
func (m *Main) startSources(ctx context.Context, file *config.Config) (*config.Config, error) {
	var err error
	if m.Sources.priority, err = sources.ParsePriority(m.Sources.Priority); err != nil {
		return nil, fmt.Errorf("--sources-priority: %w", err)
	}
	if m.Sources.readToken, err = etcdflags.Secret(m.Sources.ReadTokenFile, "BEATD_READ_TOKEN"); err != nil {
		return nil, err
	}
	m.merger = sources.New(sources.Config{
		Now: m.clock.Now,
		Apply: func(c *config.Config) error {
			if m.sched == nil {
				return nil // the first merge starts the scheduler
			}
			m.tune(len(c.Entries))
			if m.shards != nil {
				// The shards' schedulers hold the config in parts; the
				// replica's, which never runs, keeps its first one.
				return m.shards.Reload(c)
			}
			return m.sched.Reload(c)
		},
		ApplyDelta: func(c *config.Config, changed []string) error {
			if m.sched == nil {
				return nil
			}
			m.tune(len(c.Entries))
			if m.shards != nil {
				return m.shards.ReloadDelta(c, changed)
			}
			return m.sched.ReloadDelta(c, changed)
		},
		Validate: scheduler.ValidateEntry, Priority: m.Sources.priority, Logger: m.log,
		ShardOf: m.shardOf(),
		// A shard's load, beside the replica's terms (shardSet.background).
		Background: func(fn func()) {
			if m.shards == nil {
				fn()
				return
			}
			m.shards.background(fn)
		},
	})
	if err := m.merger.SetFile(file); err != nil {
		return nil, err
	}
	m.entries = sources.NewShardedEntries(m.etcd, m.Etcd.KeyPrefix(), m.Shards)
	m.entries.Clock = m.clock
	if m.Shards > 1 {
		// Each shard's runtime entries are read when this replica's term
		// of the shard starts (shardDefs), not here.
		if err := m.startDCB(ctx); err != nil {
			return nil, err
		}
		return m.merger.Current(), nil
	}
	// Runtime entries are in the first config, so a fresh leader does not
	// start without them; the watch takes over from there.
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if m.entriesRev, err = m.entries.Load(lctx, m.merger); err != nil {
		return nil, fmt.Errorf("read runtime entries: %w", err)
	}
	if err := m.startDCB(ctx); err != nil {
		return nil, err
	}
	return m.merger.Current(), nil
}

// syncSources starts the goroutines that follow each source; m.wg owns
// them and ctx stops them.
func (m *Main) syncSources(ctx context.Context) {
	if m.Shards <= 1 {
		m.wg.Go(func() { m.entries.Sync(ctx, m.merger, m.entriesRev) })
	}
	if src := m.Sources.dcb; src != nil {
		m.wg.Go(func() {
			var wb sync.WaitGroup
			if m.Sources.WriteBack {
				w := &sources.WriteBack{Source: src, History: m.pub, Merger: m.merger, Logger: m.log,
					Leading: func() bool { return m.leader.Token() != 0 }}
				if m.shards != nil {
					// Each shard's leader writes back its own entries:
					// the merger holds those of the shards it leads.
					w.Leading = func() bool { return m.shards.held() > 0 }
					w.Owns = func(name string) bool { return m.shards.leads(keys.ShardOf(name, m.Shards)) }
				}
				wb.Go(func() { w.Run(ctx) })
			}
			src.Sync(ctx, m.merger, m.Sources.dcbSynced, m.Sources.dcbMarker)
			wb.Wait()
			_ = src.Close()
		})
	}
}

// shardOf is the merger's Config.ShardOf: a name's shard on a sharded
// replica, nil on an unsharded one, whose merger holds every entry.
func (m *Main) shardOf() func(string) int {
	if m.Shards <= 1 {
		return nil
	}
	n := m.Shards
	return func(name string) int { return keys.ShardOf(name, n) }
}

// configuredEntries is how many entries the sources define, for the
// catalog's header: on a sharded replica, whose merged config holds the
// entries of the shards it leads alone, the count of every source's
// (the runtime entries it holds, the file's and dcb's whole), each name
// once.
func (m *Main) configuredEntries(cfg *config.Config) int {
	if m.Shards <= 1 {
		return len(cfg.Entries)
	}
	n := 0
	for _, h := range m.merger.Health() {
		n += h.Entries
	}
	for _, c := range m.merger.Conflicts() {
		n -= len(c.Sources) - 1 // a name several sources claim runs once
	}
	return n
}

// dedupFor is the broker's dedup horizon: at least the longest catch-up
// window of an entry. A sharded replica holds its led shards' entries
// alone, so it reads the windows of the whole file too (file; nil when
// unsharded), and for dcb's entries, which set none, the file's default
// (withDCB).
func dedupFor(cfg, file *config.Config, withDCB bool) time.Duration {
	dedup := redisbroker.DefaultDedupTTL
	for _, c := range []*config.Config{cfg, file} {
		if c == nil {
			continue
		}
		for _, e := range c.Entries {
			dedup = max(dedup, e.CatchupWindow)
		}
	}
	if withDCB && file != nil {
		if e, err := file.ParseEntry("dcb-default", []byte(`{"task": "t", "every": "1h"}`)); err == nil {
			dedup = max(dedup, e.CatchupWindow)
		}
	}
	return dedup
}

// startDCB opens the django-celery-beat source and reads it once, so its
// entries are in the first config. A database that does not answer does
// not stop beatd: the failure is reported and the source retried.
func (m *Main) startDCB(ctx context.Context) error {
	switch len(m.Sources.DCB) {
	case 0:
		return nil
	case 1:
	default:
		return fmt.Errorf("--source %s= given %d times; one database is supported", sources.DCB, len(m.Sources.DCB))
	}
	if m.Sources.WriteBack && m.RunHistory == 0 {
		return errors.New("--source-write-back needs the run history: --run-history must be above 0")
	}
	src, err := sources.OpenDCB(m.Sources.DCB[0], m.Sources.PollInterval, m.Sources.WriteBack)
	if err != nil {
		return err
	}
	src.Clock = m.clock
	m.Sources.dcb = src
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	marker, err := src.Poll(pctx, m.merger, nil)
	if err != nil {
		m.merger.SetError(sources.DCB, fmt.Errorf("%s: %w", src, err))
		return nil
	}
	m.Sources.dcbSynced, m.Sources.dcbMarker = true, marker
	m.log.Info("django-celery-beat source read", "url", src.String(), "poll_interval", m.Sources.PollInterval.String())
	return nil
}

// entriesAPI is the backend of /api/v1/entries.
func (m *Main) entriesAPI() *entriesAPI {
	a := &entriesAPI{cli: m.etcd, prefix: m.Etcd.KeyPrefix(), merger: m.merger, entries: m.entries, hist: m.runHistory(), now: m.clock.Now, shards: m.Shards}
	if m.Shards > 1 {
		a.holds = m.merger.Holds
		a.remoteDefs = m.remoteDefs
	}
	return a
}
