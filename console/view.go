package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/upcoming"
)

// page is what the templates render. Live pages (sections sent over SSE)
// leave relative times empty: the browser fills them from data-at, so a
// section only changes when its data does.
type page struct {
	Title        string
	View         string // "overview" or "entry"
	Events       string // the live stream's URL
	AdminEnabled bool
	SignedIn     bool // the viewer signed in with the form: offer to sign out
	Live         bool
	Now          time.Time
	Cluster      clusterView
	Timeline     *timelineView
	Entries      *entriesView
	Entry        *entryView
	Missing      string // an entry asked for that does not exist
}

// Rel says how far t is from the page's now: "in 4 s", "3 min ago".
func (p *page) Rel(t time.Time) string {
	if p.Live || t.IsZero() {
		return ""
	}
	return relative(t.Sub(p.Now))
}

func relative(d time.Duration) string {
	future := d >= 0
	if !future {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%d s", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%d min", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		s = fmt.Sprintf("%d d", int(d/(24*time.Hour)))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

type clusterView struct {
	Prefix, Self string
	Leader       string
	Token        int64
	LeaderSince  time.Time
	SinceExact   bool // from the leader's own registration, not first seen here
	LeaderErr    string
	Replicas     []replicaView
	Broker       string
	BrokerErr    string
	BrokerRTT    string
	Backlog      string
	LeaderData   string // why the leader's data is missing, if it is
	// Shards is who leads each shard of a sharded cluster, with its
	// token (empty for one shard, whose leader is Leader).
	Shards []status.ShardStatus
	// Failures are the runs that failed on a worker or were lost in the
	// last hour (newest first, the first 20), FailureCount all of them.
	Failures     []failure
	FailureCount int
}

type replicaView struct {
	ID, HTTP, Health, Version string
	Healthy, Leader, Self     bool
	// LeadsShards are the shards it leads, on a sharded cluster.
	LeadsShards      []int
	Stale            bool
	Started, Updated time.Time
}

type timelineView struct {
	Since    time.Time
	Term     int64
	Bars     []bar
	LagLine  string // SVG polyline points
	LagPts   []point
	MaxFires int
	MaxLag   string
	Total    int
	Errors   int
	Rows     []Minute
	// Shards are, on a sharded cluster, the shards whose leaders' fires
	// are summed here ("0, 1, 3").
	Shards string
}

type point struct{ X, Y float64 }

type bar struct {
	X, Y, H  float64
	Label    string
	HasError bool
}

type entriesView struct {
	Q, In         string
	Page, Pages   int
	Total         int // entries configured
	Matched       int
	From, To      int
	Rows          []rowView
	Prev, Next    string
	SinceLeader   time.Time
	LeaderKnown   bool
	CountsPending bool
	// Missing says whose entries the table lacks, on a sharded cluster
	// (a shard without a leader, a leader that did not answer).
	Missing string
}

type rowView struct {
	// Entry is the entry's status from the one builder (status.Of), the
	// leader's fires overlaid: name, source, task, schedule, paused, the
	// newest fire and every other field the row shows of the entry, as
	// /status says them. The rest is the row's own rendering of them and
	// of the definition (queue, zone).
	status.Entry
	Queue, Zone      string
	Next             time.Time
	NextAbs, LastAbs string
	FiresHour        string
}

type entryView struct {
	// Entry is the entry's status from the one builder (status.Of), the
	// leader's fires overlaid: paused, what the workers reported, the
	// newest fire and every other field the page shows of the entry's
	// state, as /status says them.
	status.Entry
	Def       []defRow
	Zone      string
	Next      []nextRow
	NextNote  string
	RunRows   []runView
	FiresHour string
	// Audit is who changed the entry, when and why, newest first;
	// Backfills its backfills on record. Read for a full page only.
	Audit     []store.AuditRecord
	Backfills []store.Backfill
	AuditErr  string
}

type defRow struct{ Key, Value string }

type nextRow struct {
	N   int
	At  time.Time
	Abs string
	DST string
}

type runView struct {
	TaskID    string
	Slot      string
	Published string
	At        time.Time
	Token     int64
	Lag       string
	Manual    bool
	// What the workers reported about it, when known.
	Outcome, Worker, Runtime, Exception string
}

// query is the overview's filter and page.
type query struct {
	Q, In string
	Page  int
}

func overviewQuery(v url.Values) query {
	q := query{Q: strings.TrimSpace(v.Get("q")), In: v.Get("in")}
	switch q.In {
	case "name", "task", "queue":
	default:
		q.In = "all"
	}
	q.Page, _ = strconv.Atoi(v.Get("page"))
	q.Page = max(q.Page, 1)
	return q
}

func (q query) values(page int) url.Values {
	v := url.Values{}
	if q.Q != "" {
		v.Set("q", q.Q)
	}
	if q.In != "all" {
		v.Set("in", q.In)
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	return v
}

func (q query) url(page int) string {
	if v := q.values(page); len(v) > 0 {
		return "/?" + v.Encode()
	}
	return "/"
}

// clusterState is the part of a page read from etcd each render.
func (s *Server) clusterState(ctx context.Context, p *page) (election.Leader, []election.Replica) {
	cv := &p.Cluster
	cv.Prefix, cv.Self, cv.Broker = s.cfg.Prefix, s.cfg.ID, s.cfg.Broker
	leader, err := election.Observe(ctx, s.cfg.Client, s.cfg.Prefix)
	switch {
	case errors.Is(err, election.ErrNoLeader):
		cv.LeaderErr = "no leader right now: an election is under way"
	case err != nil:
		cv.LeaderErr = "etcd does not answer: " + err.Error()
	default:
		cv.Leader, cv.Token = leader.ID, leader.Token
		cv.LeaderSince = s.cluster.seenLeader(leader.Token, p.Now)
	}
	// A sharded cluster has no leader of its own: each shard has one,
	// with its own token (status.Shards, as /status says).
	shards, err := status.Shards(ctx, s.cfg.Client, s.cfg.Prefix)
	switch {
	case err != nil && cv.LeaderErr == "":
		cv.LeaderErr = "etcd does not answer: " + err.Error()
	case len(shards) > 0:
		cv.Shards, cv.LeaderErr = shards, ""
	}
	replicas, err := election.Replicas(ctx, s.cfg.Client, s.cfg.Prefix)
	if err != nil && cv.LeaderErr == "" {
		cv.LeaderErr = "etcd does not answer: " + err.Error()
	}
	for _, r := range replicas {
		rv := replicaView{ID: r.ID, HTTP: r.HTTP, Health: r.Health, Version: r.Version, Healthy: r.Health == "ok",
			Leader: r.ID == leader.ID && leader.Token != 0, Self: r.ID == s.cfg.ID, Started: r.Started, Updated: r.Updated,
			Stale: p.Now.Sub(r.Updated) > 10*time.Second}
		for _, sh := range shards {
			if sh.LeaderID == r.ID {
				rv.LeadsShards = append(rv.LeadsShards, sh.Shard)
			}
		}
		if rv.Leader && r.LeaderToken == leader.Token && !r.LeaderSince.IsZero() {
			cv.LeaderSince, cv.SinceExact = r.LeaderSince, true
		}
		cv.Replicas = append(cv.Replicas, rv)
	}
	cv.FailureCount, cv.Failures = s.cluster.recentFailures(p.Now.Add(-time.Hour), 20)
	if took, err := s.pingBroker(ctx); err != nil {
		cv.BrokerErr = err.Error()
	} else {
		// Whole milliseconds, so the section only changes when it matters.
		cv.BrokerRTT = "under 1 ms"
		if took >= time.Millisecond {
			cv.BrokerRTT = took.Round(time.Millisecond).String()
		}
	}
	return leader, replicas
}

func (s *Server) newPage(view string, live bool) *page {
	return &page{View: view, AdminEnabled: s.cfg.AdminEnabled, Live: live, Now: s.cfg.Clock.Now()}
}

// overview builds the main page: cluster, timeline and one page of the
// entries table.
func (s *Server) overview(ctx context.Context, q query, live bool) *page {
	p := s.newPage("overview", live)
	p.Title = "beatd " + s.cfg.Prefix
	v := q.values(0)
	v.Set("view", "overview")
	if q.Page > 1 {
		v.Set("page", strconv.Itoa(q.Page))
	}
	p.Events = "/console/events?" + v.Encode()
	leader, replicas := s.clusterState(ctx, p)
	if err := s.cluster.ready(ctx); err != nil {
		p.Cluster.LeaderErr = err.Error()
	}
	ev := s.entriesPage(ctx, q, p.Now, p.Cluster.Shards, replicas)
	names := make([]string, len(ev.Rows))
	for i, r := range ev.Rows {
		names[i] = r.Name
	}
	ld, err := s.fetchLeaderData(ctx, leader, p.Cluster.Shards, replicas, names)
	s.applyLeaderData(p, ld, err)
	if ld != nil {
		ev.SinceLeader, ev.LeaderKnown = ld.Timeline.Since, true
		for i := range ev.Rows {
			r := &ev.Rows[i]
			f, ok := ld.Timeline.Entries[r.Name]
			if !ok {
				r.FiresHour = "0"
				continue
			}
			r.FiresHour = strconv.Itoa(f.LastHour)
			r.Overlay(leaderFire(f))
			r.LastAbs = fmtIn(r.LastFire.At, s.zone(r.Name))
		}
	}
	p.Entries = ev
	return p
}

// leaderFire is the leader's newest fire of an entry, from its timeline,
// for status's overlay.
func leaderFire(f EntryFires) status.Live {
	return status.Live{Result: f.Result, FireAt: f.At, Manual: f.Manual}
}

// entryStatus is e's status from the one builder, with its state as this
// replica last read it and runs, its newest runs (oldest first).
func (s *Server) entryStatus(e *config.Entry, runs outcome.EntryRuns, now time.Time) status.Entry {
	f := status.Facts{Name: e.Name, Entry: e, State: s.cluster.state(e.Name), Cluster: keys.Cluster(s.cfg.Prefix)}
	if len(runs.Runs) > 0 {
		f.History = &runs
	}
	return status.Of(f, now)
}

// applyLeaderData fills the timeline and backlog, or says why they are
// missing. On a sharded cluster both can come: the numbers of the shards
// whose leaders answered, and why the others' are missing.
func (s *Server) applyLeaderData(p *page, ld *leaderData, err error) {
	if err != nil {
		p.Cluster.LeaderData = err.Error()
	}
	if ld == nil {
		p.Cluster.Backlog = "unknown"
		return
	}
	if ld.BacklogOK {
		p.Cluster.Backlog = thousands(ld.Backlog) + " entries published but not yet written to etcd"
		if ld.Backlog == 0 {
			p.Cluster.Backlog = "none: etcd has every publish"
		}
		if ld.Shards != nil {
			p.Cluster.Backlog += ", in shards " + ints(ld.Shards)
		}
	} else {
		p.Cluster.Backlog = "unknown"
	}
	p.Timeline = buildTimeline(ld.Timeline)
	if ld.Shards != nil {
		p.Timeline.Shards = ints(ld.Shards)
	}
}

func buildTimeline(s Snapshot) *timelineView {
	tv := &timelineView{Since: s.Since, Term: s.Term, Rows: s.Minutes}
	var maxLag time.Duration
	for _, m := range s.Minutes {
		tv.MaxFires = max(tv.MaxFires, m.Fires+m.Errors)
		maxLag = max(maxLag, m.LagP99)
		tv.Total += m.Fires
		tv.Errors += m.Errors
	}
	const width, height = 10.0, 100.0
	var pts []string
	for i, m := range s.Minutes {
		b := bar{X: float64(i) * width, Label: fmt.Sprintf("%s: %d fires", m.Start.Format("15:04"), m.Fires), HasError: m.Errors > 0}
		if tv.MaxFires > 0 {
			b.H = height * float64(m.Fires+m.Errors) / float64(tv.MaxFires)
		}
		b.Y = height - b.H
		tv.Bars = append(tv.Bars, b)
		if maxLag > 0 && m.LagP99 > 0 {
			y := height - height*float64(m.LagP99)/float64(maxLag)
			x := float64(i)*width + width/2
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			tv.LagPts = append(tv.LagPts, point{x, y})
		}
	}
	tv.LagLine = strings.Join(pts, " ")
	tv.MaxLag = fmtLag(maxLag)
	return tv
}

func fmtLag(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return d.Round(10 * time.Millisecond).String()
}

func (s *Server) zone(name string) *time.Location {
	if e := s.cfg.Entries().Entry(name); e != nil && e.Location != nil {
		return e.Location
	}
	return time.UTC
}

// fmtIn writes t in loc, with the zone's abbreviation.
func fmtIn(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return ""
	}
	return t.In(loc).Format("2006-01-02 15:04:05 MST")
}

// entryIndex is the config's entries sorted by next fire. It is rebuilt
// when the config or the order-changing state (a pause, a resume, a new
// entry) changes; as slots pass, only the rows that fired move.
type entryIndex struct {
	mu    sync.Mutex
	cfg   *config.Config
	gen   uint64
	until time.Time
	rows  []indexRow
}

// indexRow is an entry's place in the order; what a row shows comes from
// its status (entryStatus), built for the rows of the page shown.
type indexRow struct {
	e    *config.Entry
	next time.Time
	at   int64 // next in Unix ns, the order's key (never: the largest)
}

func newIndexRow(e *config.Entry, st *store.EntryState, now time.Time) indexRow {
	r := indexRow{e: e, next: upcoming.Next(e, st, now), at: math.MaxInt64}
	if !r.next.IsZero() {
		r.at = r.next.UnixNano()
	}
	return r
}

// compareRows orders rows by next fire, never last, then by name.
func compareRows(x, y indexRow) int {
	if c := cmp.Compare(x.at, y.at); c != 0 {
		return c
	}
	return strings.Compare(x.e.Name, y.e.Name)
}

// sorted returns the index as of now. The rows returned are never
// changed, so callers read them without the lock.
func (s *Server) sorted(now time.Time) []indexRow {
	cfg := s.cfg.Entries()
	gen := s.cluster.generation()
	ix := &s.index
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.cfg == cfg && ix.gen == gen {
		if now.Before(ix.until) {
			return ix.rows
		}
		// The rows whose next fire has passed are the only ones whose
		// place changed, and, the rows being sorted by it, they are a
		// prefix: at a million entries firing ~300 times a second, a
		// view re-sorts those instead of all (seconds of CPU).
		k := 0
		for k < len(ix.rows) && ix.rows[k].at <= now.UnixNano() {
			k++
		}
		if k <= len(ix.rows)/4 {
			ix.rows = s.advance(ix.rows, k, now)
			ix.setUntil(now)
			return ix.rows
		}
	}
	states, gen := s.cluster.statesSnapshot()
	rows := make([]indexRow, len(cfg.Entries))
	// Every core: a million crontabs' next slots take seconds on one.
	var wg sync.WaitGroup
	per := max(len(rows)/runtime.GOMAXPROCS(0)+1, 4096)
	for lo := 0; lo < len(rows); lo += per {
		hi := min(lo+per, len(rows))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				e := cfg.Entries[i]
				rows[i] = newIndexRow(e, states[e.Name], now)
			}
		})
	}
	wg.Wait()
	slices.SortFunc(rows, compareRows)
	ix.cfg, ix.gen, ix.rows = cfg, gen, rows
	ix.setUntil(now)
	return rows
}

// setUntil keeps the index until its first row's slot passes (an hour
// with none).
func (ix *entryIndex) setUntil(now time.Time) {
	ix.until = now.Add(time.Hour)
	if len(ix.rows) > 0 && !ix.rows[0].next.IsZero() {
		ix.until = ix.rows[0].next
	}
}

// advance returns rows with its first k (the slots passed) computed
// again and merged back in order, in a new slice: readers may still hold
// the old one.
func (s *Server) advance(rows []indexRow, k int, now time.Time) []indexRow {
	moved := make([]indexRow, k)
	for i, r := range rows[:k] {
		moved[i] = newIndexRow(r.e, s.cluster.state(r.e.Name), now)
	}
	slices.SortFunc(moved, compareRows)
	rest := rows[k:]
	out := make([]indexRow, 0, len(rows))
	for len(moved) > 0 && len(rest) > 0 {
		if compareRows(moved[0], rest[0]) <= 0 {
			out, moved = append(out, moved[0]), moved[1:]
		} else {
			out, rest = append(out, rest[0]), rest[1:]
		}
	}
	out = append(out, moved...)
	return append(out, rest...)
}

func (r indexRow) matches(q query, needle string) bool {
	if needle == "" {
		return true
	}
	has := func(s string) bool { return strings.Contains(strings.ToLower(s), needle) }
	switch q.In {
	case "name":
		return has(r.e.Name)
	case "task":
		return has(r.e.Task)
	case "queue":
		return has(r.e.Options.Queue)
	}
	return has(r.e.Name) || has(r.e.Task) || has(r.e.Options.Queue)
}

// entriesPage filters the entries and renders one page of them. On a
// sharded cluster (shards) the table is the cluster's: each shard
// leader's part is asked of it (clusterRows), and the page is cut from
// their merge.
func (s *Server) entriesPage(ctx context.Context, q query, now time.Time, shards []status.ShardStatus, replicas []election.Replica) *entriesView {
	size := s.cfg.PageSize
	first := (q.Page - 1) * size
	ev := &entriesView{Q: q.Q, In: q.In}
	var picked []rowKey
	if len(shards) > 0 && s.cfg.LedShards != nil {
		picked = s.clusterRows(ctx, q, first+size, shards, replicas, now, ev)
		picked = picked[min(first, len(picked)):]
	} else {
		picked, ev.Total, ev.Matched = s.localRows(q, first, size, now)
	}
	picked = picked[:min(size, len(picked))]
	ev.Pages = max((ev.Matched+size-1)/size, 1)
	ev.Page = min(q.Page, ev.Pages)
	if len(picked) == 0 && ev.Matched > 0 && q.Page > ev.Pages { // past the last page: show the last
		return s.entriesPage(ctx, query{Q: q.Q, In: q.In, Page: ev.Pages}, now, shards, replicas)
	}
	ev.From, ev.To = first+1, first+len(picked)
	if ev.Page > 1 {
		ev.Prev = q.url(ev.Page - 1)
	}
	if ev.Page < ev.Pages {
		ev.Next = q.url(ev.Page + 1)
	}
	ev.Rows = s.renderRows(ctx, picked, replicas, now, ev)
	return ev
}

// localRows is this replica's part of the entries table: limit of its
// entries that match q, from the skip-th, in the table's order, with how
// many it holds and how many match.
func (s *Server) localRows(q query, skip, limit int, now time.Time) (keys []rowKey, total, matched int) {
	rows := s.sorted(now)
	needle := strings.ToLower(q.Q)
	for _, r := range rows {
		if !r.matches(q, needle) {
			continue
		}
		if matched++; matched > skip && len(keys) < limit {
			keys = append(keys, rowKey{Name: r.e.Name, At: r.at, row: r})
		}
	}
	return keys, len(rows), matched
}

// rowViews renders rows of this replica's entries, each from its status.
func (s *Server) rowViews(ctx context.Context, picked []*config.Entry, now time.Time) []rowView {
	names := make([]string, len(picked))
	for i, e := range picked {
		names[i] = e.Name
	}
	runs, err := s.recentRuns(ctx, names)
	if err != nil {
		s.log.Warn("read run history", "err", err)
	}
	out := make([]rowView, 0, len(picked))
	for _, e := range picked {
		loc := e.Location
		if loc == nil {
			loc = time.UTC
		}
		es := s.entryStatus(e, runs[e.Name], now)
		rv := rowView{Entry: es, Queue: e.Options.Queue, Zone: loc.String(), FiresHour: "–"}
		if es.NextRunAt != nil {
			rv.Next = *es.NextRunAt
		}
		rv.NextAbs, rv.LastAbs = fmtIn(rv.Next, loc), fmtIn(es.LastFire.At, loc)
		out = append(out, rv)
	}
	return out
}

// entryPage builds one entry's page.
func (s *Server) entryPage(ctx context.Context, name string, live bool) *page {
	p := s.newPage("entry", live)
	p.Title = name + " · beatd"
	p.Events = "/console/events?" + url.Values{"view": {"entry"}, "name": {name}}.Encode()
	leader, replicas := s.clusterState(ctx, p)
	if err := s.cluster.ready(ctx); err != nil {
		p.Cluster.LeaderErr = err.Error()
	}
	e := s.cfg.Entries().Entry(name)
	if s.cfg.Entry != nil {
		if found, err := s.cfg.Entry(ctx, name); err != nil {
			s.log.Warn("read an entry's definition", "entry", name, "err", err)
		} else {
			e = found
		}
	}
	if e == nil {
		p.Missing = name
		return p
	}
	loc := e.Location
	if loc == nil {
		loc = time.UTC
	}
	runs, err := s.recentRuns(ctx, []string{name})
	if err != nil {
		s.log.Warn("read run history", "err", err)
	}
	rs := runs[name]
	st := s.cluster.state(name)
	es := s.entryStatus(e, rs, p.Now)
	ev := &entryView{Entry: es, Zone: loc.String(), Def: definition(e, es, s.cfg.Entries().File), FiresHour: "–"}
	// The next 20 slots the leader fires (upcoming.Slots: its grid,
	// end_at, calendars, max_runs), marking where the zone's UTC offset
	// changes.
	prev := p.Now.In(loc)
	for i, t := range upcoming.Slots(e, st, p.Now, 20) {
		at := t.In(loc)
		row := nextRow{N: i + 1, At: t, Abs: at.Format("Mon 2006-01-02 15:04:05 MST")}
		if _, po := prev.Zone(); po != offset(at) {
			row.DST = fmt.Sprintf("DST: UTC offset %s → %s", prev.Format("-07:00"), at.Format("-07:00"))
		}
		ev.Next = append(ev.Next, row)
		prev = at
	}
	switch {
	case !e.Enabled:
		ev.NextNote = "This entry is disabled (enabled: false): these slots will not fire."
	case ev.Paused:
		ev.NextNote = "This entry is paused: these slots will not fire until it is resumed."
	case len(ev.Next) == 0:
		ev.NextNote = "This entry has no future slot."
	}
	for _, r := range rs.Runs { // newest first
		rv := runView{TaskID: r.TaskID, Slot: fmtIn(r.Slot, loc), Published: fmtIn(r.PublishedAt, loc), At: r.PublishedAt,
			Token: r.Token, Manual: r.Manual, Lag: fmtLag(r.PublishedAt.Sub(r.Slot))}
		if r.Manual {
			rv.Lag, rv.Slot = "manual", "manual ("+rv.Slot+")"
		}
		if o := es.OutcomeOf(r); o != nil {
			rv.Outcome, rv.Worker = o.OutcomeText(), o.Worker
			if rt := o.Runtime(); rt > 0 {
				rv.Runtime = rt.Round(time.Millisecond).String()
			}
			rv.Exception = o.ExceptionText()
		}
		ev.RunRows = append(ev.RunRows, rv)
	}
	ld, err := s.fetchLeaderData(ctx, leader, p.Cluster.Shards, replicas, []string{name})
	s.applyLeaderData(p, ld, err)
	p.Timeline = nil // the timeline is the overview's
	if ld != nil {
		if f, ok := ld.Timeline.Entries[name]; ok {
			ev.FiresHour = strconv.Itoa(f.LastHour)
			ev.Overlay(leaderFire(f))
		} else {
			ev.FiresHour = "0"
		}
	}
	if !live {
		s.history(ctx, ev)
	}
	p.Entry = ev
	return p
}

// entryAudit is how many audit records an entry's page shows.
const entryAudit = 20

// history reads the entry's audit records and backfills.
func (s *Server) history(ctx context.Context, ev *entryView) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st := store.New(s.cfg.Client, s.cfg.Prefix)
	recs, err := st.AuditLog(ctx, ev.Name, entryAudit)
	if err != nil {
		ev.AuditErr = err.Error()
		return
	}
	ev.Audit = recs
	jobs, err := st.Backfills(ctx)
	if err != nil {
		ev.AuditErr = err.Error()
		return
	}
	for i := len(jobs) - 1; i >= 0; i-- {
		if jobs[i].Entry == ev.Name {
			ev.Backfills = append(ev.Backfills, jobs[i])
		}
	}
}

func offset(t time.Time) int {
	_, o := t.Zone()
	return o
}

// definition lists every setting of an entry, as configured, with where
// it comes from and the tasks it runs as its status es says them.
func definition(e *config.Entry, es status.Entry, file string) []defRow {
	source := es.Source
	loc := "UTC"
	if e.Location != nil {
		loc = e.Location.String()
	}
	if source == sources.File {
		source = fmt.Sprintf("file %s:%d:%d", file, e.Line, e.Column)
	}
	d := []defRow{
		{"source", source},
		{"task", cmp.Or(es.Workflow, e.Task)},
		{"schedule", schedule.Describe(e.Schedule)},
		{"schedule (exact)", fmt.Sprint(e.Schedule)},
		{"timezone", loc},
		{"args", valueJSON(e.Args)},
		{"kwargs", valueJSON(e.Kwargs)},
		{"queue", e.Options.Queue},
	}
	opt := func(k, v string) {
		if v != "" {
			d = append(d, defRow{k, v})
		}
	}
	opt("exchange", e.Options.Exchange)
	opt("routing_key", e.Options.RoutingKey)
	if e.Options.Priority != nil {
		opt("priority", strconv.Itoa(*e.Options.Priority))
	}
	if e.Options.Expires.After > 0 {
		opt("expires", schedule.WordsDuration(e.Options.Expires.After)+" after publishing")
	} else if !e.Options.Expires.At.IsZero() {
		opt("expires", e.Options.Expires.At.Format(time.RFC3339))
	}
	if e.Options.LateExpires > 0 {
		opt("late_slot_expires", schedule.WordsDuration(e.Options.LateExpires)+" after publishing a late slot")
	}
	if e.Options.Headers != nil {
		opt("headers", valueJSON(e.Options.Headers))
	}
	if e.Options.TimeLimit != nil {
		opt("time_limit", fmt.Sprint(e.Options.TimeLimit))
	}
	if e.Options.SoftTimeLimit != nil {
		opt("soft_time_limit", fmt.Sprint(e.Options.SoftTimeLimit))
	}
	if e.Options.IgnoreResult {
		opt("ignore_result", "true")
	}
	if e.Templated() {
		opt("templated", "args, kwargs or headers render the slot at each fire (beatd next --json shows them)")
	}
	d = append(d, defRow{"enabled", strconv.FormatBool(e.Enabled)}, defRow{"catchup", string(e.Catchup)},
		defRow{"catchup_window", schedule.WordsDuration(e.CatchupWindow)}, defRow{"max_catchup", strconv.Itoa(int(e.MaxCatchup))})
	if e.Jitter > 0 {
		opt("jitter", schedule.WordsDuration(e.Jitter))
	}
	if !e.StartAt().IsZero() {
		opt("start_at", e.StartAt().Format(time.RFC3339))
	}
	return d
}

// valueJSON writes args, kwargs or headers as JSON, keeping mapping order.
func valueJSON(v any) string {
	var b strings.Builder
	writeValue(&b, v)
	return b.String()
}

func writeValue(b *strings.Builder, v any) {
	switch v := v.(type) {
	case *celery.Map:
		if v == nil {
			b.WriteString("{}")
			return
		}
		b.WriteString("{")
		for i, k := range v.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			kb, _ := json.Marshal(k)
			b.Write(kb)
			b.WriteString(": ")
			writeValue(b, v.Values[i])
		}
		b.WriteString("}")
	case []any:
		b.WriteString("[")
		for i, x := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			writeValue(b, x)
		}
		b.WriteString("]")
	default:
		jb, err := json.Marshal(v)
		if err != nil {
			fmt.Fprint(b, v)
			return
		}
		b.Write(jb)
	}
}
