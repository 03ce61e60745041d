package console

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/status"

	"github.com/beatd/beatd/election"
	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures the console.
type Config struct {
	Client *clientv3.Client
	Prefix string // the cluster's etcd prefix
	ID     string // this replica
	// Entries returns the running config.
	Entries func() *config.Config
	// Entry, when set, is the definition of the entry named wherever it
	// runs (nil: none): on a sharded replica, a runtime entry of a shard
	// another replica leads, which Entries lacks. An entry's page uses
	// it; the entries table lists Entries, and on a sharded cluster asks
	// each other shard leader for its part (rows.go).
	Entry func(ctx context.Context, name string) (*config.Entry, error)
	// Runs is the run history the publisher keeps with the broker; nil
	// shows none. Call Server.Changed when it changes, so live pages
	// update at once (they also re-check every second).
	Runs outcome.History
	// Broker is the broker URL, already redacted, and PingBroker checks
	// that it answers.
	Broker     string
	PingBroker func(ctx context.Context) error
	// Term returns this replica's fencing token while it leads, else 0.
	Term func() int64
	// Timeline is this replica's fire timeline (filled while it leads).
	Timeline *Timeline
	// LedShards returns, on a sharded replica, the shards it leads now,
	// each with its term and timeline; nil on an unsharded one. The
	// console of any replica gathers every shard's numbers from the
	// shards' leaders.
	LedShards func() []LedShard
	// Tokens decide who may read the console (auth.Tokens.Check, as for
	// the entries API) and sign a browser in; nil leaves reads open.
	Tokens *auth.Tokens
	// AdminEnabled says whether this replica has an admin token: without
	// one the action buttons explain that they cannot work here.
	AdminEnabled bool
	Logger       *slog.Logger
	// Clock is the daemon's clock: the page's time, the caches' ages,
	// the live streams' pacing and the mirror's retries read it (default
	// the real clock).
	Clock clockwork.Clock
	// PageSize is the entries table's page size (default 50).
	PageSize int
	// HTTPClient reads the leader's data from its HTTP server (with the
	// CA of the replicas' HTTPS); default a plain client. Its timeout is
	// set to a second.
	HTTPClient *http.Client
}

// Server is the console. Run mirrors etcd for it; Handler serves it.
type Server struct {
	cfg     Config
	log     *slog.Logger
	tmpl    *template.Template
	assets  map[string]asset // by file name
	cluster *cluster
	runs    outcome.History // nil: no run history
	index   entryIndex
	http    *http.Client
	ctx     context.Context // ends the live streams on shutdown
	setCtx  sync.Once
	ctxSet  chan struct{}

	leaderMu    sync.Mutex
	leaderCache map[string]answer[*leaderData]
	shardCache  map[string]answer[[]shardData]
	rowsCache   map[string]answer[rowsAnswer]
	// backlogs are the persist backlogs counted lately, by term (a
	// token is unique across the shards' elections too).
	backlogs map[int64]backlogCount

	brokerMu   sync.Mutex
	brokerAt   time.Time
	brokerErr  error
	brokerTook time.Duration
}

const leaderCacheFor = 500 * time.Millisecond

// answer is another replica's recent answer, kept for leaderCacheFor.
type answer[T any] struct {
	at   time.Time
	data T
	err  error
}

// askCached is ask's answer, shared by every viewer asking the same
// (key) within leaderCacheFor: a live page renders again each second.
// cache is guarded by s.leaderMu, and kept to 256 answers.
func askCached[T any](s *Server, cache *map[string]answer[T], key string, ask func() (T, error)) (T, error) {
	s.leaderMu.Lock()
	if c, ok := (*cache)[key]; ok && s.cfg.Clock.Since(c.at) < leaderCacheFor {
		s.leaderMu.Unlock()
		return c.data, c.err
	}
	s.leaderMu.Unlock()
	data, err := ask()
	s.leaderMu.Lock()
	if *cache == nil || len(*cache) > 256 {
		*cache = map[string]answer[T]{}
	}
	(*cache)[key] = answer[T]{at: s.cfg.Clock.Now(), data: data, err: err}
	s.leaderMu.Unlock()
	return data, err
}

// backlogCount is a term's persist backlog, counted at at.
type backlogCount struct {
	at time.Time
	n  int
	ok bool
}

type asset struct {
	body  []byte
	ctype string
	hash  string
}

// New returns a console; it does not contact etcd until a page is viewed.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil || cfg.Prefix == "" || cfg.Entries == nil {
		return nil, errors.New("console: Client, Prefix and Entries are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Term == nil {
		cfg.Term = func() int64 { return 0 }
	}
	if cfg.Timeline == nil {
		cfg.Timeline = NewTimeline(cfg.Clock.Now)
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "console"), assets: map[string]asset{},
		cluster: newCluster(cfg.Client, cfg.Prefix, cfg.Clock), http: leaderClient(cfg.HTTPClient),
		ctx: context.Background(), ctxSet: make(chan struct{})}
	s.runs = cfg.Runs
	err := fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := staticFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ctype := "application/octet-stream"
		switch path.Ext(p) {
		case ".js":
			ctype = "text/javascript; charset=utf-8"
		case ".css":
			ctype = "text/css; charset=utf-8"
		case ".svg":
			ctype = "image/svg+xml"
		}
		s.assets[path.Base(p)] = asset{body: b, ctype: ctype, hash: hex.EncodeToString(sum[:8])}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	s.tmpl, err = template.New("").Funcs(template.FuncMap{
		"asset":      s.assetURL,
		"entryURL":   entryURL,
		"add":        func(a, b int) int { return a + b },
		"ms":         func(t time.Time) int64 { return t.UnixMilli() },
		"thousands":  thousands,
		"pathEscape": url.PathEscape,
		"rfc":        func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
		"utc":        func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"lag":        fmtLag,
	}).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	return s, nil
}

// Run mirrors the cluster's etcd state for the pages, from the first page
// view until ctx ends. Live streams end with ctx too.
func (s *Server) Run(ctx context.Context) {
	s.setCtx.Do(func() { s.ctx = ctx; close(s.ctxSet) })
	s.cluster.run(ctx)
}

// Changed tells the live pages that something they show may have changed
// outside etcd (a fire on this leader, run history kept elsewhere). It is
// cheap and may be called at any rate: pages update once per 100 ms.
func (s *Server) Changed() { s.cluster.nudge() }

func (s *Server) liveCtx() context.Context {
	select {
	case <-s.ctxSet:
		return s.ctx
	default:
		return context.Background()
	}
}

// assetURL names an embedded file with its content hash, so it can be
// cached for good.
func (s *Server) assetURL(name string) string {
	return "/console/static/" + name + "?v=" + s.assets[name].hash
}

func entryURL(name string) string { return "/entry/" + url.PathEscape(name) }

// Handler serves the console at / and passes every other request to next.
// Every response, the console's and next's, carries the default security
// headers, and state-changing requests from another origin are refused.
func (s *Server) Handler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.page(s.serveOverview))
	mux.HandleFunc("GET /entry/{name}", s.page(s.serveEntry))
	mux.HandleFunc("GET /console/events", s.data(s.serveEvents))
	mux.HandleFunc("GET /console/leader.json", s.data(s.serveLeaderData))
	mux.HandleFunc("GET /console/rows.json", s.data(s.serveRows))
	mux.HandleFunc("GET /console/login", s.serveLoginForm)
	mux.HandleFunc("POST /console/login", s.login)
	mux.HandleFunc("POST /console/logout", s.logout)
	mux.HandleFunc("GET /console/static/{file}", s.serveAsset) // no data: open
	mux.Handle("/", next)
	return Secure(mux)
}

func (s *Server) serveAsset(w http.ResponseWriter, r *http.Request) {
	a, ok := s.assets[r.PathValue("file")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", a.ctype)
	if r.URL.Query().Get("v") == a.hash {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	w.Header().Set("ETag", `"`+a.hash+`"`)
	if r.Header.Get("If-None-Match") == `"`+a.hash+`"` {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	_, _ = w.Write(a.body)
}

// render executes a template into memory first, so an error never leaves
// half a page.
func (s *Server) render(name string, data any) (string, error) {
	var b strings.Builder
	if err := s.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("console: render %s: %w", name, err)
	}
	return b.String(), nil
}

func (s *Server) writePage(w http.ResponseWriter, code int, p *page) {
	html, err := s.render("page", p)
	if err != nil {
		s.log.Error("render page", "err", err)
		http.Error(w, "console: internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(html))
}

func (s *Server) serveOverview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	q := overviewQuery(r.URL.Query())
	p := s.overview(ctx, q, false)
	p.SignedIn = signedIn(r)
	s.writePage(w, http.StatusOK, p)
}

func (s *Server) serveEntry(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	p := s.entryPage(ctx, r.PathValue("name"), false)
	p.SignedIn = signedIn(r)
	code := http.StatusOK
	if p.Entry == nil {
		code = http.StatusNotFound
	}
	s.writePage(w, code, p)
}

// serveLeaderData answers a standby's console with this leader's timeline,
// the named entries' fire stats and the persist backlog. term must be this
// replica's current term, so a standby never shows a deposed leader's
// numbers as current.
func (s *Server) serveLeaderData(w http.ResponseWriter, r *http.Request) {
	if sh := r.URL.Query()["shard"]; len(sh) > 0 {
		want, err := status.ParseShardTerms(sh)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(shardsAnswer{Shards: s.localShardData(ctx, want, r.URL.Query()["name"])})
		return
	}
	term := s.cfg.Term()
	if want := r.URL.Query().Get("term"); term == 0 || want != fmt.Sprint(term) {
		http.Error(w, "not the leader of that term", http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	d := s.localLeaderData(ctx, term, r.URL.Query()["name"])
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(d)
}

// leaderData is what only the leader knows.
type leaderData struct {
	Timeline  Snapshot `json:"timeline"`
	Backlog   int      `json:"backlog"`
	BacklogOK bool     `json:"backlog_ok"`
	// Shards are, on a sharded cluster, the shards whose leaders' numbers
	// are summed here (not sent between replicas).
	Shards []int `json:"-"`
}

func (s *Server) localLeaderData(ctx context.Context, term int64, names []string) leaderData {
	d := leaderData{Timeline: s.cfg.Timeline.Snapshot(names)}
	if s.cluster.ready(ctx) == nil {
		d.Backlog, d.BacklogOK = s.backlog(s.cfg.Timeline, term)
	}
	return d
}

// backlog counts the entries of tl's term published but not yet in
// etcd, at most twice a second a term: it walks every entry that fired,
// under the lock the scheduler's Observer takes.
func (s *Server) backlog(tl *Timeline, term int64) (int, bool) {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if c, ok := s.backlogs[term]; ok && s.cfg.Clock.Since(c.at) < leaderCacheFor {
		return c.n, c.ok
	}
	if s.backlogs == nil || len(s.backlogs) > 512 {
		s.backlogs = map[int64]backlogCount{}
	}
	n, ok := tl.Backlog(term, s.cluster.lastSlot)
	s.backlogs[term] = backlogCount{at: s.cfg.Clock.Now(), n: n, ok: ok}
	return n, ok
}

// fetchLeaderData gets the leader's data: locally when this replica leads,
// else from the leader's console at its registered address. On a sharded
// cluster (shards) it is every shard leader's, summed (fetchShardsData):
// then both can be set, the error naming the shards left out.
func (s *Server) fetchLeaderData(ctx context.Context, leader election.Leader, shards []status.ShardStatus, replicas []election.Replica, names []string) (*leaderData, error) {
	if len(shards) > 0 {
		d, counted, err := s.fetchShardsData(ctx, shards, replicas, names)
		if d != nil {
			d.Shards = counted
		}
		return d, err
	}
	if leader.Token == 0 {
		return nil, errors.New("no leader")
	}
	if term := s.cfg.Term(); term != 0 && term == leader.Token {
		d := s.localLeaderData(ctx, term, names)
		return &d, nil
	}
	key := fmt.Sprint(leader.Token, "\x00", strings.Join(names, "\x00"))
	return askCached(s, &s.leaderCache, key, func() (*leaderData, error) {
		return s.askLeader(ctx, leader, replicas, names)
	})
}

// askLeader gets the leader's data from its console, at the address it
// registered.
func (s *Server) askLeader(ctx context.Context, leader election.Leader, replicas []election.Replica, names []string) (*leaderData, error) {
	var d leaderData
	q := url.Values{"term": {fmt.Sprint(leader.Token)}, "name": names}
	if err := s.leaderJSON(ctx, leader.ID, q, replicas, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// leaderJSON reads replica id's /console/leader.json?q into out
// (replicaJSON).
func (s *Server) leaderJSON(ctx context.Context, id string, q url.Values, replicas []election.Replica, out any) error {
	return s.replicaJSON(ctx, id, "/console/leader.json", q, replicas, out)
}

// replicaJSON reads replica id's console path?q into out, at the address
// it registered, within 700 ms.
func (s *Server) replicaJSON(ctx context.Context, id, path string, q url.Values, replicas []election.Replica, out any) error {
	addr, err := election.LeaderURL(election.Leader{ID: id}, replicas)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr+path+"?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("leader %s at %s: %w", id, addr, err)
	}
	auth.Forward(ctx, req) // the leader guards its data as this replica does
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("leader %s at %s does not answer: %w", id, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("leader %s at %s answered %s", id, addr, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("leader %s at %s: %w", id, addr, err)
	}
	return nil
}

// pingBroker checks the broker at most once a second for all viewers.
func (s *Server) pingBroker(ctx context.Context) (time.Duration, error) {
	if s.cfg.PingBroker == nil {
		return 0, errors.New("no broker check configured")
	}
	s.brokerMu.Lock()
	defer s.brokerMu.Unlock()
	if s.cfg.Clock.Since(s.brokerAt) < time.Second {
		return s.brokerTook, s.brokerErr
	}
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := s.cfg.Clock.Now()
	s.brokerErr = s.cfg.PingBroker(pctx)
	s.brokerTook, s.brokerAt = s.cfg.Clock.Since(start), s.cfg.Clock.Now()
	return s.brokerTook, s.brokerErr
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// recentRuns returns each named entry's run history, newest first as the
// broker keeps it, or nothing without a history.
func (s *Server) recentRuns(ctx context.Context, names []string) (map[string]outcome.EntryRuns, error) {
	if s.runs == nil {
		return nil, nil
	}
	return s.runs.Histories(ctx, names)
}

// leaderClient is c with a second's timeout (a new plain client if nil):
// a slow leader must not hold a page.
func leaderClient(c *http.Client) *http.Client {
	if c == nil {
		return &http.Client{Timeout: time.Second}
	}
	cc := *c
	cc.Timeout = time.Second
	return &cc
}
