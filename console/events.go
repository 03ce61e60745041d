package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Sections of each view that the live stream keeps current, by element id.
var liveSections = map[string][]string{
	"overview": {"cluster", "timeline", "entries"},
	"entry":    {"cluster", "entry-live", "next"},
}

// minRenderGap spaces renders of one stream: a burst of fires (each a
// state write in etcd) becomes one update.
const minRenderGap = 200 * time.Millisecond

// recheckEvery re-renders even without an etcd change, for what is not in
// etcd: the leader's timeline, the broker, run history kept elsewhere.
const recheckEvery = time.Second

// serveEvents streams a view's sections as Server-Sent Events: each
// "sections" event carries the HTML of the sections that changed since the
// last one, rendered by the same templates as the page.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	v := r.URL.Query()
	view := v.Get("view")
	ids, ok := liveSections[view]
	if !ok {
		http.Error(w, "view must be overview or entry", http.StatusBadRequest)
		return
	}
	build := func(ctx context.Context) *page {
		if view == "entry" {
			return s.entryPage(ctx, v.Get("name"), true)
		}
		return s.overview(ctx, overviewQuery(v), true)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// A restarted replica is retried soon.
	fmt.Fprint(w, "retry: 1000\n\n")
	fl.Flush()

	ctx := r.Context()
	live := s.liveCtx()
	s.cluster.want()
	last := map[string]string{}
	recheck := time.NewTicker(recheckEvery)
	defer recheck.Stop()
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	for {
		changed := s.cluster.changes()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p := build(rctx)
		cancel()
		out := map[string]string{}
		for _, id := range ids {
			html, err := s.render("sec-"+id, p)
			if err != nil {
				s.log.Error("render live section", "section", id, "err", err)
				continue
			}
			if last[id] != html {
				out[id] = html
				last[id] = html
			}
		}
		if len(out) > 0 {
			b, _ := json.Marshal(map[string]any{"sections": out})
			if _, err := fmt.Fprintf(w, "event: sections\ndata: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
		}
	wait:
		select {
		case <-ctx.Done():
			return
		case <-live.Done():
			return
		case <-changed:
		case <-recheck.C:
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			fl.Flush()
			goto wait
		}
		gap := time.NewTimer(minRenderGap)
		select {
		case <-ctx.Done():
			gap.Stop()
			return
		case <-live.Done():
			gap.Stop()
			return
		case <-gap.C:
		}
	}
}
