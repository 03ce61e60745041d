package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/beatd/beatd/auth"
)

// Sections of each view that the live stream keeps current, by element id.
var liveSections = map[string][]string{
	"overview": {"cluster", "timeline", "entries"},
	"entry":    {"cluster", "entry-live", "next"},
}

// minRenderGap spaces renders of one stream: a burst of fires (each a
// state write in etcd) becomes one update.
const minRenderGap = 200 * time.Millisecond

// streamWriteTimeout is how long one write of the live stream may take:
// the stream itself has no end, so the server's WriteTimeout is replaced
// by this one per write.
const streamWriteTimeout = 30 * time.Second

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
	// The stream is meant to outlive the server's read and write
	// timeouts: clear the read deadline (one that passed would cancel the
	// request's context), and give each write its own deadline, so a
	// viewer that stops reading is dropped at the next write instead of
	// holding the stream.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{}) // ErrNotSupported off a real server: no deadline to clear
	send := func(format string, args ...any) error {
		// A socket deadline is the OS's wall time, whatever clock the
		// daemon reads.
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// A restarted replica is retried soon.
	if send("retry: 1000\n\n") != nil {
		return
	}

	ctx := r.Context()
	live := s.liveCtx()
	s.cluster.want()
	last := map[string]string{}
	recheck := s.cfg.Clock.NewTicker(recheckEvery)
	defer recheck.Stop()
	heartbeat := s.cfg.Clock.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	for {
		// The viewer's token was checked when the stream opened; a
		// revoked one ends it here, at the next render (the browser's
		// reconnect is then refused).
		if _, err := s.cfg.Tokens.Check(r, auth.RoleRead); err != nil {
			return
		}
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
			if send("event: sections\ndata: %s\n\n", b) != nil {
				return
			}
		}
	wait:
		select {
		case <-ctx.Done():
			return
		case <-live.Done():
			return
		case <-changed:
		case <-recheck.Chan():
		case <-heartbeat.Chan():
			if send(": keepalive\n\n") != nil {
				return
			}
			goto wait
		}
		gap := s.cfg.Clock.NewTimer(minRenderGap)
		select {
		case <-ctx.Done():
			gap.Stop()
			return
		case <-live.Done():
			gap.Stop()
			return
		case <-gap.Chan():
		}
	}
}
