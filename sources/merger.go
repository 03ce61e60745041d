// Package sources merges the places entries come from — schedules.yaml,
// the entries API (kept in etcd) and django-celery-beat's tables — into
// the one config the scheduler runs, with each entry's source, reported
// name conflicts and per-source health. On a sharded replica it holds
// every source's entries of the shards the replica leads, and of the
// others an index of names.
package sources

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/prometheus/client_golang/prometheus"
)

// The sources beatd knows.
const (
	File = "file"
	API  = "api"
	DCB  = "django-celery-beat"
)

// DefaultPriority is the order in which sources win a name claimed by
// more than one.
var DefaultPriority = []string{File, API, DCB}

// ParsePriority reads --sources-priority: a comma-separated permutation of
// (a subset of) the known sources; those left out follow in the default
// order.
func ParsePriority(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(DefaultPriority, p) {
			return nil, fmt.Errorf("unknown source %q (known: %s)", p, strings.Join(DefaultPriority, ", "))
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("source %q listed twice", p)
		}
		out = append(out, p)
	}
	for _, p := range DefaultPriority {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Conflict is a name claimed by more than one source.
type Conflict struct {
	Name    string   `json:"name"`
	Winner  string   `json:"winner"`
	Sources []string `json:"sources"` // in priority order, the winner first
}

// Health is a source's state as readiness and status report it.
type Health struct {
	Source  string `json:"source"`
	Entries int    `json:"entries"`
	// Error is why the source's last read failed; its last good set of
	// entries stays in use meanwhile.
	Error string `json:"error,omitempty"`
	// Invalid lists the source's entries that fail validation and are left
	// out (the others are used).
	Invalid map[string]string `json:"invalid,omitempty"`
}

// Config configures a Merger.
type Config struct {
	// Apply installs a merged config (the scheduler's Reload).
	Apply func(*config.Config) error
	// ApplyDelta, when set, installs a merged config that differs from
	// the last one applied only in the entries named (the scheduler's
	// ReloadDelta); UpdateSource uses it for a small change, so a PUT
	// among a million entries re-merges one entry, not a million.
	ApplyDelta func(cfg *config.Config, changed []string) error
	// Validate is a further check of each entry (the publisher's); an
	// entry that fails it is left out like an invalid one.
	Validate func(*config.Entry) error
	Priority []string
	Logger   *slog.Logger
	// Now is the clock FirstSeen's times are read from (nil: time.Now).
	Now func() time.Time
	// Registry, when set, gets the merger's metrics (else see Collectors).
	Registry prometheus.Registerer
	// ShardOf, when set, makes the merger hold the entries of the
	// sources set whole, the file and django-celery-beat, only for the
	// shards a ShardPart holds (a sharded replica's led shards), and of
	// the others only their names (the index: FileHas, Indexed,
	// Unheld, Conflicts). Nil: every entry is held, and no index kept.
	ShardOf func(name string) int
	// Background, when set, runs work that holds none of the merger's
	// locks and that nothing waits for but a shard's load (the parse of
	// its documents), at a lower priority than the replica's terms
	// (nil: inline).
	Background func(func())
}

// Merger holds the latest documents of each source and the file's config,
// and applies their merge whenever one changes.
type Merger struct {
	c Config

	// upd serialises UpdateSource's read, change and apply: several
	// shards' stores update the runtime entries' source at once.
	upd     sync.Mutex
	mu      sync.Mutex
	file    *config.Config
	rows    map[string]map[string]row    // source -> name -> its document, parsed
	rowErrs map[string]map[string]string // source -> name -> why it has no document
	// gen numbers the file's defaults (genOf is their hash): a row parsed
	// under another generation is parsed again.
	gen      uint32
	genOf    [32]byte
	errs     map[string]error
	invalid  map[string]map[string]string
	conflict map[string]Conflict
	current  *config.Config
	applied  bool
	// perSource counts the running entries each source provides.
	perSource map[string]int
	// primed holds runtime entries the entries API parsed and validated
	// on their way into etcd, for the watch that brings them back: a bulk
	// load otherwise parsed every document twice, an eighth of its CPU
	// (bench-scale's apply profile at 300k). A row is used only for the
	// same document under the same defaults, so one whose write failed
	// is harmless; primeMost bounds them.
	primed map[string]row

	// held is the shards a ShardPart holds (Config.ShardOf set).
	held map[int]bool
	// index is, for each indexed source (File, DCB with Config.ShardOf
	// set), every name it has, sorted, held or not.
	index map[string][]string
	// idxConflict is the conflicts among the indexed sources' names of
	// the shards not held, whose entries the merge does not see.
	idxConflict map[string]Conflict
	// seen is, for the file and django-celery-beat, when each name they
	// gained while this replica ran was first seen (seen.go). It has its
	// own lock: a term's start asks it of every entry without a baseline,
	// and must not wait for a merge under mu.
	seenMu sync.Mutex
	seen   map[string]map[string]time.Time

	entriesG  *prometheus.GaugeVec
	upG       *prometheus.GaugeVec
	invalidG  *prometheus.GaugeVec
	conflictG prometheus.Gauge
}

// row is one document of a source and its validation, valid while the
// document and the file's defaults (generation gen) are the same. A
// million of them are held at once, so it is kept small (40 bytes): the
// document is the only copy beatd keeps, one number stands for the
// defaults, and the reason an invalid row has no entry is held apart (an
// error would take 16 bytes in every row, for the few that fail).
type row struct {
	doc    string
	entry  *config.Entry
	failed *string // why there is no entry; nil when there is one
	gen    uint32
}

// New returns a Merger over file's config (which may be nil until SetFile).
func New(c Config) *Merger {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if len(c.Priority) == 0 {
		c.Priority = DefaultPriority
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	m := &Merger{c: c, rows: map[string]map[string]row{}, rowErrs: map[string]map[string]string{},
		held: map[int]bool{}, index: map[string][]string{}, seen: map[string]map[string]time.Time{},
		errs: map[string]error{}, invalid: map[string]map[string]string{}, conflict: map[string]Conflict{},
		entriesG: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "beatd_source_entries",
			Help: "Entries each source provides to the running config (after conflicts and invalid ones)."}, []string{"source"}),
		upG: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "beatd_source_up",
			Help: "1 when a source's last read worked, 0 while it fails and its last good set is kept."}, []string{"source"}),
		invalidG: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "beatd_source_invalid_entries",
			Help: "Entries of a source left out because they fail validation."}, []string{"source"}),
		conflictG: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_source_conflicts",
			Help: "Entry names claimed by more than one source (the first in --sources-priority wins)."}),
	}
	if c.Registry != nil {
		c.Registry.MustRegister(m.Collectors()...)
	}
	m.c.Logger = c.Logger.With("component", "sources")
	return m
}

// Collectors returns the merger's metrics, to register when Config had
// no Registry.
func (m *Merger) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.entriesG, m.upG, m.invalidG, m.conflictG}
}

// Prime hands the merger e, parsed from doc under file and validated,
// for the runtime source's entry name: when the watch brings that
// document back, e is used instead of parsing it again. It does nothing
// if file is no longer the merger's.
func (m *Merger) Prime(file *config.Config, name string, doc []byte, e *config.Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.file != file {
		return
	}
	if m.primed == nil || len(m.primed) >= primeMost {
		// Rows nobody took (their writes failed, or the watch is far
		// behind) are dropped together: only the second parse is lost.
		m.primed = make(map[string]row, 1024)
	}
	m.primed[name] = row{doc: string(doc), entry: e, gen: m.defaultsGen()}
}

// primeMost is the most primed rows held: a few seconds of a bulk load.
const primeMost = 1 << 15

// reuse returns a row of name already parsed from doc under the defaults
// gen, if there is one: the cache's (an unchanged document keeps its
// entry), else the one the entries API primed, which it forgets, else
// pre's (parsePart's, nil for none); m.mu is held.
func (m *Merger) reuse(source string, cache, pre map[string]row, name string, doc []byte, gen uint32) (row, bool) {
	if p, ok := cache[name]; ok && p.parsedFrom(doc, gen) {
		return p, true
	}
	if p, ok := m.primed[name]; ok && source == API {
		delete(m.primed, name)
		if p.parsedFrom(doc, gen) {
			p.entry.Source = source
			return p, true
		}
	}
	if p, ok := pre[name]; ok && p.parsedFrom(doc, gen) {
		return p, true
	}
	return row{}, false
}

// parsedFrom says whether p is doc's row under the defaults gen.
func (p row) parsedFrom(doc []byte, gen uint32) bool { return p.gen == gen && p.doc == string(doc) }

// File returns the file's config last set.
func (m *Merger) File() *config.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.file
}

// Current returns the merged config last applied (nil before the first).
func (m *Merger) Current() *config.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.current
}

// SetFile installs a new schedules.yaml config and applies the merge. On
// error the previous merge stays in force.
//
// With Config.ShardOf set, only the entries of held shards are kept, and
// the names of all of them indexed.
func (m *Merger) SetFile(cfg *config.Config) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, prevIdx := m.file, m.index[File]
	if m.c.ShardOf != nil && cfg != nil {
		names := make([]string, len(cfg.Entries))
		kept := make([]*config.Entry, 0, len(cfg.Entries)/max(1, len(m.c.Priority)))
		for i, e := range cfg.Entries {
			names[i] = e.Name
			if m.holds(e.Name) {
				kept = append(kept, e)
			}
		}
		m.index[File] = names
		cfg = cfg.WithEntries(slices.Clip(kept))
	}
	m.file = cfg
	if err := m.applyLocked("", nil); err != nil {
		m.file, m.index[File] = prev, prevIdx
		m.indexConflicts()
		return err
	}
	switch {
	case m.indexed(File):
		next := m.index[File]
		m.noteSeen(File, prevIdx == nil, len(prevIdx), len(next),
			func(i int) string { return prevIdx[i] }, func(i int) string { return next[i] })
	case cfg != nil:
		var was []*config.Entry
		if prev != nil {
			was = prev.Entries
		}
		m.noteSeen(File, prev == nil, len(was), len(cfg.Entries),
			func(i int) string { return was[i].Name }, func(i int) string { return cfg.Entries[i].Name })
	}
	return nil
}

// SetSource replaces all of a source's entry documents (name -> document in
// the schema of a schedules.yaml entry) and applies the merge. It also
// clears the source's error: its read worked.
func (m *Merger) SetSource(source string, docs map[string][]byte) error {
	return m.SetSourceRows(source, docs, nil)
}

// SetSourceRows is SetSource for a source that also has records that
// could not become documents (name -> why); they are reported as invalid
// entries.
//
// With Config.ShardOf set, a django-celery-beat set is held for the held
// shards only, and its names indexed.
func (m *Merger) SetSourceRows(source string, docs map[string][]byte, bad map[string]string) error {
	if !m.indexed(source) {
		return m.setRows(source, docs, bad, false)
	}
	// Serialised with the shards' parts, which load and drop a shard's
	// documents of the source.
	m.upd.Lock()
	defer m.upd.Unlock()
	return m.setRows(source, docs, bad, true)
}

// setRows is SetSourceRows; whole says docs is the source's every
// document, to index and keep the held ones of.
func (m *Merger) setRows(source string, docs map[string][]byte, bad map[string]string, whole bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	prevIdx, hadIdx := m.index[source]
	if whole {
		m.index[source] = slices.Sorted(maps.Keys(docs))
		held := make(map[string][]byte)
		for name, doc := range docs {
			if m.holds(name) {
				held[name] = doc
			}
		}
		docs = held
	}
	prev, prevBad, hadErr := m.rows[source], m.rowErrs[source], m.errs[source]
	m.rowErrs[source] = bad
	delete(m.errs, source)
	if hadErr != nil {
		m.c.Logger.Info("source recovered", "source", source, "entries", len(docs))
	}
	m.upG.WithLabelValues(source).Set(1)
	if err := m.applyLocked(source, docs); err != nil {
		m.rows[source], m.rowErrs[source] = prev, prevBad
		if hadIdx {
			m.index[source] = prevIdx
		}
		m.indexConflicts()
		return err
	}
	switch {
	case whole:
		next := m.index[source]
		m.noteSeen(source, !hadIdx, len(prevIdx), len(next),
			func(i int) string { return prevIdx[i] }, func(i int) string { return next[i] })
	case source == DCB && prev != nil:
		m.noteSeenSet(source, prev, docs)
	}
	return nil
}

// SetError records that a source failed to read. Its last good set stays
// in use; readiness, metrics and the log report the failure.
func (m *Merger) SetError(source string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev := m.errs[source]; prev == nil || prev.Error() != err.Error() {
		m.c.Logger.Error("source failed; keeping its last good entries", "source", source,
			"entries", m.count(source), "err", err)
	}
	m.errs[source] = err
	m.upG.WithLabelValues(source).Set(0)
}

// Health reports every source seen, in priority order.
func (m *Merger) Health() []Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Health
	for _, src := range m.c.Priority {
		h := Health{Source: src}
		switch {
		case src == File && m.file == nil:
			continue
		case src != File:
			if _, ok := m.rows[src]; !ok && m.errs[src] == nil {
				continue
			}
		}
		h.Entries = m.count(src)
		if err := m.errs[src]; err != nil {
			h.Error = err.Error()
		}
		if inv := m.invalid[src]; len(inv) > 0 {
			h.Invalid = maps.Clone(inv)
		}
		out = append(out, h)
	}
	return out
}

// Err is nil when every source's last read worked; else it names each
// failing source (readiness reports it).
func (m *Merger) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, src := range m.c.Priority {
		if err := m.errs[src]; err != nil {
			errs = append(errs, fmt.Errorf("source %s (keeping its last good set of %d entries): %w", src, m.count(src), err))
		}
	}
	return errors.Join(errs...)
}

// Conflicts returns the names claimed by more than one source, by name:
// with Config.ShardOf set, those among the held entries and, of the
// shards not held, those between the file and django-celery-beat (the
// runtime entries of a shard not held are not read).
func (m *Merger) Conflicts() []Conflict {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Collect(maps.Values(m.conflict))
	out = slices.AppendSeq(out, maps.Values(m.idxConflict))
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Source returns the source of the running entry name, or "".
func (m *Merger) Source(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		return ""
	}
	if e := m.current.Entry(name); e != nil {
		return e.Source
	}
	return ""
}

// defaultsGen is the generation of the file's defaults, a new one
// whenever they change.
func (m *Merger) defaultsGen() uint32 {
	if h := m.file.DefaultsHash(); h != m.genOf || m.gen == 0 {
		m.genOf = h
		m.gen++
	}
	return m.gen
}

// applyLocked merges and applies, with docs as source's new documents
// (source "": every source keeps its own); m.mu is held.
func (m *Merger) applyLocked(source string, docs map[string][]byte) error {
	gen := m.defaultsGen()
	// Each source's valid entries, sorted by name, in priority order.
	lists := make([][]*config.Entry, 0, len(m.c.Priority))
	for _, src := range m.c.Priority {
		if src == File {
			if m.file == nil {
				lists = append(lists, nil)
				continue
			}
			for _, e := range m.file.Entries {
				if e.Source != File { // set once, before the config is shared
					e.Source = File
				}
			}
			lists = append(lists, m.file.Entries)
			continue
		}
		cache := m.rows[src]
		next := cache
		if src == source {
			// A new set: a new map, rows carried over where the
			// document is the same.
			next = make(map[string]row, len(docs))
			m.parseAll(src, cache, docs, gen, next)
		} else if next != nil {
			// The same documents: parsed again in place only if the
			// defaults changed.
			stale := map[string][]byte{}
			for name, r := range next {
				if r.gen != gen {
					stale[name] = []byte(r.doc)
				}
			}
			m.parseAll(src, nil, stale, gen, next)
		}
		invalid := maps.Clone(m.rowErrs[src])
		if invalid == nil {
			invalid = map[string]string{}
		}
		valid := make([]*config.Entry, 0, len(next))
		for name, r := range next {
			if r.failed != nil {
				invalid[name] = *r.failed
				continue
			}
			valid = append(valid, r.entry)
		}
		sort.Slice(valid, func(i, j int) bool { return valid[i].Name < valid[j].Name })
		lists = append(lists, valid)
		if next != nil { // a source never set stays unseen
			m.rows[src] = next
		}
		for name, msg := range invalid {
			if old, was := m.invalid[src][name]; !was || old != msg {
				m.c.Logger.Error("invalid entry left out; the source's other entries are used",
					"source", src, "entry", name, "err", msg)
			}
		}
		m.invalid[src] = invalid
		m.invalidG.WithLabelValues(src).Set(float64(len(invalid)))
	}
	// Merge the sorted lists: the first source (in priority) with a name
	// wins it; more than one is a conflict.
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	entries := make([]*config.Entry, 0, total)
	perSource := map[string]int{}
	conflicts := map[string]Conflict{}
	heads := make([]int, len(lists))
	for {
		name, found := "", false
		for i, l := range lists {
			if heads[i] < len(l) && (!found || l[heads[i]].Name < name) {
				name, found = l[heads[i]].Name, true
			}
		}
		if !found {
			break
		}
		var winner *config.Entry
		var srcs []string
		for i, l := range lists {
			if heads[i] < len(l) && l[heads[i]].Name == name {
				if winner == nil {
					winner = l[heads[i]]
				}
				srcs = append(srcs, m.c.Priority[i])
				heads[i]++
			}
		}
		entries = append(entries, winner)
		perSource[winner.Source]++
		if len(srcs) > 1 {
			conflicts[name] = Conflict{Name: name, Winner: srcs[0], Sources: srcs}
		}
	}
	merged := m.file.WithEntries(entries)
	if m.c.Apply != nil {
		if err := m.c.Apply(merged); err != nil {
			return err
		}
	}
	m.logChanges(merged)
	m.current = merged
	m.applied = true
	for name, c := range conflicts {
		if old, ok := m.conflict[name]; !ok || !slices.Equal(old.Sources, c.Sources) {
			m.c.Logger.Warn("entry name claimed by more than one source; the first in --sources-priority wins",
				"entry", name, "winner", c.Winner, "sources", c.Sources)
		}
	}
	for name := range m.conflict {
		if _, still := conflicts[name]; !still {
			m.c.Logger.Info("entry name conflict resolved", "entry", name)
		}
	}
	m.conflict = conflicts
	m.indexConflicts()
	m.perSource = perSource
	for _, src := range m.c.Priority {
		m.entriesG.WithLabelValues(src).Set(float64(perSource[src]))
	}
	return nil
}

// parse returns name's row of source src, parsed from doc under the
// file's defaults (generation gen). It writes no merger state, so
// parseAll runs it on every core; reuse finds rows that need no parse.
func (m *Merger) parse(src, name string, doc []byte, gen uint32) row {
	return m.parseUnder(m.file, src, name, doc, gen)
}

// parseUnder is parse with file's defaults, which need not be m.file
// (the caller checks gen) and so need no lock.
func (m *Merger) parseUnder(file *config.Config, src, name string, doc []byte, gen uint32) row {
	p := row{doc: string(doc), gen: gen}
	e, err := file.ParseEntry(name, doc)
	if err == nil && m.c.Validate != nil {
		err = m.c.Validate(e)
	}
	if err != nil {
		msg := err.Error()
		p.failed = &msg
		return p
	}
	e.Source = src
	p.entry = e
	return p
}

// parseAll puts the row of every document of docs into next: the
// cache's where it still holds, else parsed, on every core when there
// are many (a leader's start reads a million).
func (m *Merger) parseAll(src string, cache map[string]row, docs map[string][]byte, gen uint32, next map[string]row) {
	type job struct {
		name string
		doc  []byte
	}
	var jobs []job
	for name, doc := range docs {
		if p, ok := m.reuse(src, cache, nil, name, doc, gen); ok {
			next[name] = p
		} else {
			jobs = append(jobs, job{name, doc})
		}
	}
	workers := runtime.GOMAXPROCS(0)
	if len(jobs) < parallelFrom || workers < 2 {
		for _, j := range jobs {
			next[j.name] = m.parse(src, j.name, j.doc, gen)
		}
		return
	}
	out := make([]row, len(jobs))
	var wg sync.WaitGroup
	per := (len(jobs) + workers - 1) / workers
	for w := 0; w*per < len(jobs); w++ {
		lo, hi := w*per, min((w+1)*per, len(jobs))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				out[i] = m.parse(src, jobs[i].name, jobs[i].doc, gen)
			}
		})
	}
	wg.Wait()
	for i, j := range jobs {
		next[j.name] = out[i]
	}
}

// parallelFrom is how many documents to parse make it worth the cores.
const parallelFrom = 4096

// deltaMost is the largest change UpdateSource merges entry by entry;
// a larger one (or one over a quarter of the entries) is merged whole,
// which is then cheaper.
const deltaMost = 50000

// UpdateSource changes some of a source's documents (name -> document;
// nil deletes it) and applies the merge. A small change among many
// entries is merged for the named entries only and applied through
// ApplyDelta; the result is the one SetSource would give. It clears the
// source's error, as SetSource does.
func (m *Merger) UpdateSource(source string, changes map[string][]byte) error {
	m.upd.Lock()
	defer m.upd.Unlock()
	return m.updateSource(source, changes)
}

// updateSource is UpdateSource; m.upd is held.
func (m *Merger) updateSource(source string, changes map[string][]byte) error {
	return m.updateSourceOf(source, changes, false, nil)
}

// updateSourceOf is updateSource; part says the changes are one shard's
// names (a Part's): merged entry by entry however many, since a whole
// merge would redo every other shard the replica holds (at 900,000
// entries over 16 shards a shard's ~56,000 entries are past deltaMost,
// and each load copied and merged all the held ones again).
func (m *Merger) updateSourceOf(source string, changes map[string][]byte, part bool, pre map[string]row) error {
	m.mu.Lock()
	rows := m.rows[source]
	if rows == nil {
		rows = map[string]row{}
	}
	if m.c.ApplyDelta != nil && m.applied && m.errs[source] == nil && source != File &&
		(part || len(changes) <= deltaMost && len(changes) <= len(m.current.Entries)/4+16) {
		defer m.mu.Unlock()
		return m.updateLocked(source, rows, changes, pre)
	}
	next := make(map[string][]byte, len(rows)+len(changes))
	for name, r := range rows {
		next[name] = []byte(r.doc)
	}
	for name, doc := range changes {
		if doc == nil {
			delete(next, name)
		} else {
			next[name] = doc
		}
	}
	bad := m.rowErrs[source]
	m.mu.Unlock()
	return m.setRows(source, next, bad, false)
}

// Sink is what a source's reader feeds: a whole Merger, or one Part of
// it.
type Sink interface {
	SetSource(source string, docs map[string][]byte) error
	UpdateSource(source string, changes map[string][]byte) error
	SetError(source string, err error)
}

// Part is one shard's share of a merger's sources (Config.ShardOf): its
// runtime entries, which that shard's leader loads and follows beside the
// other shards' in the one merger, and its entries of the file and
// django-celery-beat, held from Hold to Drop. Conflicts between sources
// are resolved per name as ever (a name is in one shard).
type Part struct {
	m     *Merger
	shard int
}

// ShardPart returns shard i's part of m, whose Config.ShardOf is set.
func (m *Merger) ShardPart(i int) *Part { return &Part{m: m, shard: i} }

// Has says whether name is in the part's shard.
func (p *Part) Has(name string) bool { return p.m.c.ShardOf(name) == p.shard }

// Hold makes the merger keep the shard's entries of every source set
// whole from now on: a django-celery-beat read applied after it keeps
// them, and SetFile and SetSource load them. It applies nothing.
func (p *Part) Hold() {
	m := p.m
	m.upd.Lock()
	defer m.upd.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[p.shard] = true
	m.indexConflicts()
}

// SetFile puts the part's entries of file, a parse of the file the
// merger has (config.CheckPart of its bytes, keeping Has), in place of
// the part's file entries, and applies the merge.
func (p *Part) SetFile(file *config.Config) error {
	m := p.m
	m.upd.Lock()
	defer m.upd.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.file == nil || file == nil || file.DefaultsHash() != m.file.DefaultsHash() {
		return errors.New("sources: shard's file entries: not a part of the file in use")
	}
	entries := make([]*config.Entry, 0, len(m.file.Entries)+len(file.Entries))
	for _, e := range m.file.Entries {
		if !p.Has(e.Name) {
			entries = append(entries, e)
		}
	}
	kept := len(entries)
	for _, e := range file.Entries {
		if p.Has(e.Name) {
			entries = append(entries, e)
		}
	}
	if kept == len(m.file.Entries) && len(entries) == kept {
		return nil // the file has none of the part's entries: no merge
	}
	var names []string
	for _, e := range m.file.Entries {
		if p.Has(e.Name) {
			names = append(names, e.Name)
		}
	}
	for _, e := range entries[kept:] {
		e.Source = File // as applyLocked sets it, before the config is shared
		names = append(names, e.Name)
	}
	prev := m.file
	m.file = m.file.WithEntries(entries)
	if err := m.mergePartLocked(names); err != nil {
		m.file = prev
		return err
	}
	return nil
}

// mergePartLocked applies a change of one part's names: entry by entry
// when the merger can, else merged whole. m.mu is held.
func (m *Merger) mergePartLocked(names []string) error {
	if m.c.ApplyDelta == nil || !m.applied {
		return m.applyLocked("", nil)
	}
	slices.Sort(names)
	if err := m.mergeNamesLocked(slices.Compact(names)); err != nil {
		return err
	}
	m.indexConflicts()
	return nil
}

// Drop stops holding the shard's entries: every source's of the part are
// dropped, and the merge applied.
func (p *Part) Drop() error {
	m := p.m
	m.upd.Lock()
	defer m.upd.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.held, p.shard)
	dropped := false
	if m.file != nil && slices.ContainsFunc(m.file.Entries, func(e *config.Entry) bool { return p.Has(e.Name) }) {
		m.file = m.file.WithEntries(slices.DeleteFunc(slices.Clone(m.file.Entries), func(e *config.Entry) bool { return p.Has(e.Name) }))
		dropped = true
	}
	for src, rows := range m.rows {
		// In place, as updateLocked changes a source's rows: a copy of
		// every other shard's rows is what a drop need not cost.
		n := len(rows)
		maps.DeleteFunc(rows, func(name string, _ row) bool { return p.Has(name) })
		dropped = dropped || len(rows) < n
		if bad := m.rowErrs[src]; src == API && len(bad) > 0 {
			m.rowErrs[src] = maps.Clone(bad)
			maps.DeleteFunc(m.rowErrs[src], func(name, _ string) bool { return p.Has(name) })
			dropped = true
		}
		if inv := m.invalid[src]; len(inv) > 0 {
			// A row the source itself found bad stays reported, as a
			// whole merge reports it.
			bad := m.rowErrs[src]
			maps.DeleteFunc(inv, func(name, _ string) bool { _, isBad := bad[name]; return p.Has(name) && !isBad })
			m.invalidG.WithLabelValues(src).Set(float64(len(inv)))
		}
	}
	if !dropped {
		m.indexConflicts() // the shard's names are unheld now
		return nil
	}
	// The part's names leave the merged config, and only they.
	var names []string
	if m.current != nil {
		for _, e := range m.current.Entries {
			if p.Has(e.Name) {
				names = append(names, e.Name)
			}
		}
	}
	return m.mergePartLocked(names)
}

// SetSource replaces the part's documents of source with docs (whose
// names must be the part's), leaving the other parts' as they are; an
// indexed source's index of the part's names becomes docs'.
func (p *Part) SetSource(source string, docs map[string][]byte) error {
	m := p.m
	pre := m.parsePart(source, docs)
	m.upd.Lock()
	defer m.upd.Unlock()
	changes := make(map[string][]byte, len(docs))
	m.mu.Lock()
	for name := range m.rows[source] {
		if _, kept := docs[name]; !kept && p.Has(name) {
			changes[name] = nil
		}
	}
	for name := range m.rowErrs[source] {
		if _, kept := docs[name]; !kept && p.Has(name) && source == API {
			changes[name] = nil
		}
	}
	if m.indexed(source) {
		idx := slices.DeleteFunc(slices.Clone(m.index[source]), p.Has)
		idx = slices.AppendSeq(idx, maps.Keys(docs))
		slices.Sort(idx)
		m.index[source] = slices.Compact(idx)
		m.indexConflicts()
	}
	m.mu.Unlock()
	for name, doc := range docs {
		changes[name] = doc
	}
	if len(changes) == 0 {
		return nil
	}
	return m.updateSourceOf(source, changes, true, pre)
}

// parsePart parses a part's documents of source before SetSource takes
// the merger's locks, on Config.Background. A shard's load parses tens
// of thousands (seconds at 56,000), and meanwhile the watch of every
// other shard's runtime entries (a DELETE to apply) waited on upd. Rows
// parsed under defaults that changed before the merge are parsed again
// there (updateLocked checks their generation).
func (m *Merger) parsePart(source string, docs map[string][]byte) map[string]row {
	m.mu.Lock()
	file, gen := m.file, m.defaultsGen()
	m.mu.Unlock()
	pre := make(map[string]row, len(docs))
	parse := func() {
		for name, doc := range docs {
			pre[name] = m.parseUnder(file, source, name, doc, gen)
		}
	}
	if m.c.Background != nil {
		m.c.Background(parse)
	} else {
		parse()
	}
	return pre
}

// UpdateSource is the Merger's.
func (p *Part) UpdateSource(source string, changes map[string][]byte) error {
	return p.m.UpdateSource(source, changes)
}

// SetError is the Merger's: a source's health is the replica's.
func (p *Part) SetError(source string, err error) { p.m.SetError(source, err) }

var (
	_ Sink = (*Merger)(nil)
	_ Sink = (*Part)(nil)
)

// Holds says whether the merger holds shard i's entries (a Part's Hold
// to its Drop): the entries of a shard it holds are in its config, and
// only those. A replica's views of the whole cluster (/status, the
// entries API) read the other shards' from etcd and the index; which
// shards it leads is not the same set (a shard loaded for a campaign, or
// one handed over and not yet dropped, is held and not led).
func (m *Merger) Holds(i int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.ShardOf == nil || m.held[i]
}

// holds says whether the merger keeps name's entries of the sources set
// whole (always, unless Config.ShardOf is set); m.mu is held.
func (m *Merger) holds(name string) bool {
	return m.c.ShardOf == nil || m.held[m.c.ShardOf(name)]
}

// indexed says whether source's entries are held for the held shards
// only, beside an index of all its names: the sources set whole (the
// file, django-celery-beat) when Config.ShardOf is set. The runtime
// entries are per shard already (a shard's leader loads its own).
func (m *Merger) indexed(source string) bool {
	return m.c.ShardOf != nil && (source == File || source == DCB)
}

// count is how many entries source has: the index's for an indexed
// source, else those held; m.mu is held.
func (m *Merger) count(source string) int {
	switch {
	case m.indexed(source):
		return len(m.index[source])
	case source == File:
		return len(m.file.Entries)
	}
	return len(m.rows[source])
}

// indexConflicts finds the conflicts among the indexed sources' names of
// the shards not held, by walking their sorted indexes together, and
// sets the conflicts gauge; m.mu is held.
func (m *Merger) indexConflicts() {
	m.idxConflict = nil
	if m.c.ShardOf != nil {
		var srcs []string
		var lists [][]string
		for _, src := range m.c.Priority {
			if m.indexed(src) {
				srcs, lists = append(srcs, src), append(lists, m.index[src])
			}
		}
		m.idxConflict = map[string]Conflict{}
		for name, has := range mergeNames(lists) {
			if len(has) < 2 || m.holds(name) {
				continue
			}
			c := Conflict{Name: name}
			for _, i := range has {
				c.Sources = append(c.Sources, srcs[i])
			}
			c.Winner = c.Sources[0]
			m.idxConflict[name] = c
		}
	}
	m.conflictG.Set(float64(len(m.conflict) + len(m.idxConflict)))
}

// mergeNames walks sorted lists of names together, yielding each name
// once, in order, with the lists (by index, ascending) that have it.
func mergeNames(lists [][]string) iter.Seq2[string, []int] {
	return func(yield func(string, []int) bool) {
		heads := make([]int, len(lists))
		var has []int
		for {
			name, found := "", false
			for i, l := range lists {
				if heads[i] < len(l) && (!found || l[heads[i]] < name) {
					name, found = l[heads[i]], true
				}
			}
			if !found {
				return
			}
			has = has[:0]
			for i, l := range lists {
				if heads[i] < len(l) && l[heads[i]] == name {
					has = append(has, i)
					heads[i]++
				}
			}
			if !yield(name, has) {
				return
			}
		}
	}
}

// FileHas says whether the file defines name, held or not: a runtime
// entry may not take a file's name.
func (m *Merger) FileHas(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.indexed(File) {
		_, ok := slices.BinarySearch(m.index[File], name)
		return ok
	}
	return m.file != nil && m.file.Entry(name) != nil
}

// Indexed returns the indexed sources (Config.ShardOf set: the file,
// django-celery-beat) that have name, held or not, in priority order.
func (m *Merger) Indexed(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, src := range m.c.Priority {
		if _, ok := slices.BinarySearch(m.index[src], name); ok && m.indexed(src) {
			out = append(out, src)
		}
	}
	return out
}

// Named is an entry's name and the source that defines it.
type Named struct{ Name, Source string }

// Unheld is, of the indexed sources' names of the shards not held, the
// first limit that follow after and start with prefix, in name order,
// each with the source that wins it among them; and how many follow in
// all. A sharded replica's pages show them beside the entries it holds.
func (m *Merger) Unheld(after, prefix string, limit int) ([]Named, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c.ShardOf == nil {
		return nil, 0
	}
	from := max(prefix, after)
	var srcs []string
	var lists [][]string
	for _, src := range m.c.Priority {
		if !m.indexed(src) {
			continue
		}
		l := m.index[src]
		i, _ := slices.BinarySearch(l, from)
		for i < len(l) && l[i] == after {
			i++
		}
		srcs, lists = append(srcs, src), append(lists, l[i:])
	}
	var out []Named
	total := 0
	for name, has := range mergeNames(lists) {
		if !strings.HasPrefix(name, prefix) {
			break
		}
		if m.holds(name) {
			continue
		}
		if total++; len(out) < limit {
			out = append(out, Named{Name: name, Source: srcs[has[0]]})
		}
	}
	return out, total
}

// updateLocked is UpdateSource's entry-by-entry merge; m.mu is held.
func (m *Merger) updateLocked(source string, cache map[string]row, changes map[string][]byte, pre map[string]row) error {
	gen := m.defaultsGen()
	type undo struct {
		p       row
		hadP    bool
		invalid string
		hadInv  bool
	}
	// Only a name that had a row or an invalid mark needs its undo kept:
	// a shard's load is mostly new names, and a map of 56,000 empty
	// undos was a tenth of what the load allocated.
	undos := map[string]undo{}
	m.rows[source] = cache
	if m.invalid[source] == nil {
		m.invalid[source] = map[string]string{}
	}
	invalid := m.invalid[source]
	names := make([]string, 0, len(changes))
	for name, doc := range changes {
		names = append(names, name)
		u := undo{}
		u.p, u.hadP = cache[name]
		u.invalid, u.hadInv = invalid[name]
		if u.hadP || u.hadInv {
			undos[name] = u
		}
		delete(invalid, name)
		if doc == nil {
			delete(cache, name)
			continue
		}
		p, ok := m.reuse(source, cache, pre, name, doc, gen)
		if !ok {
			p = m.parse(source, name, doc, gen)
		}
		cache[name] = p
		if p.failed != nil {
			if u.invalid != *p.failed {
				m.c.Logger.Error("invalid entry left out; the source's other entries are used",
					"source", source, "entry", name, "err", *p.failed)
			}
			invalid[name] = *p.failed
		}
	}
	sort.Strings(names)
	restore := func() {
		for _, name := range names {
			u := undos[name]
			if u.hadP {
				cache[name] = u.p
			} else {
				delete(cache, name)
			}
			if u.hadInv {
				invalid[name] = u.invalid
			} else {
				delete(invalid, name)
			}
		}
	}
	if err := m.mergeNamesLocked(names); err != nil {
		restore()
		return err
	}
	delete(m.errs, source)
	m.upG.WithLabelValues(source).Set(1)
	m.invalidG.WithLabelValues(source).Set(float64(len(invalid)))
	return nil
}

// mergeNamesLocked merges the sorted names anew from every source (the
// file and the rows as they now are), as applyLocked's merge picks each
// winner, into the current config, and applies it through ApplyDelta:
// O(the names), plus a pass over the current entries' pointers. m.mu is
// held; on error nothing of the merger's merge state has changed.
func (m *Merger) mergeNamesLocked(names []string) error {
	// The winner of each changed name, as applyLocked's merge picks it.
	prev := m.current
	winners := make([]*config.Entry, len(names))
	conflicts := map[string]*Conflict{}
	for i, name := range names {
		var srcs []string
		for _, src := range m.c.Priority {
			var e *config.Entry
			if src == File {
				if m.file != nil {
					e = m.file.Entry(name)
				}
			} else if p, ok := m.rows[src][name]; ok && p.entry != nil {
				e = p.entry
			}
			if e == nil {
				continue
			}
			if winners[i] == nil {
				winners[i] = e
			}
			srcs = append(srcs, src)
		}
		if len(srcs) > 1 {
			conflicts[name] = &Conflict{Name: name, Winner: srcs[0], Sources: srcs}
		} else {
			conflicts[name] = nil
		}
	}
	// The new sorted entries: the old ones with the changed names
	// replaced, inserted or dropped, in one pass.
	old := prev.Entries
	entries := make([]*config.Entry, 0, len(old)+len(names))
	j := 0
	for i, name := range names {
		for j < len(old) && old[j].Name < name {
			entries = append(entries, old[j])
			j++
		}
		if j < len(old) && old[j].Name == name {
			j++
		}
		if winners[i] != nil {
			entries = append(entries, winners[i])
		}
	}
	entries = append(entries, old[j:]...)
	merged := m.file.WithEntries(entries)
	if err := m.c.ApplyDelta(merged, names); err != nil {
		return err
	}
	cl := changeLog{log: m.c.Logger}
	for i, name := range names {
		was, now := prev.Entry(name), winners[i]
		if was != nil {
			m.perSource[was.Source]--
		}
		if now != nil {
			m.perSource[now.Source]++
		}
		cl.note(was, now)
		c, had := conflicts[name], m.conflict[name]
		switch {
		case c != nil:
			if old, ok := m.conflict[name]; !ok || !slices.Equal(old.Sources, c.Sources) {
				m.c.Logger.Warn("entry name claimed by more than one source; the first in --sources-priority wins",
					"entry", name, "winner", c.Winner, "sources", c.Sources)
			}
			m.conflict[name] = *c
		case had.Name != "":
			m.c.Logger.Info("entry name conflict resolved", "entry", name)
			delete(m.conflict, name)
		}
	}
	cl.done()
	m.current = merged
	m.conflictG.Set(float64(len(m.conflict) + len(m.idxConflict)))
	for _, src := range m.c.Priority {
		m.entriesG.WithLabelValues(src).Set(float64(m.perSource[src]))
	}
	return nil
}

// logChanges logs each entry added, changed or removed by a merge, with
// its source. A first merge logs only counts.
func (m *Merger) logChanges(next *config.Config) {
	if !m.applied {
		return
	}
	cl := changeLog{log: m.c.Logger}
	// Both are sorted by name: walk them together.
	a, b := m.current.Entries, next.Entries
	for len(a) > 0 || len(b) > 0 {
		switch {
		case len(b) == 0 || len(a) > 0 && a[0].Name < b[0].Name:
			cl.note(a[0], nil)
			a = a[1:]
		case len(a) == 0 || b[0].Name < a[0].Name:
			cl.note(nil, b[0])
			b = b[1:]
		default:
			cl.note(a[0], b[0])
			a, b = a[1:], b[1:]
		}
	}
	cl.done()
}

// changeLog logs the entries a merge added, changed or removed: the first
// changeLogMost one by one, then a count (a large source change is
// summarised).
type changeLog struct {
	log *slog.Logger
	n   int
}

const changeLogMost = 100

// note logs was becoming now (either may be nil), if that is a change.
func (c *changeLog) note(was, now *config.Entry) {
	msg, e := "", now
	switch {
	case was == nil && now != nil:
		msg = "entry added"
	case was != nil && now == nil:
		msg, e = "entry removed", was
	case was != nil && (was.Fingerprint != now.Fingerprint || was.Source != now.Source):
		msg = "entry changed"
	}
	if msg == "" {
		return
	}
	if c.n++; c.n <= changeLogMost {
		c.log.Info(msg, "entry", e.Name, "source", e.Source, "task", e.Task, "schedule", fmt.Sprint(e.Schedule))
	}
}

func (c *changeLog) done() {
	if c.n > changeLogMost {
		c.log.Info("entries changed", "count", c.n, "logged", changeLogMost)
	}
}
