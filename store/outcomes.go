package store

import (
	"encoding/binary"
	"time"

	"github.com/beatd/beatd/outcome"
)

// KeptRuns is how many of an entry's newest runs its state keeps with
// their outcomes: enough for status to show the last few, and for the
// overlap policies to know the one in progress after a failover. The
// broker's run history keeps more, without outcomes.
const KeptRuns = 3

// Outcomes is what an entry's runs did on the workers, kept with its
// state so a new leader knows a run is in progress and how many failed
// in a row.
type Outcomes struct {
	Runs        []outcome.Run // newest first, at most KeptRuns
	Failures    int           // consecutive failed runs (lost runs count)
	LastSuccess time.Time
	LastFailure time.Time
	// PauseReason says why the entry was paused by pause_after_failures
	// (its last exception); cleared on resume.
	PauseReason string
	// Buffered is the slot an overlap: buffer_one entry holds back until
	// the running one finishes.
	Buffered time.Time
}

// Clone is a deep copy, for handing state to another goroutine.
func (o *Outcomes) Clone() *Outcomes {
	if o == nil {
		return nil
	}
	c := *o
	c.Runs = append([]outcome.Run(nil), o.Runs...)
	return &c
}

// Newest returns the newest run that was published (skipped slots
// aside), or nil.
func (o *Outcomes) Newest() *outcome.Run {
	if o == nil {
		return nil
	}
	for i := range o.Runs {
		if o.Runs[i].Kind != outcome.Skipped {
			return &o.Runs[i]
		}
	}
	return nil
}

// Skip records a slot skipped at now: it joins the newest record when
// that is a skip too, else it is pushed as one.
func (o *Outcomes) Skip(slot, now time.Time) (dropped *outcome.Run) {
	if len(o.Runs) > 0 && o.Runs[0].Kind == outcome.Skipped {
		r := &o.Runs[0]
		r.Slot, r.Updated, r.Skips = slot, now, max(r.Skips, 1)+1
		return nil
	}
	return o.Push(outcome.Run{Slot: slot, Kind: outcome.Skipped, PublishedAt: now, Skips: 1})
}

// Push records r as the newest run, dropping the oldest beyond KeptRuns;
// it returns the run that fell off, if any. The newest published run is
// never the one dropped while it is unfinished: slots skipped for overlap
// must not push the run they wait for out of sight.
func (o *Outcomes) Push(r outcome.Run) (dropped *outcome.Run) {
	if len(o.Runs) >= KeptRuns {
		drop := len(o.Runs) - 1
		if n := o.Newest(); n == &o.Runs[drop] && !n.Kind.Finished() {
			drop--
		}
		d := o.Runs[drop]
		dropped = &d
		o.Runs = append(o.Runs[:drop], o.Runs[drop+1:]...)
	}
	o.Runs = append(o.Runs, outcome.Run{})
	copy(o.Runs[1:], o.Runs)
	o.Runs[0] = r
	return dropped
}

// chained says whether a run of o is a chain's, which only format 4
// encodes.
func (o *Outcomes) chained() bool {
	if o == nil {
		return false
	}
	for i := range o.Runs {
		if o.Runs[i].Chain > 0 {
			return true
		}
	}
	return false
}

// kindChain marks a run's kind byte (format 4): the run is a chain's, and
// its chain's length and the step it is at follow, a byte each.
const kindChain = 1 << 7

const (
	outSuccess  = 1 << 0
	outFailure  = 1 << 1
	outPause    = 1 << 2
	outBuffered = 1 << 3

	runManual  = 1 << 0
	runID      = 1 << 1
	runUpdated = 1 << 2
	runStarted = 1 << 3
	runRuntime = 1 << 4
	runWorker  = 1 << 5
	runExc     = 1 << 6
	runSkips   = 1 << 7
)

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func readString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < l {
		return "", b, errCorrupt
	}
	return string(b[n : n+int(l)]), b[n+int(l):], nil
}

func readUvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, b, errCorrupt
	}
	return v, b[n:], nil
}

// appendOutcomes encodes o after an entry's times (format 3; 4 with a
// chain's run, kindChain). A run's
// Token and Backfill are the broker's history's, not kept here, and its
// TaskID only for a manual run (the loop sets no other).
func appendOutcomes(dst []byte, o *Outcomes, base int64) []byte {
	dst = binary.AppendUvarint(dst, uint64(max(o.Failures, 0)))
	var f byte
	if !o.LastSuccess.IsZero() {
		f |= outSuccess
	}
	if !o.LastFailure.IsZero() {
		f |= outFailure
	}
	if o.PauseReason != "" {
		f |= outPause
	}
	if !o.Buffered.IsZero() {
		f |= outBuffered
	}
	dst = append(dst, f)
	for _, tm := range [...]time.Time{o.LastSuccess, o.LastFailure, o.Buffered} {
		if !tm.IsZero() {
			dst = appendTime(dst, tm, base)
		}
	}
	if o.PauseReason != "" {
		dst = appendString(dst, o.PauseReason)
	}
	dst = binary.AppendUvarint(dst, uint64(len(o.Runs)))
	for _, r := range o.Runs {
		var rf byte
		if r.Manual {
			rf |= runManual
		}
		if r.TaskID != "" {
			rf |= runID
		}
		if !r.Updated.IsZero() {
			rf |= runUpdated
		}
		if !r.Started.IsZero() {
			rf |= runStarted
		}
		if r.Runtime > 0 {
			rf |= runRuntime
		}
		if r.Worker != "" {
			rf |= runWorker
		}
		if r.ExcType != "" || r.ExcMsg != "" {
			rf |= runExc
		}
		if r.Skips > 1 {
			rf |= runSkips
		}
		if r.Chain > 0 {
			dst = append(dst, rf, byte(r.Kind)|kindChain, r.Chain, r.Step)
		} else {
			dst = append(dst, rf, byte(r.Kind))
		}
		dst = appendTime(dst, r.Slot, base)
		dst = appendTime(dst, r.PublishedAt, base)
		if !r.Updated.IsZero() {
			dst = appendTime(dst, r.Updated, base)
		}
		if !r.Started.IsZero() {
			dst = appendTime(dst, r.Started, base)
		}
		if r.Runtime > 0 {
			dst = binary.AppendUvarint(dst, uint64(r.Runtime/time.Microsecond))
		}
		if r.TaskID != "" {
			dst = appendString(dst, r.TaskID)
		}
		if r.Worker != "" {
			dst = appendString(dst, r.Worker)
		}
		if rf&runExc != 0 {
			dst = appendString(appendString(dst, r.ExcType), r.ExcMsg)
		}
		if rf&runSkips != 0 {
			dst = binary.AppendUvarint(dst, uint64(r.Skips))
		}
	}
	return dst
}

func readOutcomes(b []byte, base int64) (*Outcomes, []byte, error) {
	o := &Outcomes{}
	v, b, err := readUvarint(b)
	if err != nil {
		return nil, b, err
	}
	o.Failures = int(v)
	if len(b) == 0 {
		return nil, b, errCorrupt
	}
	f := b[0]
	b = b[1:]
	for _, x := range []struct {
		flag byte
		dst  *time.Time
	}{{outSuccess, &o.LastSuccess}, {outFailure, &o.LastFailure}, {outBuffered, &o.Buffered}} {
		if f&x.flag != 0 {
			if *x.dst, b, err = readTime(b, base); err != nil {
				return nil, b, err
			}
		}
	}
	if f&outPause != 0 {
		if o.PauseReason, b, err = readString(b); err != nil {
			return nil, b, err
		}
	}
	n, b, err := readUvarint(b)
	if err != nil || n > KeptRuns*4 {
		return nil, b, errCorrupt
	}
	if n > 0 {
		o.Runs = make([]outcome.Run, n)
	}
	for i := range o.Runs {
		r := &o.Runs[i]
		if len(b) < 2 {
			return nil, b, errCorrupt
		}
		rf, k := b[0], b[1]
		r.Kind, r.Manual = outcome.Kind(k&^kindChain), rf&runManual != 0
		b = b[2:]
		if k&kindChain != 0 {
			if len(b) < 2 || b[0] == 0 || b[1] > b[0] {
				return nil, b, errCorrupt
			}
			r.Chain, r.Step = b[0], b[1]
			b = b[2:]
		}
		if r.Slot, b, err = readTime(b, base); err != nil {
			return nil, b, err
		}
		if r.PublishedAt, b, err = readTime(b, base); err != nil {
			return nil, b, err
		}
		if rf&runUpdated != 0 {
			if r.Updated, b, err = readTime(b, base); err != nil {
				return nil, b, err
			}
		}
		if rf&runStarted != 0 {
			if r.Started, b, err = readTime(b, base); err != nil {
				return nil, b, err
			}
		}
		if rf&runRuntime != 0 {
			if v, b, err = readUvarint(b); err != nil {
				return nil, b, err
			}
			r.Runtime = time.Duration(v) * time.Microsecond
		}
		if rf&runID != 0 {
			if r.TaskID, b, err = readString(b); err != nil {
				return nil, b, err
			}
		}
		if rf&runWorker != 0 {
			if r.Worker, b, err = readString(b); err != nil {
				return nil, b, err
			}
		}
		if rf&runExc != 0 {
			if r.ExcType, b, err = readString(b); err != nil {
				return nil, b, err
			}
			if r.ExcMsg, b, err = readString(b); err != nil {
				return nil, b, err
			}
		}
		if rf&runSkips != 0 {
			if v, b, err = readUvarint(b); err != nil {
				return nil, b, err
			}
			r.Skips = int(v)
		}
	}
	return o, b, nil
}
