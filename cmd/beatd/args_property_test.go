package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/migrate"
	"github.com/beatd/beatd/sources"
	"github.com/prometheus/client_golang/prometheus"
)

// TestArgumentsKeptOnEveryPath is the property that a document's task
// arguments reach the worker as written, whatever path brings them in:
// generated args and kwargs (nested lists and maps of integers beyond 64
// bits, floats such as 1.0, 2.5e2, -0.0 and 1e300 in several spellings,
// strings that look like numbers, unicode, booleans, nulls) go through
//
//   - schedules.yaml (config.Parse),
//   - PUT /api/v1/entries/NAME with a JSON body (the API handler, then
//     ParseEntry as the daemon's backend calls it),
//   - `beatd entries apply -f` of a YAML and of a JSON file (the CLI's
//     YAML-to-JSON conversion, POST /api/v1/entries, ParseEntry), and of
//     what `beatd entries list -o yaml` prints of the PUT documents,
//   - a django-celery-beat database (sources.DCBSource on SQLite: JSON
//     text columns to an entry document, ParseEntry),
//   - `beatd import` of a dumpdata file and of a celery_dump.py dump
//     (migrate.Parse, migrate.Convert: JSON to schedules.yaml text),
//
// and every path's Celery message is byte for byte the one compiled from
// the generated values themselves.
func TestArgumentsKeptOnEveryPath(t *testing.T) {
	t.Parallel()
	const docs = 300
	rng := rand.New(rand.NewPCG(47, 2026))
	gens := make([]argDoc, docs)
	for i := range gens {
		gens[i] = argDoc{name: fmt.Sprintf("p%03d", i), args: genList(rng, 0), kwargs: genMap(rng, 0)}
	}
	dir := t.TempDir()

	got := map[string]map[string]*config.Entry{} // path -> entry name -> entry
	add := func(path string, e *config.Entry) {
		if got[path] == nil {
			got[path] = map[string]*config.Entry{}
		}
		got[path][e.Name] = e
	}

	// schedules.yaml.
	var file strings.Builder
	file.WriteString("entries:\n")
	for _, d := range gens {
		fmt.Fprintf(&file, "  %s:\n    task: tasks.t\n    every: 10s\n    args: %s\n    kwargs: %s\n", d.name, yamlText(d.args, rng), yamlText(d.kwargs, rng))
	}
	cfg, err := config.Parse("schedules.yaml", []byte(file.String()))
	if err != nil {
		t.Fatalf("schedules.yaml: %v", err)
	}
	for _, e := range cfg.Entries {
		add("schedules.yaml", e)
	}

	// The entries API, with a backend that validates as the daemon's does.
	backend := &parsingEntries{}
	tokens, err := auth.New(auth.Options{Admin: "adm"})
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("adm\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler(api.Config{Backend: noStatus{}, Gatherer: prometheus.NewRegistry(), Entries: backend, Tokens: tokens}))
	t.Cleanup(srv.Close)
	for _, d := range gens {
		body := `{"task": "tasks.t", "every": "10s", "args": ` + jsonText(d.args, rng) + `, "kwargs": ` + jsonText(d.kwargs, rng) + `}`
		req, _ := http.NewRequest("PUT", srv.URL+"/api/v1/entries/"+d.name, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer adm")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT %s: %s (%v)\n%s", d.name, resp.Status, backend.errs, body)
		}
	}
	for _, e := range backend.take() {
		add("PUT JSON", e)
	}
	// What `entries list -o yaml` prints of them, applied back.
	code, listed, errs := runCLI(t, "entries", "list", "-o", "yaml", "--server", srv.URL, "--token-file", tokenFile)
	if code != 0 {
		t.Fatalf("entries list: exit %d: %s", code, errs)
	}
	listedYAML := filepath.Join(dir, "listed.yaml")

	// beatd entries apply -f, YAML and JSON.
	applyYAML := filepath.Join(dir, "apply.yaml")
	var applyJSON bytes.Buffer
	applyJSON.WriteString(`{"entries": {`)
	for i, d := range gens {
		if i > 0 {
			applyJSON.WriteString(",\n")
		}
		fmt.Fprintf(&applyJSON, `%q: {"task": "tasks.t", "every": "10s", "args": %s, "kwargs": %s}`, d.name, jsonText(d.args, rng), jsonText(d.kwargs, rng))
	}
	applyJSON.WriteString("}}\n")
	var applyY strings.Builder
	applyY.WriteString("entries:\n")
	for _, d := range gens {
		fmt.Fprintf(&applyY, "  %s: {task: tasks.t, every: 10s, args: %s, kwargs: %s}\n", d.name, yamlText(d.args, rng), yamlText(d.kwargs, rng))
	}
	for _, f := range []struct{ path, data string }{{listedYAML, listed}, {applyYAML, applyY.String()}, {applyYAML + ".json", applyJSON.String()}} {
		if err := os.WriteFile(f.path, []byte(f.data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct{ label, path string }{{"apply YAML", applyYAML}, {"apply JSON", applyYAML + ".json"}, {"list -o yaml, apply", listedYAML}} {
		if code, out, errs := runCLI(t, "entries", "apply", "-f", f.path, "--server", srv.URL, "--token-file", tokenFile); code != 0 {
			t.Fatalf("%s: exit %d: %s %s (%v)", f.label, code, out, errs, backend.errs)
		}
		for _, e := range backend.take() {
			add(f.label, e)
		}
	}

	// django-celery-beat: args and kwargs are JSON text columns.
	dbPath := filepath.Join(dir, "dcb.sqlite3")
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE django_celery_beat_intervalschedule (id INTEGER PRIMARY KEY, every INTEGER, period TEXT)`,
		`CREATE TABLE django_celery_beat_crontabschedule (id INTEGER PRIMARY KEY, minute TEXT, hour TEXT, day_of_week TEXT, day_of_month TEXT, month_of_year TEXT, timezone TEXT)`,
		`CREATE TABLE django_celery_beat_clockedschedule (id INTEGER PRIMARY KEY, clocked_time DATETIME)`,
		`CREATE TABLE django_celery_beat_solarschedule (id INTEGER PRIMARY KEY, event TEXT, latitude TEXT, longitude TEXT)`,
		`CREATE TABLE django_celery_beat_periodictask (id INTEGER PRIMARY KEY, name TEXT, task TEXT, args TEXT, kwargs TEXT,
			queue TEXT, exchange TEXT, routing_key TEXT, headers TEXT, priority INTEGER, expires DATETIME, expire_seconds INTEGER,
			one_off BOOL, start_time DATETIME, enabled BOOL, date_changed DATETIME, solar_id INTEGER, interval_id INTEGER,
			crontab_id INTEGER, clocked_id INTEGER)`,
		`INSERT INTO django_celery_beat_intervalschedule VALUES (1, 10, 'seconds')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range gens {
		if _, err := tx.Exec(`INSERT INTO django_celery_beat_periodictask (name, task, args, kwargs, headers, one_off, enabled, date_changed, interval_id)
			VALUES (?, 'tasks.t', ?, ?, '{}', 0, 1, '2026-12-01 00:00:00', 1)`, d.name, jsonText(d.args, rng), jsonText(d.kwargs, rng)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	dcb, err := sources.OpenDCB("sqlite:///"+dbPath, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	rows, bad, err := dcb.Read(context.Background())
	dcb.Close()
	if err != nil || len(bad) > 0 {
		t.Fatalf("dcb read: %v %v", err, bad)
	}
	for name, doc := range rows {
		e, err := (*config.Config)(nil).ParseEntry(name, doc)
		if err != nil {
			t.Fatalf("dcb row %s: %v\n%s", name, err, doc)
		}
		add("django-celery-beat", e)
	}

	// beatd import: a dumpdata file and a celery_dump.py dump.
	dump := []any{map[string]any{"model": "django_celery_beat.intervalschedule", "pk": 1, "fields": map[string]any{"every": 10, "period": "seconds"}}}
	var celeryDump strings.Builder
	celeryDump.WriteString(`{"source": "celery", "timezone": "UTC", "enable_utc": true, "entries": [`)
	for i, d := range gens {
		dump = append(dump, map[string]any{"model": "django_celery_beat.periodictask", "pk": i + 1, "fields": map[string]any{
			"name": d.name, "task": "tasks.t", "interval": 1, "args": jsonText(d.args, rng), "kwargs": jsonText(d.kwargs, rng),
			"enabled": true, "one_off": false, "headers": "{}"}})
		if i > 0 {
			celeryDump.WriteString(", ")
		}
		fmt.Fprintf(&celeryDump, `{"name": %q, "task": "tasks.t", "schedule": {"type": "interval", "seconds": 10}, "args": %s, "kwargs": %s}`,
			d.name, jsonText(d.args, rng), jsonText(d.kwargs, rng))
	}
	celeryDump.WriteString("]}")
	dumpdata, err := json.Marshal(dump)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []struct{ label, data string }{{"import dumpdata", string(dumpdata)}, {"import celery", celeryDump.String()}} {
		src, err := migrate.Parse(in.label, []byte(in.data))
		if err != nil {
			t.Fatalf("%s: %v", in.label, err)
		}
		res, err := migrate.Convert(src, migrate.Options{Now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			t.Fatalf("%s: %v", in.label, err)
		}
		if len(res.Skipped) > 0 {
			t.Errorf("%s: not imported: %v\n%s", in.label, res.Skipped, strings.Join(res.Warnings, "\n"))
		}
		for _, e := range res.Config.Entries {
			add(in.label, e)
		}
	}

	// Every path's message against the one compiled from the values.
	paths := []string{"schedules.yaml", "PUT JSON", "list -o yaml, apply", "apply YAML", "apply JSON", "django-celery-beat", "import dumpdata", "import celery"}
	slot := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	message := func(s *celery.Spec) (body, msg []byte, err error) {
		task, err := celery.Compile(s, "prop", "beatd@prop", "")
		if err != nil {
			return nil, nil, err
		}
		f := &celery.Fire{Task: task, Slot: slot}
		task.AssignID(f)
		// The whole Redis message (argsrepr and kwargsrepr included), but
		// for its random delivery tag.
		msg = deliveryTag.ReplaceAll(task.AppendMessage(nil, f, 1, slot), []byte(`"delivery_tag": ""`))
		return task.AMQPMessage(f, 1, slot).Body, msg, nil
	}
	failures := 0
	for _, d := range gens {
		base := got["schedules.yaml"][d.name]
		if base == nil {
			t.Fatalf("%s missing from schedules.yaml", d.name)
		}
		want := base.Spec()
		want.Args, want.Kwargs = d.args.value().([]any), d.kwargs.value().(*celery.Map)
		wantBody, wantMsg, err := message(want)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			e := got[p][d.name]
			if e == nil {
				t.Errorf("%s: %s missing", p, d.name)
				failures++
				continue
			}
			body, msg, err := message(e.Spec())
			if err != nil {
				t.Fatalf("%s: %s: %v", p, d.name, err)
			}
			if !bytes.Equal(body, wantBody) || !bytes.Equal(msg, wantMsg) {
				failures++
				if failures <= 5 {
					t.Errorf("%s: %s: body\n%s\nwant\n%s\n(args %s, kwargs %s)", p, d.name, body, wantBody, jsonText(d.args, rng), jsonText(d.kwargs, rng))
				}
			}
		}
	}
	if failures > 5 {
		t.Errorf("... %d differences in all", failures)
	}
}

var deliveryTag = regexp.MustCompile(`"delivery_tag": "[^"]*"`)

// argDoc is one generated document's arguments.
type argDoc struct {
	name   string
	args   *gval
	kwargs *gval
}

// gval is a generated value: a scalar with its literal spellings (a
// number may be written several ways, all meaning the same value), a
// list, or a map with unique keys.
type gval struct {
	kind  byte // 'n' null, 'b' bool, 'i' integer, 'f' float, 's' string, 'l' list, 'm' map
	v     any  // the Celery value of a scalar
	lits  []string
	items []*gval
	keys  []string
}

// value is the Celery value of g.
func (g *gval) value() any {
	switch g.kind {
	case 'l':
		out := make([]any, len(g.items))
		for i, it := range g.items {
			out[i] = it.value()
		}
		return out
	case 'm':
		m := &celery.Map{}
		for i, k := range g.keys {
			m.Set(k, g.items[i].value())
		}
		return m
	}
	return g.v
}

func genList(rng *rand.Rand, depth int) *gval {
	g := &gval{kind: 'l'}
	for range rng.IntN(6) {
		g.items = append(g.items, genValue(rng, depth+1))
	}
	return g
}

func genMap(rng *rand.Rand, depth int) *gval {
	g := &gval{kind: 'm'}
	seen := map[string]bool{}
	for range rng.IntN(6) {
		k := genString(rng)
		if seen[k] {
			continue
		}
		seen[k] = true
		g.keys = append(g.keys, k)
		g.items = append(g.items, genValue(rng, depth+1))
	}
	return g
}

func genValue(rng *rand.Rand, depth int) *gval {
	n := 9
	if depth >= 3 {
		n = 7 // scalars only
	}
	switch rng.IntN(n) {
	case 0:
		return &gval{kind: 'n', lits: []string{"null"}}
	case 1:
		b := rng.IntN(2) == 0
		return &gval{kind: 'b', v: b, lits: []string{strconv.FormatBool(b)}}
	case 2, 3:
		return genInt(rng)
	case 4, 5:
		return genFloat(rng)
	case 6:
		s := genString(rng)
		return &gval{kind: 's', v: s}
	case 7:
		return genList(rng, depth)
	default:
		return genMap(rng, depth)
	}
}

func genInt(rng *rand.Rand) *gval {
	bigs := []string{"9223372036854775808", "18446744073709551616", "123456789012345678901234567890",
		"-123456789012345678901234567890", "-9223372036854775809", "100000000000000000000000000000000000000001"}
	switch rng.IntN(4) {
	case 0:
		b, _ := new(big.Int).SetString(bigs[rng.IntN(len(bigs))], 10)
		return &gval{kind: 'i', v: b, lits: []string{b.String()}}
	case 1:
		special := []int64{0, 1, -1, 7, math.MaxInt64, math.MinInt64, 1<<53 + 1, 1000}
		i := special[rng.IntN(len(special))]
		lits := []string{strconv.FormatInt(i, 10)}
		if i == 0 {
			lits = append(lits, "-0") // Python's json reads -0 as 0, an int
		}
		return &gval{kind: 'i', v: i, lits: lits}
	default:
		i := rng.Int64N(2_000_001) - 1_000_000
		if rng.IntN(3) == 0 {
			i = int64(rng.Uint64())
		}
		return &gval{kind: 'i', v: i, lits: []string{strconv.FormatInt(i, 10)}}
	}
}

func genFloat(rng *rand.Rand) *gval {
	special := []struct {
		f   float64
		lit string
	}{{1.0, "1.0"}, {250, "2.5e2"}, {-0.0, "-0.0"}, {1e300, "1e300"}, {0, "0.0"}, {0.1, "0.1"}, {1e16, "1e16"},
		{1e-7, "1E-7"}, {5e-324, "5e-324"}, {math.MaxFloat64, "1.7976931348623157e308"}, {-1.5, "-1.5"},
		{1000, "1e3"}, {9007199254740992, "9007199254740993.0"}, {123.456, "123.456"}, {1e22, "1e+22"}}
	var f float64
	var lits []string
	switch rng.IntN(3) {
	case 0:
		s := special[rng.IntN(len(special))]
		f, lits = s.f, []string{s.lit}
		if s.lit == "-0.0" {
			f = math.Copysign(0, -1)
		}
	case 1:
		f = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(40)-20))
	default:
		for {
			f = math.Float64frombits(rng.Uint64())
			if !math.IsInf(f, 0) && !math.IsNaN(f) {
				break
			}
		}
	}
	// Other spellings of the same float, all floats to YAML and to JSON.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	lits = append(lits, e, strings.ToUpper(e))
	if fixed := strconv.FormatFloat(f, 'f', -1, 64); len(fixed) < 80 {
		if !strings.Contains(fixed, ".") {
			fixed += ".0"
		}
		lits = append(lits, fixed)
	}
	return &gval{kind: 'f', v: f, lits: lits}
}

// stringPool holds strings that other types would read as something
// else, or that need escaping somewhere.
var stringPool = []string{"1.0", "007", "1e3", "2.5e2", "0x1F", "-0", "123456789012345678901234567890", "true", "null", "~",
	"yes", "", " ", "a b", "#c", "k: v", "- x", "'q'", `"dq"`, `back\slash`, "tab\tnl\nend", "é", "日本語", "😀", "e\u0301",
	"\u0085nel", "line\u2028sep", "del\x7f", "c1\u0090", "\ufeffbom", "<&>", "nul\x00", "{a: 1}", "[1]", "*ref", "&anchor", "!tag",
	"%", "@", "`", "<<", ".inf", ".nan", "2026-01-01", "2026-01-01T00:00:00Z", "--- ", "...", "\r", "\u00a0nbsp"}

func genString(rng *rand.Rand) string {
	if rng.IntN(2) == 0 {
		return stringPool[rng.IntN(len(stringPool))]
	}
	ranges := [][2]rune{{0x20, 0x7e}, {0x20, 0x7e}, {0xa0, 0x17f}, {0x0300, 0x036f}, {0x4e00, 0x4e40}, {0x1f600, 0x1f64f}, {0, 0x1f}, {0x7f, 0x9f}, {0x2000, 0x206f}}
	var b strings.Builder
	for range rng.IntN(8) {
		r := ranges[rng.IntN(len(ranges))]
		b.WriteRune(r[0] + rng.Int32N(r[1]-r[0]+1))
	}
	return b.String()
}

// jsonText writes g as JSON, with a randomly chosen spelling of each
// number and either escaping of strings (Python's ensure_ascii, or raw
// UTF-8 as Go writes it).
func jsonText(g *gval, rng *rand.Rand) string {
	var b strings.Builder
	writeJSON(&b, g, rng)
	return b.String()
}

func writeJSON(b *strings.Builder, g *gval, rng *rand.Rand) {
	str := func(s string) {
		if rng.IntN(2) == 0 {
			b.Write(celery.AppendJSON(nil, s))
			return
		}
		out, _ := json.Marshal(s)
		b.Write(out)
	}
	switch g.kind {
	case 'l':
		b.WriteByte('[')
		for i, it := range g.items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeJSON(b, it, rng)
		}
		b.WriteByte(']')
	case 'm':
		b.WriteByte('{')
		for i, k := range g.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			str(k)
			b.WriteString(": ")
			writeJSON(b, g.items[i], rng)
		}
		b.WriteByte('}')
	case 's':
		str(g.v.(string))
	default:
		b.WriteString(g.lits[rng.IntN(len(g.lits))])
	}
}

// yamlText writes g as YAML flow: strings double-quoted, with escapes for
// what YAML does not carry as itself.
func yamlText(g *gval, rng *rand.Rand) string {
	var b strings.Builder
	writeYAML(&b, g, rng)
	return b.String()
}

func writeYAML(b *strings.Builder, g *gval, rng *rand.Rand) {
	switch g.kind {
	case 'l':
		b.WriteByte('[')
		for i, it := range g.items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeYAML(b, it, rng)
		}
		b.WriteByte(']')
	case 'm':
		b.WriteByte('{')
		for i, k := range g.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			yamlQuote(b, k)
			b.WriteString(": ")
			writeYAML(b, g.items[i], rng)
		}
		b.WriteByte('}')
	case 's':
		yamlQuote(b, g.v.(string))
	default:
		b.WriteString(g.lits[rng.IntN(len(g.lits))])
	}
}

func yamlQuote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7f, r >= 0xa0 && r < 0x2028, r > 0x2029 && r < 0xd800, r >= 0xe000 && r < 0xfeff,
			r > 0xfeff && r < 0xfffe, r > 0xffff && r <= utf8.MaxRune:
			b.WriteRune(r)
		default:
			fmt.Fprintf(b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
}

// parsingEntries is an entries backend that validates each document
// as the daemon's does (ParseEntry under the file's defaults, here none)
// and keeps the entries.
type parsingEntries struct {
	api.EntriesBackend
	mu      sync.Mutex
	entries []*config.Entry
	docs    map[string]json.RawMessage // the stored documents, as etcd keeps them
	errs    []error
}

// ListEntries returns every stored document, in one page.
func (p *parsingEntries) ListEntries(context.Context, api.ListQuery) (api.Page, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var page api.Page
	for name, doc := range p.docs {
		page.Entries = append(page.Entries, api.Entry{Name: name, Source: sources.API, Active: true, Spec: doc})
	}
	sort.Slice(page.Entries, func(i, j int) bool { return page.Entries[i].Name < page.Entries[j].Name })
	return page, nil
}

func (p *parsingEntries) PutEntries(_ context.Context, docs []api.EntryDoc, _ map[string]int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range docs {
		e, err := (*config.Config)(nil).ParseEntry(d.Name, d.Spec)
		if err != nil {
			p.errs = append(p.errs, fmt.Errorf("%s: %w\n%s", d.Name, err, d.Spec))
			return 0, err
		}
		p.entries = append(p.entries, e)
		if p.docs == nil {
			p.docs = map[string]json.RawMessage{}
		}
		p.docs[d.Name] = d.Spec
	}
	return 1, nil
}

func (p *parsingEntries) take() []*config.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.entries
	p.entries = nil
	return out
}

// noStatus is the API's status backend, unused here.
type noStatus struct{ api.Backend }
