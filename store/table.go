package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"time"
)

// NumBuckets is how many etcd keys hold the state of all entries in the
// first layout, up to 32,768 entries. Packing entries into a bounded
// number of keys keeps the cost of a state write proportional to the
// entries that changed, not to a key and an MVCC revision per entry: with
// 1k entries firing every second, 256 puts of ~100 bytes instead of 1,000
// puts.
//
// A bucket is rewritten whole, so its size is what one fire costs etcd:
// 256 buckets of a million entries are ~80 KB each, and 300 fires a
// second would write ~14 MB/s of history. Past 32,768 entries the table
// grows to 4,096 buckets, past 262,144 to 65,536 (Fit): a bucket then
// holds at most 64 entries (~1.3 KB), and a million entries' 300 fires a
// second write ~90 KB/s. The first layout ends at 32,768, not 65,536,
// because a shard's table is a cluster's sixteenth: at 56,250 entries
// (900,000 over 16 shards) its 256 buckets of ~220 entries made each fire
// write ~2 KB and allocate ~9 KB to encode (BenchmarkShardFires), 8
// times what a fire costs in 4,096 buckets. A table of many entries that
// all fire often writes about all of itself each interval in any layout;
// more buckets only cost more operations when most entries fire in every
// interval, which only small tables do. The layouts' keys differ in
// length (2, 3 or 4 hex digits), so a reader tells them apart without a
// layout record, and a move between them is a rewrite followed by the
// deletion of the old keys.
const NumBuckets = 256

// EntryState is what etcd holds for one entry: only what a new leader
// needs to fire correctly. Run history and counters live with the broker
// (see outcome.Run), not here, so a fire costs etcd tens of bytes.
type EntryState struct {
	Name     string
	LastSlot time.Time // nominal time of the last slot fired
	// Since is when the entry's current schedule began to be owed: set
	// when a leader first schedules it, when its config changes, and on
	// resume. A later leader catches up from max(LastSlot, Since), so a
	// slot due before anyone fired the entry is still owed after a
	// failover, and slots from before a change or a pause are not.
	Since     time.Time
	RemovedAt time.Time // set when the entry left the config
	Paused    bool
	// Imported says LastSlot came from another scheduler (beatd import
	// --state), not from a beatd publish; the first fire clears it.
	// (Next to Paused: a million states are held at once, and the pair
	// keeps one in a 112-byte allocation.)
	Imported bool
	// Out is what the entry's runs did on the workers, once any outcome
	// is tracked for it (nil before). It is shared by copies of the
	// state: Clone before handing a state to another goroutine.
	Out *Outcomes
	// Runs counts the scheduled runs published, kept only for entries
	// with max_runs.
	Runs uint64
}

// Clone is a copy that shares nothing with st.
func (st EntryState) Clone() EntryState {
	st.Out = st.Out.Clone()
	return st
}

// CatchupFrom is the instant after which missed slots are owed.
func (s *EntryState) CatchupFrom() time.Time {
	if s.Since.After(s.LastSlot) {
		return s.Since
	}
	return s.LastSlot
}

// BucketOf is the bucket that holds name's state in the first layout.
func BucketOf(name string) int { return bucketOf(name, NumBuckets) }

func bucketOf(name string, buckets int) int { return bucketOfBytes([]byte(name), buckets) }

// bucketOfBytes is bucketOf of a name as stored in a bucket's records.
func bucketOfBytes(name []byte, buckets int) int {
	h := fnv.New32a()
	h.Write(name)
	return int(h.Sum32() % uint32(buckets))
}

// layoutDigits is the layout (hex digits of a bucket key) for n entries.
// A table shrinks back only once well below the smaller layout's
// capacity, so a count that hovers at a threshold does not rewrite
// everything back and forth.
func layoutDigits(n, cur int) int {
	want := 2
	switch {
	case n > 1<<18:
		want = 4
	case n > 1<<15:
		want = 3
	}
	if want < cur && n > layoutCapacity(want)/2 {
		return cur
	}
	return want
}

// layoutCapacity is the most entries a layout is chosen for.
func layoutCapacity(digits int) int {
	if digits == 2 {
		return 1 << 15
	}
	return 1 << 18
}

// Table is every entry's state, grouped by bucket, with the buckets that
// changed since they were last written marked dirty. It is the leader's
// write-behind copy of what etcd holds; it is not safe for concurrent use.
//
// A bucket is kept encoded, as etcd holds it: ~18 bytes an entry instead
// of ~150 for a map entry, which matters with 100k entries that mostly
// wait for their next slot. Its changes wait beside the encoding (add),
// and a bucket is decoded into a map only when more than maxAdd of its
// entries change before it is written. A bucket written with a map in
// two write cycles running keeps it (Compact): with 20k entries every
// second each cycle rewrites every bucket, and decoding each one again
// was a quarter of the leader's allocations.
type Table struct {
	digits int // the layout: a bucket key's hex digits (2, 3 or 4)
	enc    [][]byte
	dec    []map[string]EntryState
	// add are the changes of a bucket kept encoded, not yet in its enc:
	// new entries, and new states of stored ones, up to maxAdd a bucket,
	// applied when it is written, without decoding the bucket into a map
	// it keeps. A bulk load of a million entries adds a few to nearly
	// every bucket in every write cycle, and decoding each bucket into a
	// map for that was a third of the load's allocations. A shard's
	// catch-up changes a few entries of every one of its buckets (of
	// ~220 entries at 56,000 a shard) in each cycle for as long as it
	// lasts: decoded, that held every entry of the shard twice.
	add [][]EntryState
	// over marks a bucket whose add holds a stored entry's new state, or
	// a state the stored format may not hold (a run count, outcomes):
	// its write decodes the bucket, where add alone is appended to it.
	over  []bool
	dirty []bool
	// wrote marks the buckets written in the current cycle, hot those
	// written in the last one (Compact ends a cycle).
	wrote, hot []bool
	// stale are bucket keys (suffixes) of a layout the table left; they
	// are deleted once the new layout is written whole.
	stale []string
	// legacy are keys of the per-entry JSON layout (format v1) whose
	// content was read into the table; they are deleted with the first
	// write of everything, so an upgrade migrates in place.
	legacy []string
	n      int
}

// NewTable returns an empty table.
func NewTable() *Table { return newTable(2) }

func newTable(digits int) *Table {
	n := layoutBuckets(digits)
	return &Table{digits: digits, enc: make([][]byte, n), dec: make([]map[string]EntryState, n), add: make([][]EntryState, n),
		over: make([]bool, n), dirty: make([]bool, n), wrote: make([]bool, n), hot: make([]bool, n)}
}

// Buckets is how many buckets the table's layout has.
func (t *Table) Buckets() int { return len(t.enc) }

func (t *Table) bucketOf(name string) int { return bucketOf(name, len(t.enc)) }

// suffix is bucket b's key under the state prefix.
func (t *Table) suffix(b int) string { return bucketSuffix(t.digits, b) }

// layoutBuckets is how many buckets the layout of digits has.
func layoutBuckets(digits int) int { return 1 << (4 * digits) }

// bucketSuffix is bucket b's key under the state prefix, in the layout of
// digits.
func bucketSuffix(digits, b int) string { return fmt.Sprintf("%0*x", digits, b) }

// Fit moves the table to the layout its number of entries calls for, if
// that is another: every entry is set again (all of the new layout is
// dirty) and the old layout's keys are deleted by the write that follows
// it. It reports whether it moved.
func (t *Table) Fit() bool {
	d := layoutDigits(t.n, t.digits)
	if d == t.digits {
		return false
	}
	all := make([]EntryState, 0, t.n)
	t.Range(func(st EntryState) bool { all = append(all, st); return true })
	stale := t.stale
	for b := range t.enc {
		if t.enc[b] != nil || t.dec[b] != nil {
			stale = append(stale, t.suffix(b))
		}
	}
	*t = *newTable(d)
	t.stale = stale
	for _, st := range all {
		t.Set(st)
	}
	return true
}

// Len is the number of entries.
func (t *Table) Len() int { return t.n }

// maxAdd is the most changes a bucket kept encoded takes (add) before it
// is decoded into a map: past it, looking a name up in add costs more
// than the map.
const maxAdd = 32

// open returns bucket b decoded, for a change.
func (t *Table) open(b int) map[string]EntryState {
	if t.dec[b] == nil {
		t.dec[b], t.add[b], t.over[b] = t.decode(b), nil, false
	}
	return t.dec[b]
}

// decode is bucket b's entries in a map of its own: its stored records
// with its changes applied.
func (t *Table) decode(b int) map[string]EntryState {
	if m := t.dec[b]; m != nil {
		return m
	}
	m := make(map[string]EntryState, len(t.add[b]))
	// enc holds only what decoded cleanly when it was stored.
	_ = eachRecord(t.enc[b], func(st EntryState) { m[st.Name] = st })
	for _, st := range t.add[b] {
		m[st.Name] = st
	}
	return m
}

// changed says whether name has a state in bucket b's add.
func (t *Table) changed(b int, name string) bool {
	for i := range t.add[b] {
		if t.add[b][i].Name == name {
			return true
		}
	}
	return false
}

// empty says bucket b holds no entry.
func (t *Table) empty(b int) bool {
	if m := t.dec[b]; m != nil {
		return len(m) == 0
	}
	return len(t.enc[b]) == 0 && len(t.add[b]) == 0
}

// Get returns name's state.
func (t *Table) Get(name string) (EntryState, bool) {
	b := t.bucketOf(name)
	if m := t.dec[b]; m != nil {
		st, ok := m[name]
		return st, ok
	}
	for _, st := range t.add[b] {
		if st.Name == name {
			return st, true
		}
	}
	var found EntryState
	ok := false
	_ = eachRecord(t.enc[b], func(st EntryState) {
		if st.Name == name {
			found, ok = st, true
		}
	})
	return found, ok
}

// Set stores st and marks its bucket dirty.
func (t *Table) Set(st EntryState) {
	b := t.bucketOf(st.Name)
	t.dirty[b] = true
	plain := st.Out == nil && st.Runs == 0
	if t.dec[b] == nil {
		// The change goes beside the encoded bucket.
		for i := range t.add[b] {
			if t.add[b][i].Name == st.Name {
				t.add[b][i] = st
				t.over[b] = t.over[b] || !plain
				return
			}
		}
		if len(t.add[b]) < maxAdd {
			stored := hasRecord(t.enc[b], st.Name)
			if !stored {
				t.n++
			}
			t.add[b] = append(t.add[b], st)
			t.over[b] = t.over[b] || stored || !plain
			return
		}
	}
	m := t.open(b)
	if _, ok := m[st.Name]; !ok {
		t.n++
	}
	m[st.Name] = st
}

// Delete removes name and marks its bucket dirty.
func (t *Table) Delete(name string) {
	b := t.bucketOf(name)
	if _, ok := t.Get(name); !ok {
		return
	}
	delete(t.open(b), name)
	t.n--
	t.dirty[b] = true
}

// Range calls f for every entry until f returns false.
func (t *Table) Range(f func(EntryState) bool) {
	for b := range t.enc {
		if m := t.dec[b]; m != nil {
			for _, st := range m {
				if !f(st) {
					return
				}
			}
			continue
		}
		stop, over := false, t.over[b]
		_ = eachRecord(t.enc[b], func(st EntryState) {
			if !stop && !(over && t.changed(b, st.Name)) && !f(st) {
				stop = true
			}
		})
		if stop {
			return
		}
		for _, st := range t.add[b] {
			if !f(st) {
				return
			}
		}
	}
}

// States returns a copy of every entry's state, keyed by name.
func (t *Table) States() map[string]*EntryState {
	out := make(map[string]*EntryState, t.n)
	t.Range(func(st EntryState) bool {
		st = st.Clone()
		out[st.Name] = &st
		return true
	})
	return out
}

// Dirty is the number of buckets not yet written.
func (t *Table) Dirty() int {
	n := 0
	for _, d := range t.dirty {
		if d {
			n++
		}
	}
	return n + min(len(t.legacy)+len(t.stale), 1)
}

// written records that bucket b now holds enc in etcd. Its map stays
// until Compact decides. The table keeps enc (the caller writes to it no
// more), copied first if its capacity is more than its length: a million
// entries keep their buckets encoded, and appendBucket's growth leaves up
// to twice the length.
func (t *Table) written(b int, enc []byte) {
	if cap(enc) > len(enc) {
		enc = bytes.Clone(enc)
	}
	t.enc[b], t.dirty[b], t.wrote[b] = enc, false, true
	t.add[b], t.over[b] = nil, false
}

// Compact ends a write cycle. It drops the decoded copy of every bucket
// that is written, except one written in this cycle and the one before:
// only a bucket being changed is worth its map (~8 times its encoding),
// and one changed in every cycle will be again.
func (t *Table) Compact() {
	for b := range t.dec {
		if t.dec[b] != nil && !t.dirty[b] && !(t.wrote[b] && t.hot[b]) {
			t.dec[b] = nil
		}
		t.hot[b], t.wrote[b] = t.wrote[b], false
	}
}

// MarkClean marks every bucket written, for a store that writes the whole
// table at once (an in-memory one in tests).
func (t *Table) MarkClean() {
	for b := range t.enc {
		if t.dirty[b] {
			t.written(b, t.appendBucket(nil, b))
		}
	}
	t.legacy, t.stale = nil, nil
}

// Reconcile applies the removal rules to st, whether its entry is in the
// config at now: a removed entry is marked (RemovedAt), one back in the
// config unmarked. changed says st changed; gone, that it has been removed
// for longer than grace and its state is to be deleted. Prune at a term's
// start and the leader's reloads and sweeps all use it.
func (st *EntryState) Reconcile(configured bool, now time.Time, grace time.Duration) (changed, gone bool) {
	switch {
	case configured:
		if !st.RemovedAt.IsZero() { // back in the config
			st.RemovedAt = time.Time{}
			return true, false
		}
	case st.RemovedAt.IsZero():
		st.RemovedAt = now
		return true, false
	case now.Sub(st.RemovedAt) > grace:
		return false, true
	}
	return false, false
}

// Prune applies the removed-entry rule to every entry not configured: the
// first time it is seen it is marked removed at now; once marked for
// longer than grace it is deleted. An entry configured again is unmarked.
// It returns the names it marked and deleted.
func (t *Table) Prune(configured func(string) bool, now time.Time, grace time.Duration) (marked, deleted []string) {
	var set []EntryState
	t.Range(func(st EntryState) bool {
		changed, gone := st.Reconcile(configured(st.Name), now, grace)
		switch {
		case gone:
			deleted = append(deleted, st.Name)
		case changed:
			set = append(set, st)
			if !st.RemovedAt.IsZero() {
				marked = append(marked, st.Name)
			}
		}
		return true
	})
	for _, st := range set {
		t.Set(st)
	}
	for _, n := range deleted {
		t.Delete(n)
	}
	return marked, deleted
}

// Bucket encoding (format v2), chosen for size because every byte is
// written to etcd's WAL and MVCC history on every change:
//
//	version byte (2) | uvarint base (Unix seconds) | records...
//	record: uvarint len(name) | name | flags | times...
//
// flags say which of LastSlot, Since, RemovedAt follow (in that order),
// whether the entry is paused, and whether its run count (max_runs
// entries) and its outcomes (Outcomes, see appendOutcomes) follow the
// times, in that order. A bucket with no outcomes is written
// as format 2, which the releases before outcomes read; one with any is
// format 3, or 4 when a run is a chain's (its step follows its kind),
// which the releases before chained runs refuse. A time is zigzag(seconds-base)<<1 |
// hasNanos as a uvarint, then the nanoseconds if any: slots are whole
// seconds near each other, so most times take one or two bytes.
const (
	bucketFormat     = 4
	formatNoChains   = 3
	formatNoOutcomes = 2

	flagLast    = 1 << 0
	flagSince   = 1 << 1
	flagRemoved = 1 << 2
	flagPaused  = 1 << 3
	flagImport  = 1 << 4
	flagOutcome = 1 << 5
	flagRuns    = 1 << 6
)

// appendBucket encodes bucket b into dst.
func (t *Table) appendBucket(dst []byte, b int) []byte {
	if enc := t.enc[b]; t.dec[b] == nil && len(enc) > 0 {
		if base, n := binary.Uvarint(enc[1:]); n > 0 {
			if t.over[b] {
				return t.appendChanged(dst, b, int64(base))
			}
			// The stored records as they are, and the new ones after
			// them, their times relative to the stored base (zigzag
			// takes either sign). They carry no outcomes or run count,
			// so either format reads them.
			dst = append(dst, enc...)
			for _, st := range t.add[b] {
				dst = appendRecord(dst, st, int64(base))
			}
			return dst
		}
	}
	// Decoded for this write only, when it is not already: a map is kept
	// by a bucket changed in every cycle (open, Compact).
	m := t.decode(b)
	var base int64
	for _, st := range m {
		if s := st.LastSlot.Unix(); !st.LastSlot.IsZero() && s > base {
			base = s
		}
	}
	format := byte(formatNoOutcomes)
	for _, st := range m {
		format = max(format, formatOf(st))
	}
	dst = append(dst, format)
	dst = binary.AppendUvarint(dst, uint64(max(base, 0)))
	for _, st := range m {
		dst = appendRecord(dst, st, base)
	}
	return dst
}

// appendChanged encodes bucket b, kept encoded, with its changes (add):
// its stored records but those changed, then the changes, relative to
// the stored base, in the format they need; without a map of the bucket.
func (t *Table) appendChanged(dst []byte, b int, base int64) []byte {
	format := t.enc[b][0]
	for _, st := range t.add[b] {
		format = max(format, formatOf(st))
	}
	dst = append(dst, format)
	dst = binary.AppendUvarint(dst, uint64(base))
	_ = eachRecord(t.enc[b], func(st EntryState) {
		if !t.changed(b, st.Name) {
			dst = appendRecord(dst, st, base)
		}
	})
	for _, st := range t.add[b] {
		dst = appendRecord(dst, st, base)
	}
	return dst
}

// formatOf is the oldest bucket format that holds st.
func formatOf(st EntryState) byte {
	switch {
	case st.Out.chained():
		return bucketFormat
	case st.Out != nil || st.Runs > 0:
		return formatNoChains
	}
	return formatNoOutcomes
}

// appendRecord encodes st's record with times relative to base.
func appendRecord(dst []byte, st EntryState, base int64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(st.Name)))
	dst = append(dst, st.Name...)
	var f byte
	if !st.LastSlot.IsZero() {
		f |= flagLast
	}
	if !st.Since.IsZero() {
		f |= flagSince
	}
	if !st.RemovedAt.IsZero() {
		f |= flagRemoved
	}
	if st.Paused {
		f |= flagPaused
	}
	if st.Imported {
		f |= flagImport
	}
	if st.Out != nil {
		f |= flagOutcome
	}
	if st.Runs > 0 {
		f |= flagRuns
	}
	dst = append(dst, f)
	for _, tm := range [...]time.Time{st.LastSlot, st.Since, st.RemovedAt} {
		if !tm.IsZero() {
			dst = appendTime(dst, tm, base)
		}
	}
	if st.Runs > 0 {
		dst = binary.AppendUvarint(dst, st.Runs)
	}
	if st.Out != nil {
		dst = appendOutcomes(dst, st.Out, base)
	}
	return dst
}

func appendTime(dst []byte, tm time.Time, base int64) []byte {
	d := tm.Unix() - base
	z := uint64(d<<1) ^ uint64(d>>63) // zigzag
	ns := tm.Nanosecond()
	v := z << 1
	if ns != 0 {
		v |= 1
	}
	dst = binary.AppendUvarint(dst, v)
	if ns != 0 {
		dst = binary.AppendUvarint(dst, uint64(ns))
	}
	return dst
}

var errCorrupt = errors.New("corrupt state bucket")

// loadBucket adds the entries of an encoded bucket to t, unmarked. A
// record stored in the wrong bucket (a layout that hashed differently) is
// moved to its own, which is then dirty.
func (t *Table) loadBucket(b []byte) error {
	// A first pass keeps only the names' buckets: at a load, nearly every
	// bucket is already in this layout and kept encoded as read, and
	// decoding each into a list of states first (a string per name) was
	// as much garbage as the table it loaded.
	home, n, one := -1, 0, true
	if err := walkRecords(b, func(name []byte, _ EntryState) bool {
		i := bucketOfBytes(name, len(t.enc))
		if home < 0 {
			home = i
		}
		one = one && i == home
		n++
		return true
	}); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if one && len(t.enc[home]) == 0 && t.dec[home] == nil && len(t.add[home]) == 0 {
		t.enc[home] = b
		t.n += n
		return nil
	}
	return eachRecord(b, t.Set) // decoded cleanly by the pass above
}

// DecodeBucket returns the entries of a stored bucket value, for readers
// that mirror the state (the console watches the buckets).
func DecodeBucket(value []byte) ([]EntryState, error) {
	var out []EntryState
	err := eachRecord(value, func(st EntryState) { out = append(out, st) })
	return out, err
}

// eachRecord decodes an encoded bucket, calling f for each entry.
func eachRecord(b []byte, f func(EntryState)) error {
	return walkRecords(b, func(name []byte, st EntryState) bool {
		st.Name = string(name)
		f(st)
		return true
	})
}

// walkRecords reads an encoded bucket's records in order, calling f with
// each one's name, as stored, and the rest of its state, until f returns
// false. The name is not copied into a string: hasRecord only compares it.
func walkRecords(b []byte, f func(name []byte, st EntryState) bool) error {
	if len(b) == 0 {
		return nil
	}
	if b[0] > bucketFormat {
		return fmt.Errorf("state format v%d is newer than this beatd (v%d): upgrade beatd", b[0], bucketFormat)
	}
	if b[0] < formatNoOutcomes {
		return fmt.Errorf("%w: format %d", errCorrupt, b[0])
	}
	b = b[1:]
	ubase, n := binary.Uvarint(b)
	if n <= 0 {
		return errCorrupt
	}
	base := int64(ubase)
	b = b[n:]
	for len(b) > 0 {
		l, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < l+1 {
			return errCorrupt
		}
		name := b[n : n+int(l)]
		var st EntryState
		b = b[n+int(l):]
		flags := b[0]
		b = b[1:]
		st.Paused = flags&flagPaused != 0
		st.Imported = flags&flagImport != 0
		for _, x := range []struct {
			flag byte
			dst  *time.Time
		}{{flagLast, &st.LastSlot}, {flagSince, &st.Since}, {flagRemoved, &st.RemovedAt}} {
			if flags&x.flag == 0 {
				continue
			}
			var err error
			if *x.dst, b, err = readTime(b, base); err != nil {
				return err
			}
		}
		if flags&flagRuns != 0 {
			var err error
			if st.Runs, b, err = readUvarint(b); err != nil {
				return err
			}
		}
		if flags&flagOutcome != 0 {
			var err error
			if st.Out, b, err = readOutcomes(b, base); err != nil {
				return err
			}
		}
		if !f(name, st) {
			return nil
		}
	}
	return nil
}

func readTime(b []byte, base int64) (time.Time, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return time.Time{}, b, errCorrupt
	}
	b = b[n:]
	z := v >> 1
	d := int64(z>>1) ^ -int64(z&1)
	var ns uint64
	if v&1 != 0 {
		if ns, n = binary.Uvarint(b); n <= 0 || ns >= 1e9 {
			return time.Time{}, b, errCorrupt
		}
		b = b[n:]
	}
	return time.Unix(base+d, int64(ns)).UTC(), b, nil
}

// hasRecord says whether the encoded bucket b holds a record named name.
// Set asks it for every new entry, so it makes no string of the names it
// passes: decoding each record was what the bulk load's appends save.
func hasRecord(b []byte, name string) bool {
	found := false
	_ = walkRecords(b, func(n []byte, _ EntryState) bool {
		found = string(n) == name // compared in place, not allocated
		return !found
	})
	return found
}
