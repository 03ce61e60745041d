package sources

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/beatd/beatd/outcome"
)

// WriteBack copies the runs of django-celery-beat's entries back into its
// tables (--source-write-back), so the Django admin shows them: it sets
// last_run_at, adds the new runs to total_run_count, and disables a
// one-off task once it ran (resetting its count, as dcb does). Only the leader writes. It goes straight to
// the columns, as dcb's own scheduler does, without bumping the change
// marker.
type WriteBack struct {
	Source  *DCBSource
	History outcome.History
	Merger  *Merger
	Leading func() bool
	// Owns, when set, says which of the running entries to write back
	// (a sharded replica's: those of the shards it leads now).
	Owns   func(name string) bool
	Logger *slog.Logger

	written map[string]time.Time // newest run written, per entry
}

// Run writes back every poll interval, on the source's clock, until ctx
// ends.
func (w *WriteBack) Run(ctx context.Context) {
	if w.Logger == nil {
		w.Logger = slog.New(slog.DiscardHandler)
	}
	t := w.Source.Clock.NewTicker(w.Source.interval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if !w.Leading() {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, max(w.Source.interval, 5*time.Second))
		n, err := w.Once(qctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && err.Error() != lastErr:
			w.Logger.Error("django-celery-beat write-back failed; retrying", "url", w.Source.redacted, "err", err)
			lastErr = err.Error()
		case err == nil:
			lastErr = ""
			if n > 0 {
				w.Logger.Debug("django-celery-beat write-back", "entries", n)
			}
		}
	}
}

// Once writes back the runs not yet written and returns how many entries
// it updated.
func (w *WriteBack) Once(ctx context.Context) (int, error) {
	if w.written == nil {
		w.written = map[string]time.Time{}
	}
	cfg := w.Merger.Current()
	if cfg == nil {
		return 0, nil
	}
	var names []string
	for _, e := range cfg.Entries {
		if e.Source == DCB && (w.Owns == nil || w.Owns(e.Name)) {
			names = append(names, e.Name)
		}
	}
	if len(names) == 0 {
		return 0, nil
	}
	hist, err := w.History.Histories(ctx, names)
	if err != nil {
		return 0, fmt.Errorf("read run history: %w", err)
	}
	updated := 0
	var errs []error
	for name, h := range hist {
		last := h.LastRunAt()
		if last.IsZero() || !last.After(w.written[name]) {
			continue
		}
		if err := w.write(ctx, name, h); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		w.written[name] = last
		updated++
	}
	return updated, errors.Join(errs...)
}

// write updates one row: the runs newer than its last_run_at are added.
func (w *WriteBack) write(ctx context.Context, name string, h outcome.EntryRuns) error {
	q := func(s string) string { return s }
	if !w.Source.sqlite {
		q = func(s string) string { return pgPlaceholders(s) }
	}
	var dbLast, oneOff any
	err := w.Source.db.QueryRowContext(ctx, q(`SELECT last_run_at, one_off FROM django_celery_beat_periodictask WHERE name = ?`), name).Scan(&dbLast, &oneOff)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	var since time.Time
	if dbLast != nil {
		if since, err = toTime(dbLast); err != nil {
			return err
		}
	}
	added := 0
	for _, r := range h.Runs {
		if r.PublishedAt.After(since) {
			added++
		}
	}
	if added == 0 {
		return nil
	}
	last := any(h.LastRunAt().UTC())
	if w.Source.sqlite {
		last = h.LastRunAt().UTC().Format("2006-01-02 15:04:05.000000") // as Django stores it
	}
	stmt, args := `UPDATE django_celery_beat_periodictask SET last_run_at = ?, total_run_count = total_run_count + ? WHERE name = ?`, []any{last, added, name}
	if once, _ := toBool(oneOff); once {
		// As dcb's own scheduler leaves a one-off after its run: disabled,
		// its count reset.
		stmt, args = `UPDATE django_celery_beat_periodictask SET last_run_at = ?, total_run_count = 0, enabled = false WHERE name = ?`, []any{last, name}
	}
	_, err = w.Source.db.ExecContext(ctx, q(stmt), args...)
	return err
}

// pgPlaceholders turns ? into $1, $2, ... (the statements here have no
// literal question marks).
func pgPlaceholders(s string) string {
	out := make([]byte, 0, len(s)+8)
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '?' {
			n++
			out = append(out, fmt.Sprintf("$%d", n)...)
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}
