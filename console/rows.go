package console

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/status"
)

// A sharded replica holds the entries of the shards it leads only, so
// the cluster's entries table is cut from every shard leader's part: each
// gives the keys of its first rows in the table's order, the page is the
// merge's, and each renders its own rows of the page (it holds their
// definitions and states). Two small requests per leader, whatever the
// cluster's size; none holds another's entries.

// maxRowsLimit bounds the rows a part gives: the table's pages past it
// are not shown on a sharded cluster (a search narrows the table).
const maxRowsLimit = 100_000

// maxRenderRows bounds the rows one request renders (a page's).
const maxRenderRows = 1000

// rowKey is a row's place in the table: its next fire in Unix ns (never:
// the largest) and its name; owner is the replica that holds it ("" for
// this one, with its row).
type rowKey struct {
	Name  string `json:"name"`
	At    int64  `json:"at"`
	owner string
	row   indexRow
}

func compareKeys(x, y rowKey) int {
	if c := cmp.Compare(x.At, y.At); c != 0 {
		return c
	}
	return strings.Compare(x.Name, y.Name)
}

// rowsAnswer is GET /console/rows.json: with limit, how many entries the
// replica holds, how many match, and the keys of the first limit that
// do; with names, those rows rendered (the ones it holds).
type rowsAnswer struct {
	Total   int       `json:"total"`
	Matched int       `json:"matched"`
	Keys    []rowKey  `json:"keys,omitempty"`
	Rows    []wireRow `json:"rows,omitempty"`
}

// wireRow is a rendered row between replicas, with what /status's JSON
// leaves out of it.
type wireRow struct {
	Row           rowView     `json:"row"`
	ScheduleWords string      `json:"schedule_words"`
	LastFire      status.Fire `json:"last_fire"`
}

func (w wireRow) view() rowView {
	rv := w.Row
	rv.ScheduleWords, rv.LastFire = w.ScheduleWords, w.LastFire
	return rv
}

// serveRows answers another replica's console with this replica's part
// of the entries table (rowsAnswer).
func (s *Server) serveRows(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	now := s.cfg.Clock.Now()
	var a rowsAnswer
	if names := v["name"]; len(names) > 0 {
		if len(names) > maxRenderRows {
			http.Error(w, fmt.Sprintf("at most %d names", maxRenderRows), http.StatusBadRequest)
			return
		}
		cfg := s.cfg.Entries()
		var held []*config.Entry
		for _, name := range names {
			if e := cfg.Entry(name); e != nil {
				held = append(held, e)
			}
		}
		for _, rv := range s.rowViews(ctx, held, now) {
			a.Rows = append(a.Rows, wireRow{Row: rv, ScheduleWords: rv.ScheduleWords, LastFire: rv.LastFire})
		}
	} else {
		limit, err := strconv.Atoi(v.Get("limit"))
		if err != nil || limit < 0 || limit > maxRowsLimit {
			http.Error(w, fmt.Sprintf("limit: want 0 to %d", maxRowsLimit), http.StatusBadRequest)
			return
		}
		a.Keys, a.Total, a.Matched = s.localRows(overviewQuery(v), 0, limit, now)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(a)
}

// clusterRows is the first limit keys of the cluster's table that match
// q, from every shard's leader at once; it sets ev's counts to the
// cluster's and names in ev.Missing the shards whose entries are not
// listed.
func (s *Server) clusterRows(ctx context.Context, q query, limit int, shards []status.ShardStatus, replicas []election.Replica, now time.Time, ev *entriesView) []rowKey {
	var missing []string
	if limit > maxRowsLimit {
		limit = maxRowsLimit
		missing = append(missing, fmt.Sprintf("rows past the first %d (search to narrow the table)", maxRowsLimit))
	}
	owned := map[string][]int{}
	var unled []int
	for _, sh := range shards {
		if sh.LeaderID == "" || sh.FencingToken == 0 {
			unled = append(unled, sh.Shard)
			continue
		}
		owned[sh.LeaderID] = append(owned[sh.LeaderID], sh.Shard)
	}
	if len(unled) > 0 {
		missing = append(missing, "shard "+ints(unled)+": no leader")
	}
	ids := slices.Sorted(maps.Keys(owned))
	answers := make([]rowsAnswer, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			if id == s.cfg.ID {
				a := &answers[i]
				a.Keys, a.Total, a.Matched = s.localRows(q, 0, limit, now)
				return
			}
			v := q.values(0)
			v.Set("limit", strconv.Itoa(limit))
			answers[i], errs[i] = s.askRows(ctx, id, v, replicas)
		})
	}
	wg.Wait()
	var all []rowKey
	for i, id := range ids {
		if errs[i] != nil {
			missing = append(missing, "shard "+ints(owned[id])+": "+errs[i].Error())
			continue
		}
		a := answers[i]
		ev.Total += a.Total
		ev.Matched += a.Matched
		for _, k := range a.Keys {
			if id != s.cfg.ID {
				k.owner = id
			}
			all = append(all, k)
		}
	}
	slices.SortFunc(all, compareKeys)
	// A shard handed over between two reads may be in two parts.
	seen := make(map[string]bool, len(all))
	all = slices.DeleteFunc(all, func(k rowKey) bool {
		dup := seen[k.Name]
		seen[k.Name] = true
		return dup
	})
	ev.Missing = strings.Join(missing, "; ")
	return all[:min(limit, len(all))]
}

// renderRows renders the page's rows: this replica's from its own
// entries, each other replica's by it, in one request each. A row whose
// replica does not give it (it no longer holds the entry, or does not
// answer) is left out and said in ev.Missing.
func (s *Server) renderRows(ctx context.Context, picked []rowKey, replicas []election.Replica, now time.Time, ev *entriesView) []rowView {
	byOwner := map[string][]string{}
	var local []*config.Entry
	for _, k := range picked {
		if k.owner == "" {
			local = append(local, k.row.e)
		} else {
			byOwner[k.owner] = append(byOwner[k.owner], k.Name)
		}
	}
	views := map[string]rowView{}
	for _, rv := range s.rowViews(ctx, local, now) {
		views[rv.Name] = rv
	}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed []string
		lost   int // rows of the replicas that did not answer
	)
	for id, names := range byOwner {
		wg.Go(func() {
			a, err := s.askRows(ctx, id, url.Values{"name": names}, replicas)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%d of this page's rows: %v", len(names), err))
				lost += len(names)
				return
			}
			for _, w := range a.Rows {
				views[w.Row.Name] = w.view()
			}
		})
	}
	wg.Wait()
	out := make([]rowView, 0, len(picked))
	gone := 0
	for _, k := range picked {
		if rv, ok := views[k.Name]; ok {
			out = append(out, rv)
		} else if k.owner != "" {
			gone++
		}
	}
	slices.Sort(failed)
	if n := gone - lost; n > 0 {
		failed = append(failed, fmt.Sprintf("%d of this page's rows moved to another replica meanwhile", n))
	}
	if len(failed) > 0 {
		ev.Missing = strings.Join(append(slices.DeleteFunc([]string{ev.Missing}, func(s string) bool { return s == "" }), failed...), "; ")
	}
	return out
}

// askRows is replica id's GET /console/rows.json?v, shared by every
// viewer for leaderCacheFor.
func (s *Server) askRows(ctx context.Context, id string, v url.Values, replicas []election.Replica) (rowsAnswer, error) {
	return askCached(s, &s.rowsCache, id+"\x00"+v.Encode(), func() (rowsAnswer, error) {
		var a rowsAnswer
		err := s.replicaJSON(ctx, id, "/console/rows.json", v, replicas, &a)
		return a, err
	})
}
