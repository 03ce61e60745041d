package sources

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/config"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jonboulle/clockwork"
	_ "modernc.org/sqlite" // the "sqlite" driver, pure Go
)

// DCBSource reads django-celery-beat's tables, read-only, as entries: a
// PeriodicTask row becomes an entry of the same name, in the schema of
// schedules.yaml, so it is validated by the same rules. It reloads when
// dcb's change marker (django_celery_beat_periodictasks.last_update, which
// dcb bumps on every change) moves.
type DCBSource struct {
	db       *sql.DB
	sqlite   bool // placeholders are ? rather than $n
	redacted string
	interval time.Duration
	// Clock paces the polls and the write-back (OpenDCB sets the real
	// clock; the daemon sets its own).
	Clock clockwork.Clock
	// stale makes the next Poll read whatever the marker says: a shard's
	// read at the start of its term failed, so the set the merger holds
	// lacks that shard's entries (Stale).
	stale atomic.Bool
}

// Stale makes the next poll read the tables even if dcb's change marker
// has not moved.
func (d *DCBSource) Stale() { d.stale.Store(true) }

// sqlitePath is the database file of a sqlite:// URL: sqlite:///abs/path,
// and dj-database-url's and SQLAlchemy's sqlite:////abs/path, both name
// /abs/path.
func sqlitePath(u *url.URL) (string, error) {
	if u.Host != "" || !strings.HasPrefix(u.Path, "/") || strings.Trim(u.Path, "/") == "" {
		return "", fmt.Errorf("django-celery-beat source: want sqlite:///absolute/path (or sqlite:////absolute/path), got %q", u.Redacted())
	}
	return "/" + strings.TrimLeft(u.Path, "/"), nil
}

// OpenDCB opens postgres://... (or postgresql://) with pgx, or
// sqlite:///path with the pure-Go SQLite driver, read-only unless
// writeBack (see WriteBack).
func OpenDCB(rawURL string, poll time.Duration, writeBack bool) (*DCBSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("django-celery-beat source: bad URL: %w", err)
	}
	var db *sql.DB
	switch u.Scheme {
	case "postgres", "postgresql":
		q := u.Query()
		// Read-only on the server side too: beatd never writes there
		// without --source-write-back.
		if q.Get("default_transaction_read_only") == "" && !writeBack {
			q.Set("default_transaction_read_only", "on")
		}
		u.RawQuery = q.Encode()
		db, err = sql.Open("pgx", u.String())
	case "sqlite":
		path, err := sqlitePath(u)
		if err != nil {
			return nil, err
		}
		dsn := "file:" + path + "?mode=ro&_pragma=busy_timeout(5000)&_pragma=query_only(1)"
		if writeBack {
			dsn = "file:" + path + "?mode=rw&_pragma=busy_timeout(5000)"
		}
		db, err = sql.Open("sqlite", dsn)
	default:
		return nil, fmt.Errorf("django-celery-beat source: unsupported scheme %q (want postgres:// or sqlite:///path)", u.Scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("django-celery-beat source: %w", err)
	}
	db.SetMaxOpenConns(2)
	db.SetConnMaxIdleTime(time.Minute)
	if poll <= 0 {
		poll = 5 * time.Second
	}
	return &DCBSource{db: db, sqlite: u.Scheme == "sqlite", redacted: u.Redacted(), interval: poll, Clock: clockwork.NewRealClock()}, nil
}

// Close closes the database handle.
func (d *DCBSource) Close() error { return d.db.Close() }

// String is the source's URL without its password.
func (d *DCBSource) String() string { return d.redacted }

// Marker reads dcb's change marker ("" when dcb never wrote one).
func (d *DCBSource) Marker(ctx context.Context) (string, error) {
	var v any
	err := d.db.QueryRowContext(ctx, `SELECT last_update FROM django_celery_beat_periodictasks WHERE ident = 1`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the change marker: %w", err)
	}
	return fmt.Sprint(v), nil
}

const dcbQuery = `SELECT t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers,
	t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time, t.enabled, t.date_changed,
	t.solar_id, i.every, i.period,
	c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year, c.timezone,
	k.clocked_time, s.event, s.latitude, s.longitude
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id
LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id
LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id
ORDER BY t.name`

// Read returns every PeriodicTask as an entry document, and the rows that
// cannot become one with why; one bad row never hides the others.
func (d *DCBSource) Read(ctx context.Context) (map[string][]byte, map[string]string, error) {
	return d.read(ctx, dcbQuery, nil, nil)
}

// ReadPart is Read of the tasks whose names keep holds: the table is still
// read whole (a name's shard is not SQL), but only those rows become
// documents (a sharded replica's shard, at the start of its term).
func (d *DCBSource) ReadPart(ctx context.Context, keep func(name string) bool) (map[string][]byte, map[string]string, error) {
	return d.read(ctx, dcbQuery, nil, keep)
}

// ReadNames is Read of the tasks named, in one query by name (the
// definitions a sharded replica shows of a shard it does not lead).
func (d *DCBSource) ReadNames(ctx context.Context, names []string) (map[string][]byte, map[string]string, error) {
	if len(names) == 0 {
		return map[string][]byte{}, map[string]string{}, nil
	}
	q := strings.Replace(dcbQuery, "ORDER BY t.name", "WHERE t.name IN (?"+strings.Repeat(",?", len(names)-1)+")\nORDER BY t.name", 1)
	if !d.sqlite {
		q = pgPlaceholders(q)
	}
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	return d.read(ctx, q, args, nil)
}

// read runs query, a dcbQuery, with args, turning the rows whose names
// keep holds (nil: all) into documents.
func (d *DCBSource) read(ctx context.Context, query string, args []any, keep func(name string) bool) (map[string][]byte, map[string]string, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("read periodic tasks: %w", err)
	}
	defer rows.Close()
	docs, bad := map[string][]byte{}, map[string]string{}
	for rows.Next() {
		var r dcbRow
		if err := rows.Scan(&r.name, &r.task, &r.args, &r.kwargs, &r.queue, &r.exchange, &r.routingKey, &r.headers,
			&r.priority, &r.expires, &r.expireSeconds, &r.oneOff, &r.startTime, &r.enabled, &r.dateChanged,
			&r.solarID, &r.every, &r.period,
			&r.minute, &r.hour, &r.dayOfWeek, &r.dayOfMonth, &r.monthOfYear, &r.timezone,
			&r.clocked, &r.solarEvent, &r.latitude, &r.longitude); err != nil {
			return nil, nil, fmt.Errorf("read periodic tasks: %w", err)
		}
		if keep != nil && !keep(r.name) {
			continue
		}
		doc, err := r.entry()
		if err != nil {
			bad[r.name] = err.Error()
			continue
		}
		docs[r.name] = doc
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read periodic tasks: %w", err)
	}
	return docs, bad, nil
}

type dcbRow struct {
	name, task                               string
	args, kwargs, headers                    sql.NullString
	queue, exchange, routingKey              sql.NullString
	priority, expireSeconds, solarID, every  sql.NullInt64
	expires, startTime, dateChanged, clocked any
	oneOff, enabled                          any
	period                                   sql.NullString
	minute, hour, dayOfWeek, dayOfMonth      sql.NullString
	monthOfYear, timezone                    sql.NullString
	solarEvent                               sql.NullString
	latitude, longitude                      any // numeric: a string or a number, by driver
}

// dcbEntry is the entry document of a row; the field order is the
// document's.
type dcbEntry struct {
	Task     string            `json:"task"`
	Every    string            `json:"every,omitempty"`
	Crontab  map[string]string `json:"crontab,omitempty"`
	At       string            `json:"at,omitempty"`
	Solar    *dcbSolar         `json:"solar,omitempty"`
	Timezone string            `json:"timezone,omitempty"`
	StartAt  string            `json:"start_at,omitempty"`
	Enabled  bool              `json:"enabled"`
	Args     json.RawMessage   `json:"args,omitempty"`
	Kwargs   json.RawMessage   `json:"kwargs,omitempty"`
	Options  map[string]any    `json:"options,omitempty"`
}

type dcbSolar struct {
	Event string  `json:"event"`
	Lat   float64 `json:"lat"`
	Lon   float64 `json:"lon"`
}

// SolarSupported says whether the schedule package reads solar entries;
// until it does, dcb's solar tasks are reported invalid.
var SolarSupported = func() bool {
	_, err := (*config.Config)(nil).ParseEntry("probe", []byte(`{"task":"t","solar":{"event":"sunrise","lat":0,"lon":0}}`))
	return err == nil
}()

var periodUnit = map[string]time.Duration{"days": 24 * time.Hour, "hours": time.Hour, "minutes": time.Minute,
	"seconds": time.Second, "microseconds": time.Microsecond}

// entry maps a row to an entry document.
func (r *dcbRow) entry() ([]byte, error) {
	e := dcbEntry{Task: r.task, Options: map[string]any{}}
	enabled, err := toBool(r.enabled)
	if err != nil {
		return nil, fmt.Errorf("enabled: %w", err)
	}
	e.Enabled = enabled
	kinds := 0
	if r.every.Valid {
		kinds++
		unit, ok := periodUnit[r.period.String]
		if !ok {
			return nil, fmt.Errorf("interval period %q is not days, hours, minutes, seconds or microseconds", r.period.String)
		}
		if r.every.Int64 < 1 || r.every.Int64 > int64(1<<62)/int64(unit) {
			return nil, fmt.Errorf("interval every %d %s is out of range", r.every.Int64, r.period.String)
		}
		e.Every = (time.Duration(r.every.Int64) * unit).String()
	}
	if r.minute.Valid {
		kinds++
		e.Crontab = map[string]string{"minute": r.minute.String, "hour": r.hour.String,
			"day_of_week": r.dayOfWeek.String, "day_of_month": r.dayOfMonth.String, "month_of_year": r.monthOfYear.String}
		if tz := r.timezone.String; tz != "" {
			e.Timezone = tz
		}
	}
	if r.clocked != nil {
		kinds++
		t, err := toTime(r.clocked)
		if err != nil {
			return nil, fmt.Errorf("clocked_time: %w", err)
		}
		e.At = t.UTC().Format(time.RFC3339Nano)
	}
	if r.solarID.Valid {
		if !SolarSupported {
			return nil, errors.New("solar schedules are not supported by this beatd")
		}
		kinds++
		lat, err1 := toFloat(r.latitude)
		lon, err2 := toFloat(r.longitude)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("solar: %w", err)
		}
		e.Solar = &dcbSolar{Event: r.solarEvent.String, Lat: lat, Lon: lon}
	}
	if kinds != 1 {
		return nil, fmt.Errorf("needs exactly one of interval, crontab, clocked or solar, has %d", kinds)
	}
	if r.startTime != nil {
		t, err := toTime(r.startTime)
		if err != nil {
			return nil, fmt.Errorf("start_time: %w", err)
		}
		e.StartAt = t.UTC().Format(time.RFC3339Nano)
	}
	if e.Args, err = jsonText(r.args, "[", "args"); err != nil {
		return nil, err
	}
	if e.Kwargs, err = jsonText(r.kwargs, "{", "kwargs"); err != nil {
		return nil, err
	}
	headers, err := jsonText(r.headers, "{", "headers")
	if err != nil {
		return nil, err
	}
	if len(headers) > 0 && string(headers) != "{}" {
		e.Options["headers"] = headers
	}
	for k, v := range map[string]sql.NullString{"queue": r.queue, "exchange": r.exchange, "routing_key": r.routingKey} {
		if v.Valid && v.String != "" {
			e.Options[k] = v.String
		}
	}
	if r.priority.Valid {
		e.Options["priority"] = r.priority.Int64
	}
	switch { // dcb sends expires, else expire_seconds (only one may be set)
	case r.expires != nil:
		t, err := toTime(r.expires)
		if err != nil {
			return nil, fmt.Errorf("expires: %w", err)
		}
		e.Options["expires"] = t.UTC().Format(time.RFC3339Nano)
	case r.expireSeconds.Valid && r.expireSeconds.Int64 > 0:
		e.Options["expires"] = r.expireSeconds.Int64
	}
	oneOff, err := toBool(r.oneOff)
	if err != nil {
		return nil, fmt.Errorf("one_off: %w", err)
	}
	if oneOff && e.At == "" {
		// A one-off runs its schedule's first slot after the row last
		// changed (or its start_time), once: an at, stable until the row
		// changes again, so beatd's state keeps it from a second run.
		if err := r.oneOffSlot(&e); err != nil {
			return nil, err
		}
	}
	if len(e.Options) == 0 {
		e.Options = nil
	}
	return json.Marshal(e)
}

// oneOffSlot turns a one-off interval or crontab into an at.
func (r *dcbRow) oneOffSlot(e *dcbEntry) error {
	anchor, err := toTime(r.dateChanged)
	if err != nil {
		return fmt.Errorf("date_changed: %w", err)
	}
	probe := *e
	probe.Options, probe.Args, probe.Kwargs, probe.StartAt = nil, nil, nil, ""
	doc, _ := json.Marshal(probe)
	pe, err := (*config.Config)(nil).ParseEntry(r.name, doc)
	if err != nil {
		return err
	}
	if e.StartAt != "" {
		if st, _ := time.Parse(time.RFC3339Nano, e.StartAt); st.After(anchor) {
			anchor = st.Add(-time.Nanosecond)
		}
	}
	next := pe.Schedule.Next(anchor)
	if next.IsZero() {
		return errors.New("one_off: the schedule has no slot after the row's last change")
	}
	e.Every, e.Crontab, e.Solar, e.StartAt = "", nil, nil, ""
	e.At = next.UTC().Format(time.RFC3339Nano)
	return nil
}

// jsonText checks a JSON text column holds the kind of value wanted ("["
// or "{"), and returns it as written; empty means none.
func jsonText(v sql.NullString, open, what string) (json.RawMessage, error) {
	s := strings.TrimSpace(v.String)
	if !v.Valid || s == "" {
		return nil, nil
	}
	if !json.Valid([]byte(s)) || !strings.HasPrefix(s, open) {
		kind := "a JSON list"
		if open == "{" {
			kind = "a JSON object"
		}
		return nil, fmt.Errorf("%s must be %s, got %q", what, kind, truncate(s, 80))
	}
	return json.RawMessage(s), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// toTime reads a timestamp column: a time.Time (PostgreSQL, SQLite when
// the driver parses it) or SQLite's text. Naive times are UTC, as Django
// stores them with USE_TZ.
func toTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t, nil
	case []byte:
		return toTime(string(t))
	case string:
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999"} {
			if p, err := time.Parse(layout, t); err == nil {
				return p, nil
			}
		}
		return time.Time{}, fmt.Errorf("unreadable time %q", t)
	}
	return time.Time{}, fmt.Errorf("unreadable time %v (%T)", v, v)
}

// toFloat reads a numeric column.
func toFloat(v any) (float64, error) {
	switch f := v.(type) {
	case float64:
		return f, nil
	case int64:
		return float64(f), nil
	case []byte:
		return strconv.ParseFloat(string(f), 64)
	case string:
		return strconv.ParseFloat(f, 64)
	}
	return 0, fmt.Errorf("not a number: %v (%T)", v, v)
}

func toBool(v any) (bool, error) {
	switch b := v.(type) {
	case bool:
		return b, nil
	case int64:
		return b != 0, nil
	case []byte:
		return strconv.ParseBool(string(b))
	case string:
		return strconv.ParseBool(b)
	}
	return false, fmt.Errorf("not a boolean: %v (%T)", v, v)
}

// Poll reads the source when its marker moved since last (or always when
// last is nil), and feeds m. It returns the marker now in force.
func (d *DCBSource) Poll(ctx context.Context, m *Merger, last *string) (string, error) {
	marker, err := d.Marker(ctx)
	if err != nil {
		return "", err
	}
	if last != nil && marker == *last && !d.stale.Swap(false) {
		return marker, nil
	}
	docs, bad, err := d.Read(ctx)
	if err != nil {
		d.stale.Store(true)
		return "", err
	}
	if err := m.SetSourceRows(DCB, docs, bad); err != nil {
		return "", fmt.Errorf("apply django-celery-beat entries: %w", err)
	}
	return marker, nil
}

// Sync polls until ctx ends. A failure is reported (the last good set
// stays in use) and retried at the next poll.
func (d *DCBSource) Sync(ctx context.Context, m *Merger, synced bool, marker string) {
	t := d.Clock.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		qctx, cancel := context.WithTimeout(ctx, max(d.interval, 5*time.Second))
		var last *string
		if synced {
			last = &marker
		}
		next, err := d.Poll(qctx, m, last)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.SetError(DCB, fmt.Errorf("%s: %w", d.redacted, err))
			synced = false
			continue
		}
		marker, synced = next, true
	}
}
