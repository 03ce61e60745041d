package config

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // a minimal container image has no zoneinfo.

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/schedule"
	"gopkg.in/yaml.v3"
)

// CatchupPolicy says what a new leader does with slots missed while no
// leader was publishing.
type CatchupPolicy string

// Catch-up policies.
const (
	CatchupOnce CatchupPolicy = "once" // fire the latest missed slot once (Celery's behaviour)
	CatchupAll  CatchupPolicy = "all"  // fire every missed slot in order, up to MaxCatchup
	CatchupSkip CatchupPolicy = "skip" // fire none
)

// Defaults applied when neither the entry nor the file's defaults say.
const (
	DefaultCatchupWindow = time.Hour
	DefaultMaxCatchup    = 100
	DefaultQueue         = "celery"
)

// Config is a validated schedules.yaml.
type Config struct {
	File     string
	Timezone *time.Location
	Entries  []*Entry // sorted by name
	// AMQP says how the workers declare their queues, for an amqp:// broker.
	AMQP AMQPConfig
	// Calendars are the named day sets entries exclude, by name.
	Calendars map[string]*Calendar

	// defaults are the file's, kept so entries from other sources (see
	// ParseEntry) are read exactly as if they were in the file; opt, the
	// command line's settings it was read with, likewise.
	defaults *defaults
	opt      Options
}

// Entry returns the entry called name, or nil.
func (c *Config) Entry(name string) *Entry {
	i := sort.Search(len(c.Entries), func(i int) bool { return c.Entries[i].Name >= name })
	if i < len(c.Entries) && c.Entries[i].Name == name {
		return c.Entries[i]
	}
	return nil
}

// Following yields, in name order, the entries whose names come after
// after ("": from the first) and start with prefix: a page of a large
// config (the entries API's and /status's) without a scan from the start.
func (c *Config) Following(after, prefix string) iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		from := max(prefix, after)
		i := sort.Search(len(c.Entries), func(i int) bool { return c.Entries[i].Name >= from })
		for ; i < len(c.Entries); i++ {
			e := c.Entries[i]
			if e.Name == after {
				continue
			}
			if !strings.HasPrefix(e.Name, prefix) || !yield(e) {
				return
			}
		}
	}
}

// Entry is one periodic task.
type Entry struct {
	Name          string
	Task          string
	Schedule      schedule.Schedule
	Location      *time.Location
	Args          []any // nil, bool, int64, *big.Int, float64, string, []any, *Map
	Kwargs        *celery.Map
	Options       *celery.SendOptions // read-only: entries may share them
	Enabled       bool
	relative      bool   // every's grid is clock-aligned (read while decoding)
	definedAt     uint32 // defined_at's Unix second, 0: unknown (DefinedBy); in the bools' padding
	Catchup       CatchupPolicy
	CatchupWindow time.Duration
	Jitter        time.Duration
	// Overlap is what a slot does while the previous run is unfinished;
	// PauseAfterFailures (0: never) pauses the entry after that many
	// failed runs in a row.
	Overlap OverlapPolicy
	// MaxCatchup and PauseAfterFailures are int32, side by side, for the
	// Entry's size (see Line).
	MaxCatchup         int32
	PauseAfterFailures int32
	// limits holds what few entries set (nil: none of it); see Limits.
	limits *Limits
	// Line and Column are where the entry's name is in its file (int32:
	// a million entries are held at once, and the fields here are sized
	// so that an Entry fits a 208-byte allocation).
	Line, Column int32
	// Source names where the entry came from: "" or "file" for
	// schedules.yaml, "api", "django-celery-beat".
	Source string
	// Fingerprint changes whenever anything that shapes the entry's slots
	// or messages changes, in the entry or in the defaults it inherits:
	// the first half of a SHA-256, as unlikely to collide for one entry's
	// two versions as the whole.
	Fingerprint [16]byte
}

// Limits are the fields that bound an entry's runs: most entries set
// none, so an Entry points at them rather than holding their 80 bytes (at
// a million entries, 80 MB).
type Limits struct {
	// StartAt (start_at) is when the entry's first slot may fall, and an
	// interval's anchor.
	StartAt time.Time
	// EndAt (end_at) is when the entry's last slot may fall; MaxRuns
	// (max_runs, 0: no limit) how many scheduled runs it makes in all.
	// Past either the entry is finished, not failing.
	EndAt   time.Time
	MaxRuns int
	// Exclude are the calendars whose days the entry skips, read in its
	// zone.
	Exclude []*Calendar
	// OverlapTimeout (0: see OverlapDeadline) is how long an unfinished
	// run blocks the overlap policy.
	OverlapTimeout time.Duration
}

func (l *Limits) zero() bool {
	return l.StartAt.IsZero() && l.EndAt.IsZero() && l.MaxRuns == 0 && len(l.Exclude) == 0 && l.OverlapTimeout == 0
}

// noLimits stands for an entry's nil limits.
var noLimits Limits

func (e *Entry) lim() *Limits {
	if e.limits == nil {
		return &noLimits
	}
	return e.limits
}

// StartAt is start_at, zero when not set.
func (e *Entry) StartAt() time.Time { return e.lim().StartAt }

// EndAt is end_at, zero when not set.
func (e *Entry) EndAt() time.Time { return e.lim().EndAt }

// MaxRuns is max_runs, 0 for no limit.
func (e *Entry) MaxRuns() int { return e.lim().MaxRuns }

// Exclude are the calendars whose days the entry skips.
func (e *Entry) Exclude() []*Calendar { return e.lim().Exclude }

// OverlapTimeout is overlap_timeout, 0 when not set.
func (e *Entry) OverlapTimeout() time.Duration { return e.lim().OverlapTimeout }

// Error is one problem in a config file, at a position.
type Error struct {
	File         string
	Line, Column int
	Msg          string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Errors is every problem found in a config file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// LoadFile reads and validates a schedules.yaml with the default Options.
func LoadFile(path string) (*Config, error) {
	return LoadFileWith(path, Options{})
}

// LoadFileWith reads and validates a schedules.yaml with opt.
func LoadFileWith(path string, opt Options) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: read: %w", err)
	}
	return ParseWith(path, data, opt)
}

// Parse validates a schedules.yaml with the default Options. On failure
// the error is an Errors holding every problem found, each as
// FILE:LINE:COL: message.
func Parse(file string, data []byte) (*Config, error) {
	return ParseWith(file, data, Options{})
}

// ParseWith is Parse with opt; the Config keeps opt for the entries
// ParseEntry reads under it.
func ParseWith(file string, data []byte, opt Options) (*Config, error) {
	return parseKeeping(file, data, opt, nil)
}

// parseKeeping is ParseWith building only the entries whose names keep
// holds (nil: every one); the others are checked for a name, and left
// unparsed.
func parseKeeping(file string, data []byte, opt Options, keep func(name string) bool) (*Config, error) {
	if err := CheckMinInterval(opt.MinInterval); err != nil {
		return nil, err
	}
	d := &decoder{file: file, opt: opt, keep: keep}
	cfg := d.parse(data)
	if cfg != nil {
		cfg.opt = opt
	}
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool {
			a, b := d.errs[i], d.errs[j]
			return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
		})
		return nil, d.errs
	}
	return cfg, nil
}

type decoder struct {
	file  string
	opt   Options
	errs  Errors
	seen  map[string]int // entry name -> line; nil for one entry's document
	whole bool           // never chunk (tests compare both ways)
	// plain holds, per zone, the options of entries that set none of
	// their own: shared, because most entries of a large schedule have
	// the defaults' options, and a copy each weighs 144 bytes.
	plain map[*time.Location]*celery.SendOptions
	// shared, when set, are the defaults whose options cache outlives
	// the decoder (ParseEntry's).
	shared *defaults
	// keep, when set, names the entries to build; the others are skipped
	// once their names are checked (CheckPart).
	keep func(name string) bool
}

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	line, col := 1, 1
	if n != nil {
		line, col = n.Line, n.Column
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)})
}

// The schema lives here: the keys each mapping accepts. A new field is
// added to these lists and decoded in (*decoder).entry.
var (
	topKeys     = []string{"timezone", "defaults", "entries", "amqp", "calendars"}
	defaultKeys = []string{"options", "catchup", "catchup_window", "max_catchup", "jitter", "enabled",
		"overlap", "overlap_timeout", "pause_after_failures"}
	entryKeys = []string{"task", "crontab", "cron", "every", "at", "start_at", "args", "kwargs",
		"options", "timezone", "enabled", "catchup", "catchup_window", "max_catchup", "jitter", "relative", "solar",
		"overlap", "overlap_timeout", "pause_after_failures", "end_at", "max_runs", "exclude",
		"chain", "link", "link_error"}
	scheduleKeys = []string{"crontab", "cron", "every", "at", "solar"}
	optionKeys   = []string{"queue", "exchange", "routing_key", "priority", "expires", "late_slot_expires", "headers",
		"time_limit", "soft_time_limit", "ignore_result"}
	crontabKeys = []string{"minute", "hour", "day_of_week", "day_of_month", "month_of_year"}
)

// field is a key and its value node.
type field struct {
	key, val *yaml.Node
}

// fieldSet is a mapping's fields, in the mapping's order. A mapping has
// a handful, so a scan finds one as fast as a map would, and a map was
// 30% of what a runtime entry's parse allocated.
type fieldSet []field

// get returns the field named name.
func (s fieldSet) get(name string) (field, bool) {
	for _, f := range s {
		if f.key.Value == name {
			return f, true
		}
	}
	return field{}, false
}

// val is the value of the field named name, nil when there is none.
func (s fieldSet) val(name string) *yaml.Node {
	f, _ := s.get(name)
	return f.val
}

// fields checks that n is a mapping with known, unique string keys and
// returns them (nil after an error about n itself).
func (d *decoder) fields(n *yaml.Node, what string, allowed []string) fieldSet {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return fieldSet{}
		}
		d.errorf(n, "%s must be a mapping", what)
		return nil
	}
	out := make(fieldSet, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(allowed, k.Value) {
			d.errorf(k, "unknown key %q in %s (allowed: %s)", k.Value, what, strings.Join(allowed, ", "))
			continue
		}
		if prev, dup := out.get(k.Value); dup {
			d.errorf(k, "duplicate key %q in %s (first at line %d)", k.Value, what, prev.key.Line)
			continue
		}
		out = append(out, field{k, v})
	}
	return out
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

type defaults struct {
	hash          [32]byte // of the top-level timezone and defaults, part of every fingerprint
	options       fieldSet
	catchup       CatchupPolicy
	catchupWindow time.Duration
	maxCatchup    int32
	jitter        time.Duration
	enabled       bool
	run           runPolicy
	calendars     map[string]*Calendar
	// plain holds, per zone, the options of entries that set none of
	// their own, across every entry parsed with these defaults: the
	// entries API parses each entry on its own, and a million entries
	// would otherwise hold a million equal copies (~150 bytes each).
	plain sync.Map // *time.Location -> *celery.SendOptions
}

// chunkThreshold is the config size from which entries are parsed in
// chunks: a yaml.Node tree weighs about 25 times the text, so a 100k-entry
// file would otherwise need hundreds of MiB at once.
const chunkThreshold = 256 << 10

func (d *decoder) parse(data []byte) *Config {
	if len(data) >= chunkThreshold && !d.whole {
		if cfg, ok := d.parseChunked(data); ok {
			return cfg
		}
		d.errs = nil // fall back: the whole-file parse reports exactly
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.yamlError(err)
		return nil
	}
	if !d.aliases(&doc) {
		return nil
	}
	cfg, def, en := d.header(&doc)
	if en == nil {
		return cfg
	}
	d.entries(en, cfg, def)
	d.finish(cfg)
	return cfg
}

// aliases refuses a document whose aliases expand it too far (see
// CheckAliases), before anything walks it.
func (d *decoder) aliases(doc *yaml.Node) bool {
	if err := CheckAliases(d.file, doc); err != nil {
		d.errs = append(d.errs, err.(*Error))
		return false
	}
	return true
}

// header decodes everything but the entries and returns the entries node
// (nil when absent or empty).
func (d *decoder) header(doc *yaml.Node) (*Config, *defaults, *yaml.Node) {
	if doc.Kind == 0 || len(doc.Content) == 0 {
		d.errorf(nil, "empty config: want a mapping with an entries key")
		return nil, nil, nil
	}
	top := d.fields(doc.Content[0], "the config", topKeys)
	if top == nil {
		return nil, nil, nil
	}
	cfg := &Config{File: d.file, Timezone: time.UTC}
	h := sha256.New()
	if f, ok := top.get("timezone"); ok {
		if loc := d.zone(f.val); loc != nil {
			cfg.Timezone = loc
		}
	}
	h.Write([]byte(cfg.Timezone.String()))
	var buf []byte
	if f, ok := top.get("amqp"); ok {
		cfg.AMQP = d.amqp(f.val)
	}
	def := &defaults{catchup: CatchupOnce, catchupWindow: DefaultCatchupWindow, maxCatchup: DefaultMaxCatchup, enabled: true,
		run: runPolicy{overlap: OverlapAllow}}
	if f, ok := top.get("defaults"); ok {
		buf = appendNodeHash(buf[:0], f.val, "")
		h.Write(buf)
		df := d.fields(f.val, "defaults", defaultKeys)
		if o, ok := df.get("options"); ok {
			def.options = d.fields(o.val, "defaults.options", optionKeys)
		}
		d.policyFields(df, &def.catchup, &def.catchupWindow, &def.maxCatchup, &def.jitter, &def.enabled)
		d.runPolicyFields(df, &def.run)
	}
	if f, ok := top.get("calendars"); ok {
		buf = appendNodeHash(buf[:0], f.val, "")
		h.Write(buf)
		def.calendars = d.calendars(f.val)
		cfg.Calendars = def.calendars
	}
	h.Sum(def.hash[:0])
	cfg.defaults = def
	d.seen = map[string]int{}
	ef, ok := top.get("entries")
	if !ok {
		d.errorf(doc.Content[0], "missing key entries")
		return cfg, def, nil
	}
	en := deref(ef.val)
	if en.Kind != yaml.MappingNode {
		if !(en.Kind == yaml.ScalarNode && en.Tag == "!!null") {
			d.errorf(en, "entries must be a mapping from entry name to entry")
		}
		return cfg, def, nil
	}
	return cfg, def, en
}

// entries decodes a mapping of entries into cfg.
func (d *decoder) entries(en *yaml.Node, cfg *Config, def *defaults) {
	for i := 0; i+1 < len(en.Content); i += 2 {
		k, v := en.Content[i], en.Content[i+1]
		name := k.Value
		if k.Kind != yaml.ScalarNode || strings.TrimSpace(name) == "" {
			d.errorf(k, "entry name must be a non-empty string")
			continue
		}
		if err := CheckEntryName(name); err != nil {
			d.errorf(k, "%v", err)
			continue
		}
		if d.seen != nil {
			if line, dup := d.seen[name]; dup {
				d.errorf(k, "duplicate entry %q (first at line %d)", name, line)
				continue
			}
			d.seen[name] = k.Line
		}
		if d.keep != nil && !d.keep(name) {
			continue
		}
		if e := d.entry(name, k, v, cfg.Timezone, def); e != nil {
			cfg.Entries = append(cfg.Entries, e)
		}
	}
}

func (d *decoder) finish(cfg *Config) {
	sort.Slice(cfg.Entries, func(i, j int) bool { return cfg.Entries[i].Name < cfg.Entries[j].Name })
}

// appendNodeHash appends a node's content (not its position) to buf, the
// bytes an entry's fingerprint hashes, so it changes exactly when what
// the entry says changes. A key skip at the top mapping is left out, as if
// absent (defined_at: when a definition was written is not what it says).
// Appending to one buffer, hashed once, rather than writing each string to
// a hash.Hash: each Write converted its string to a fresh []byte, a
// tenth of a runtime entry's parse garbage.
func appendNodeHash(buf []byte, n *yaml.Node, skip string) []byte {
	n = deref(n)
	if n == nil {
		return buf
	}
	content := len(n.Content)
	if skip != "" && n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == skip {
				content -= 2
			}
		}
	}
	buf = append(buf, byte(n.Kind))
	buf = append(buf, n.Tag...)
	buf = append(buf, 0)
	buf = append(buf, n.Value...)
	buf = append(buf, 0, byte(content), byte(content>>8))
	for i := 0; i < len(n.Content); i++ {
		if skip != "" && n.Kind == yaml.MappingNode && i%2 == 0 && i+1 < len(n.Content) && n.Content[i].Value == skip {
			i++
			continue
		}
		buf = appendNodeHash(buf, n.Content[i], "")
	}
	return buf
}

// yamlError turns yaml.v3's "yaml: line N: msg" into a positioned error.
func (d *decoder) yamlError(err error) {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) {
		for _, m := range te.Errors {
			d.yamlError(errors.New(m))
		}
		return
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ":"); ok {
			if v, err := strconv.Atoi(num); err == nil {
				line, msg = v, strings.TrimSpace(tail)
			}
		}
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Column: 1, Msg: "invalid YAML: " + msg})
}

func (d *decoder) policyFields(f fieldSet, catchup *CatchupPolicy, window *time.Duration, maxCatchup *int32, jitter *time.Duration, enabled *bool) {
	if v, ok := f.get("catchup"); ok {
		switch p := CatchupPolicy(scalar(v.val)); p {
		case CatchupOnce, CatchupAll, CatchupSkip:
			*catchup = p
		default:
			d.errorf(v.val, "catchup must be once, all or skip, got %q", scalar(v.val))
		}
	}
	if v, ok := f.get("catchup_window"); ok {
		if dur, ok := d.duration(v.val, "catchup_window", false); ok {
			*window = dur
		}
	}
	if v, ok := f.get("max_catchup"); ok {
		if n, ok := d.integer(v.val, "max_catchup"); ok {
			if n < 1 || n > 100000 {
				d.errorf(v.val, "max_catchup must be between 1 and 100000, got %d", n)
			} else {
				*maxCatchup = int32(n)
			}
		}
	}
	if v, ok := f.get("jitter"); ok {
		if dur, ok := d.duration(v.val, "jitter", true); ok {
			*jitter = dur
		}
	}
	if v, ok := f.get("enabled"); ok {
		if b, ok := d.boolean(v.val, "enabled"); ok {
			*enabled = b
		}
	}
}

func scalar(n *yaml.Node) string {
	n = deref(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

func (d *decoder) entry(name string, key, n *yaml.Node, defLoc *time.Location, def *defaults) *Entry {
	before := len(d.errs)
	var hashBuf [512]byte // on the stack: a runtime entry's hash input fits
	fingerprint := sha256.Sum256(appendNodeHash(append(hashBuf[:0], def.hash[:]...), n, definedAtKey))
	allowed := entryKeys
	if d.file == docFile {
		allowed = docEntryKeys
	}
	f := d.fields(n, fmt.Sprintf("entry %q", name), allowed)
	if f == nil {
		return nil
	}
	e := &Entry{Name: name, Location: defLoc, Line: int32(key.Line), Column: int32(key.Column),
		Catchup: def.catchup, CatchupWindow: def.catchupWindow, MaxCatchup: def.maxCatchup,
		Jitter: def.jitter, Enabled: def.enabled}
	if v, ok := f.get("task"); ok {
		e.Task = internTask(scalar(v.val))
		if deref(v.val).Tag != "!!str" || strings.TrimSpace(e.Task) == "" {
			d.errorf(v.val, "task must be a non-empty string naming a Celery task")
		}
	} else {
		d.errorf(key, "entry %q: missing key task", name)
	}
	if v, ok := f.get("timezone"); ok {
		if loc := d.zone(v.val); loc != nil {
			e.Location = loc
		}
	}
	d.policyFields(f, &e.Catchup, &e.CatchupWindow, &e.MaxCatchup, &e.Jitter, &e.Enabled)
	run := def.run
	d.runPolicyFields(f, &run)
	e.Overlap, e.PauseAfterFailures = run.overlap, run.pauseAfter
	lim := Limits{OverlapTimeout: run.overlapTimeout}
	if v, ok := f.get(definedAtKey); ok {
		e.definedAt = d.definedAt(v.val)
	}
	if v, ok := f.get("start_at"); ok {
		lim.StartAt, _ = d.timestamp(v.val, "start_at", e.Location)
	}
	if v, ok := f.get("end_at"); ok {
		if t, ok := d.timestamp(v.val, "end_at", e.Location); ok {
			lim.EndAt = t
			if !lim.StartAt.IsZero() && !t.After(lim.StartAt) {
				d.errorf(v.val, "entry %q: end_at %s is not after start_at %s", name, t.Format(time.RFC3339), lim.StartAt.Format(time.RFC3339))
			}
		}
	}
	if v, ok := f.get("exclude"); ok {
		lim.Exclude = d.exclude(v.val, name, def)
	}
	if v, ok := f.get("max_runs"); ok {
		if n, ok := d.integer(v.val, "max_runs"); ok {
			if n < 1 {
				d.errorf(v.val, "entry %q: max_runs must be at least 1, got %d (leave it out for no limit)", name, n)
			} else {
				lim.MaxRuns = n
			}
		}
	}
	if !lim.zero() {
		kept := lim // lim itself stays on the stack: most entries have none
		e.limits = &kept
	}
	if v, ok := f.get("relative"); ok {
		e.relative, _ = d.boolean(v.val, "relative")
		if _, every := f.get("every"); !every {
			d.errorf(v.key, "entry %q: relative applies only to every", name)
		}
	}
	holes := 0
	if v, ok := f.get("args"); ok {
		if n := deref(v.val); n.Kind == yaml.SequenceNode {
			if val, ok := d.value(n); ok {
				e.Args = val.([]any)
			}
			holes += d.placeholders(n, 0)
		} else if !(n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
			d.errorf(n, "args must be a list")
		}
	}
	if v, ok := f.get("kwargs"); ok {
		if n := deref(v.val); n.Kind == yaml.MappingNode {
			if val, ok := d.value(n); ok {
				e.Kwargs = val.(*celery.Map)
			}
			holes += d.placeholders(n, 0)
		} else if !(n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
			d.errorf(n, "kwargs must be a mapping")
		}
	}
	var entryOpts fieldSet
	if v, ok := f.get("options"); ok {
		entryOpts = d.fields(v.val, fmt.Sprintf("entry %q options", name), optionKeys)
	}
	e.Options = d.entryOptions(def.options, entryOpts, e.Location)
	canvas, stepHoles := d.canvas(f, name)
	holes += stepHoles
	if e.Options.Templated { // its headers, the defaults' included
		holes += celery.CountPlaceholders(e.Options.Headers)
	}
	if canvas != nil || holes > 0 {
		o := *e.Options // shared: the entry's own copy carries them
		o.Canvas, o.Templated = canvas, o.Templated || holes > 0
		e.Options = &o
	}
	if holes > maxPlaceholders {
		d.errorf(key, "entry %q: %d placeholders in its args, kwargs, headers and steps; at most %d render at each fire", name, holes, maxPlaceholders)
	}
	d.valueSize(e, key, f, holes)

	var kinds []field
	for _, k := range scheduleKeys {
		if v, ok := f.get(k); ok {
			kinds = append(kinds, v)
		}
	}
	sort.Slice(kinds, func(i, j int) bool {
		return kinds[i].key.Line < kinds[j].key.Line ||
			kinds[i].key.Line == kinds[j].key.Line && kinds[i].key.Column < kinds[j].key.Column
	})
	switch len(kinds) {
	case 0:
		d.errorf(key, "entry %q: needs exactly one of crontab, cron, every, at or solar", name)
	case 1:
		e.Schedule = d.schedule(kinds[0], e)
	default:
		d.errorf(kinds[1].key, "entry %q: %s and %s both given; use exactly one of crontab, cron, every, at or solar",
			name, kinds[0].key.Value, kinds[1].key.Value)
		for _, k := range kinds {
			d.schedule(k, e) // report problems inside each value as well
		}
	}
	if len(d.errs) > before {
		return nil
	}
	copy(e.Fingerprint[:], fingerprint[:])
	return e
}

// valueSize refuses an entry whose args, kwargs and headers together
// take more than MaxValueBytes in its messages, at the largest of them.
func (d *decoder) valueSize(e *Entry, key *yaml.Node, f fieldSet, holes int) {
	parts := []struct {
		name string
		v    any
	}{{"args", e.Args}, {"kwargs", e.Kwargs}, {"options", e.Options.Headers}, {"chain", e.Options.Canvas}}
	// What the placeholders may add when they render.
	total, largest, at := holes*placeholderGrowth(e.Name), -1, key
	for _, p := range parts {
		var n int
		if c, ok := p.v.(*celery.Canvas); ok {
			n = c.EmbedSize(MaxValueBytes - total)
		} else {
			n = celery.JSONSize(p.v, MaxValueBytes-total)
		}
		total += n
		if n > largest {
			largest = n
			if fv, ok := f.get(p.name); ok {
				at = fv.val
			} else {
				at = key
			}
		}
		if total > MaxValueBytes {
			d.errorf(at, "entry %q: args, kwargs, headers and the chain's steps take more than %d bytes (%d KiB) as JSON: a message carries arguments, not data",
				e.Name, MaxValueBytes, MaxValueBytes>>10)
			return
		}
	}
}

func (d *decoder) schedule(f field, e *Entry) schedule.Schedule {
	n := deref(f.val)
	var s schedule.Schedule
	switch f.key.Value {
	case "crontab":
		s = d.crontab(n, e.Location, e.Name)
	case "cron":
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			d.errorf(n, "cron must be a string such as \"15 3 * * 1-5\" or \"@daily\"")
			return nil
		}
		c, err := schedule.ParseCronFor(n.Value, e.Name, e.Location)
		if err != nil {
			d.errorf(n, "%v", err)
			return nil
		}
		s = c
	case "every":
		dur, ok := d.duration(n, "every", false)
		if !ok {
			return nil
		}
		if floor := d.opt.minInterval(); dur < floor {
			d.errorf(n, "every: %s is below the minimum interval, %s (beatd run --min-interval sets it, down to %s)", dur, floor, MinIntervalLowest)
			return nil
		}
		ev, err := schedule.NewEvery(dur, e.StartAt())
		if err != nil {
			d.errorf(n, "%v", err)
			return nil
		}
		ev.Relative = e.relative
		return ev // start_at is the anchor, not a floor
	case "solar":
		s = d.solar(n)
	case "at":
		t, ok := d.timestamp(n, "at", e.Location)
		if !ok {
			return nil
		}
		s = &schedule.At{Time: t}
	}
	if start := e.StartAt(); s != nil && !start.IsZero() {
		s = &schedule.NotBefore{Schedule: s, Start: start}
	}
	return s
}

// crontab reads Celery's crontab, a string or a mapping of its fields, for
// the entry called name (whose hash an H in a field resolves with).
func (d *decoder) crontab(n *yaml.Node, loc *time.Location, name string) schedule.Schedule {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		c, err := schedule.ParseCrontabFor(n.Value, name, loc)
		if err != nil {
			d.errorf(n, "%v", err)
			return nil
		}
		return c
	}
	f := d.fields(n, "crontab", crontabKeys)
	if f == nil {
		return nil
	}
	var masks [5]uint64
	ok, spread := true, false
	for fi := schedule.Minute; fi <= schedule.MonthOfYear; fi++ {
		v, present := f.get(fi.String())
		if !present {
			masks[fi], _ = schedule.ParseCrontabField(fi, "*")
			continue
		}
		m, good := d.crontabField(fi, deref(v.val), name)
		masks[fi] = m
		ok = ok && good
		spread = spread || hasSpread(deref(v.val))
	}
	if !ok {
		return nil
	}
	c, err := schedule.NewCrontab(masks, loc)
	if err != nil {
		d.errorf(n, "%v", err)
		return nil
	}
	if spread {
		c.WithSpread()
	}
	return c
}

// hasSpread says whether a crontab field's string, or a string in its list,
// has an H part.
func hasSpread(n *yaml.Node) bool {
	if n.Kind == yaml.SequenceNode {
		return slices.ContainsFunc(n.Content, func(c *yaml.Node) bool { return hasSpread(deref(c)) })
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return false
	}
	for _, p := range strings.Split(n.Value, ",") {
		if strings.HasPrefix(p, "H") {
			return true
		}
	}
	return false
}

// crontabField accepts Celery's forms: an int, a string, or a list of them;
// an H in a string is resolved for the entry called name.
func (d *decoder) crontabField(fi schedule.CrontabField, n *yaml.Node, name string) (uint64, bool) {
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!int":
			v, err := strconv.Atoi(n.Value)
			if err != nil {
				d.errorf(n, "%s: %q is not an integer", fi, n.Value)
				return 0, false
			}
			m, err := schedule.CheckCrontabValue(fi, v)
			if err != nil {
				d.errorf(n, "crontab %v", err)
				return 0, false
			}
			return m, true
		case "!!str":
			spec, _, err := schedule.ResolveCrontabField(fi, n.Value, name)
			if err != nil {
				d.errorf(n, "%v", err)
				return 0, false
			}
			m, err := schedule.ParseCrontabField(fi, spec)
			if err != nil {
				d.errorf(n, "crontab %v", err)
				return 0, false
			}
			return m, true
		}
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			d.errorf(n, "crontab %s: empty list never matches", fi)
			return 0, false
		}
		var acc uint64
		ok := true
		for _, c := range n.Content {
			m, good := d.crontabField(fi, deref(c), name)
			if c.Kind == yaml.SequenceNode {
				d.errorf(c, "crontab %s: nested lists are not allowed", fi)
				good = false
			}
			acc |= m
			ok = ok && good
		}
		return acc, ok
	}
	d.errorf(n, "crontab %s must be an int, a string or a list", fi)
	return 0, false
}

// entryOptions are an entry's options: own over the defaults' def. Entries
// must treat them as read-only, since they may be shared.
func (d *decoder) entryOptions(def, own fieldSet, loc *time.Location) *celery.SendOptions {
	if len(own) > 0 {
		o := d.options(def, own, loc)
		return &o
	}
	if o, ok := d.plain[loc]; ok {
		return o
	}
	if d.shared != nil {
		if o, ok := d.shared.plain.Load(loc); ok {
			return o.(*celery.SendOptions)
		}
	}
	errs := len(d.errs)
	o := d.options(def, nil, loc)
	if len(d.errs) > errs {
		return &o // reported once per entry, as without sharing
	}
	if d.plain == nil {
		d.plain = map[*time.Location]*celery.SendOptions{}
	}
	d.plain[loc] = &o
	if d.shared != nil {
		d.shared.plain.Store(loc, &o)
	}
	return &o
}

func (d *decoder) options(def, own fieldSet, loc *time.Location) celery.SendOptions {
	o := celery.SendOptions{Queue: DefaultQueue}
	get := func(k string) (field, bool) {
		if f, ok := own.get(k); ok {
			return f, true
		}
		f, ok := def.get(k)
		return f, ok
	}
	str := func(k string, dst *string) {
		if f, ok := get(k); ok {
			n := deref(f.val)
			if n.Kind != yaml.ScalarNode || n.Tag != "!!str" || n.Value == "" {
				d.errorf(n, "options.%s must be a non-empty string", k)
				return
			}
			*dst = n.Value
		}
	}
	str("queue", &o.Queue)
	_, o.QueueSet = get("queue")
	str("exchange", &o.Exchange)
	str("routing_key", &o.RoutingKey)
	if f, ok := get("priority"); ok {
		if p, ok := d.integer(f.val, "options.priority"); ok {
			if p < 0 || p > 9 {
				d.errorf(f.val, "options.priority must be between 0 and 9, got %d", p)
			} else {
				o.Priority = &p
			}
		}
	}
	if f, ok := get("expires"); ok {
		n := deref(f.val)
		if n.Tag == "!!timestamp" || (n.Tag == "!!str" && strings.Contains(n.Value, "T")) {
			t, ok := d.timestamp(n, "options.expires", loc)
			o.Expires.At = t
			_ = ok
		} else if dur, ok := d.duration(n, "options.expires", false); ok {
			o.Expires.After = dur
		}
	}
	// null turns off a late_slot_expires the defaults set.
	if f, ok := get("late_slot_expires"); ok && deref(f.val).Tag != "!!null" {
		o.LateExpires, _ = d.duration(f.val, "options.late_slot_expires", false)
	}
	for _, k := range []string{"time_limit", "soft_time_limit"} {
		f, ok := get(k)
		if !ok {
			continue
		}
		if !d.timeLimit(f.val, "options."+k) {
			continue
		}
		// Keep int or float as written: Celery sends 30 and 30.0 differently.
		val, _ := d.value(f.val)
		if k == "time_limit" {
			o.TimeLimit = val
		} else {
			o.SoftTimeLimit = val
		}
	}
	if f, ok := get("ignore_result"); ok {
		o.IgnoreResult, _ = d.boolean(f.val, "options.ignore_result")
	}
	// Headers merge key by key: defaults first, the entry's over them.
	for _, src := range []fieldSet{def, own} {
		f, ok := src.get("headers")
		if !ok {
			continue
		}
		n := deref(f.val)
		if n.Kind != yaml.MappingNode {
			d.errorf(n, "options.headers must be a mapping")
			continue
		}
		reserved := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; celery.ReservedHeaders[k.Value] {
				d.errorf(k, "options.headers: %q is reserved: beatd sets it", k.Value)
				reserved = true
			}
		}
		if reserved {
			continue
		}
		v, ok := d.value(n)
		if !ok {
			continue
		}
		if d.placeholders(n, 0) > 0 {
			o.Templated = true
		}
		o.Headers = merged(o.Headers, v.(*celery.Map))
	}
	return o
}

// merged is over's pairs set on base's (a new Map; base is kept), in
// time linear in their sizes.
func merged(base, over *celery.Map) *celery.Map {
	out := &celery.Map{}
	at := make(map[string]int, base.Len()+over.Len())
	for _, m := range []*celery.Map{base, over} {
		for i := 0; i < m.Len(); i++ {
			k := m.Keys[i]
			if j, ok := at[k]; ok {
				out.Values[j] = m.Values[i]
				continue
			}
			at[k] = len(out.Keys)
			out.Keys = append(out.Keys, k)
			out.Values = append(out.Values, m.Values[i])
		}
	}
	return out
}

func (d *decoder) zone(n *yaml.Node) *time.Location {
	name := scalar(n)
	if name == "" || name == "Local" {
		d.errorf(n, "timezone must be an IANA zone name such as Europe/Berlin, got %q", name)
		return nil
	}
	if loc, ok := zoneCache.Load(name); ok {
		return loc.(*time.Location)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		d.errorf(n, "unknown timezone %q", name)
		return nil
	}
	actual, _ := zoneCache.LoadOrStore(name, loc)
	return actual.(*time.Location)
}

// internTask returns the one copy of a task name: tenants' entries share
// a handful of tasks, and the entries API parses each entry on its own.
// The table is bounded, for a source of endless distinct names.
func internTask(name string) string {
	if v, ok := taskNames.Load(name); ok {
		return v.(string)
	}
	if taskCount.Load() >= maxTaskNames {
		return name
	}
	if v, loaded := taskNames.LoadOrStore(name, name); loaded {
		return v.(string)
	}
	taskCount.Add(1)
	return name
}

var (
	taskNames sync.Map // name -> name
	taskCount atomic.Int64
)

const maxTaskNames = 10000

// zoneCache holds one *Location per zone name for the process: loading
// parses the zone's rules (~600 bytes each), and the entries API parses
// each entry on its own, so a million entries in six zones would
// otherwise hold a million copies. A Location is immutable once loaded.
var zoneCache sync.Map // zone name -> *time.Location

// duration accepts a Go duration ("30s", "1h30m") or a number of seconds,
// as Celery's schedule=30.0 does, up to MaxDuration.
func (d *decoder) duration(n *yaml.Node, what string, zeroOK bool) (time.Duration, bool) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, "%s must be a duration such as 30s or a number of seconds", what)
		return 0, false
	}
	var dur time.Duration
	switch n.Tag {
	case "!!int", "!!float":
		secs, err := strconv.ParseFloat(n.Value, 64)
		if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			d.errorf(n, "%s: %q is not a usable number of seconds", what, n.Value)
			return 0, false
		}
		if secs > MaxDuration.Seconds() {
			d.errorf(n, "%s: %s seconds is too long: the limit is %s", what, n.Value, maxDurationText)
			return 0, false
		}
		if secs < 0 {
			d.errorf(n, "%s must be positive, got %s", what, n.Value)
			return 0, false
		}
		dur = time.Duration(secs * float64(time.Second))
	case "!!str":
		var err error
		dur, err = schedule.ParseDuration(n.Value)
		if errors.Is(err, schedule.ErrDurationRange) {
			d.errorf(n, "%s: %q is too long: the limit is %s", what, n.Value, maxDurationText)
			return 0, false
		}
		if err != nil {
			d.errorf(n, "%s: %q is not a duration (try 30s, 5m, 1h, 1d or 1w)", what, n.Value)
			return 0, false
		}
	default:
		d.errorf(n, "%s must be a duration such as 30s or a number of seconds", what)
		return 0, false
	}
	if dur < 0 || (dur == 0 && !zeroOK) {
		d.errorf(n, "%s must be positive, got %s", what, n.Value)
		return 0, false
	}
	if dur > MaxDuration {
		d.errorf(n, "%s: %q is too long: the limit is %s", what, n.Value, maxDurationText)
		return 0, false
	}
	return dur, true
}

// maxDurationText is MaxDuration as the errors say it.
const maxDurationText = "3660d (ten years)"

// timeLimit is options.time_limit or soft_time_limit in seconds, which
// also sets how long a run blocks the overlap policy: a positive number up
// to MaxDuration.
func (d *decoder) timeLimit(n *yaml.Node, what string) bool {
	v, ok := d.number(n, what)
	switch {
	case !ok:
		return false
	case v <= 0:
		d.errorf(n, "%s must be positive", what)
		return false
	case v > MaxDuration.Seconds():
		d.errorf(n, "%s: %s seconds is too long: the limit is %s", what, deref(n).Value, maxDurationText)
		return false
	}
	return true
}

// timestamp accepts RFC 3339; without an offset the time is read in loc.
// It must fall from earliestTime to before latestTime.
func (d *decoder) timestamp(n *yaml.Node, what string, loc *time.Location) (time.Time, bool) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!timestamp" || n.Tag == "!!str") {
		if t, err := time.Parse(time.RFC3339Nano, n.Value); err == nil {
			return d.checkTime(n, what, t)
		}
		for _, layout := range []string{"2006-01-02T15:04:05.999999999", "2006-01-02T15:04"} {
			if t, err := time.ParseInLocation(layout, n.Value, loc); err == nil {
				return d.checkTime(n, what, t)
			}
		}
	}
	d.errorf(n, "%s must be an RFC 3339 time such as 2026-12-24T18:00:00Z, got %q", what, n.Value)
	return time.Time{}, false
}

func (d *decoder) integer(n *yaml.Node, what string) (int, bool) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v, true
		}
	}
	d.errorf(n, "%s must be an integer, got %q", what, n.Value)
	return 0, false
}

func (d *decoder) number(n *yaml.Node, what string) (float64, bool) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		if v, err := strconv.ParseFloat(n.Value, 64); err == nil && !math.IsInf(v, 0) && !math.IsNaN(v) {
			return v, true
		}
	}
	d.errorf(n, "%s must be a number, got %q", what, n.Value)
	return 0, false
}

func (d *decoder) boolean(n *yaml.Node, what string) (bool, bool) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, true
		}
	}
	d.errorf(n, "%s must be true or false, got %q", what, n.Value)
	return false, false
}

// value converts task arguments to plain values that serialise to JSON and
// Python repr the way Celery would: nil, bool, int64, *big.Int (integers
// beyond int64, exact), float64, string, []any and *Map.
func (d *decoder) value(n *yaml.Node) (any, bool) {
	return d.valueDepth(n, 0)
}

func (d *decoder) valueDepth(n *yaml.Node, depth int) (any, bool) {
	n = deref(n)
	if depth > 64 {
		d.errorf(n, "value nested too deeply")
		return nil, false
	}
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				d.errorf(n, "invalid boolean %q", n.Value)
				return nil, false
			}
			return b, true
		case "!!int":
			// Plain decimals (what JSON writes) skip yaml.v3's decoder,
			// which allocates one per call; it reads them the same.
			if i, err := strconv.ParseInt(n.Value, 10, 64); plainDecimal(n.Value) && err == nil {
				return i, true
			}
			var i int64
			if err := n.Decode(&i); err != nil {
				if b, ok := bigInt(n.Value); ok {
					return b, true
				}
				d.errorf(n, "invalid integer %q", n.Value)
				return nil, false
			}
			return i, true
		case "!!float":
			// YAML resolves an integer beyond 64 bits as a float; Python's
			// JSON keeps it exact, and so does beatd.
			if b, ok := bigInt(n.Value); ok {
				return b, true
			}
			var f float64
			if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				d.errorf(n, "number %q is not finite; JSON cannot carry it", n.Value)
				return nil, false
			}
			return f, true
		case "!!str", "!!timestamp":
			return n.Value, true
		}
		d.errorf(n, "unsupported value of type %s", n.Tag)
		return nil, false
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		ok := true
		for _, c := range n.Content {
			v, good := d.valueDepth(c, depth+1)
			out = append(out, v)
			ok = ok && good
		}
		return out, ok
	case yaml.MappingNode:
		pairs := len(n.Content) / 2
		m := &celery.Map{Keys: make([]string, 0, pairs), Values: make([]any, 0, pairs)}
		var seen map[string]struct{} // past a few keys: Get would make this quadratic
		if pairs > 8 {
			seen = make(map[string]struct{}, pairs)
		}
		ok := true
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := deref(n.Content[i])
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				d.errorf(k, "mapping keys in task arguments must be strings")
				ok = false
				continue
			}
			dup := false
			if seen != nil {
				_, dup = seen[k.Value]
				seen[k.Value] = struct{}{}
			} else {
				_, dup = m.Get(k.Value)
			}
			if dup {
				d.errorf(k, "duplicate key %q", k.Value)
				ok = false
				continue
			}
			v, good := d.valueDepth(n.Content[i+1], depth+1)
			m.Keys = append(m.Keys, k.Value)
			m.Values = append(m.Values, v)
			ok = ok && good
		}
		return m, ok
	}
	d.errorf(n, "unsupported value")
	return nil, false
}

// SameSettings says whether c and o have the same settings beyond their
// entries: the same file, options and defaults, and the very same
// timezone, AMQP and calendar objects. Every config a merger makes from
// one load of the file has, so a holder of o whose entries are c's (the
// same pointers) holds c already.
func (c *Config) SameSettings(o *Config) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.File == o.File && c.opt == o.opt && c.defaults == o.defaults && c.Timezone == o.Timezone &&
		c.AMQP.MaxPriority == o.AMQP.MaxPriority && sameMap(c.AMQP.Queues, o.AMQP.Queues) && sameMap(c.Calendars, o.Calendars)
}

// sameMap says whether a and b are the same map object (or both nil).
func sameMap[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// plainDecimal says whether s is an optional '-' and decimal digits
// without a leading zero (YAML 1.1 reads "017" as octal).
func plainDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
