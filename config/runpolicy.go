package config

import (
	"math"
	"time"
)

// OverlapPolicy says what a slot does while the entry's previous run is
// unfinished on the workers (published, received, started or retrying).
type OverlapPolicy string

// Overlap policies.
const (
	OverlapAllow     OverlapPolicy = "allow"      // publish anyway (celery beat's behaviour)
	OverlapSkip      OverlapPolicy = "skip"       // do not publish; record the slot as skipped
	OverlapBufferOne OverlapPolicy = "buffer_one" // hold one slot until the run ends; skip the rest
)

// DefaultOverlapTimeout is how long an unfinished run blocks an entry
// whose task has no time_limit: past it, the run is counted lost (its
// worker may have died) and stops blocking.
const DefaultOverlapTimeout = time.Hour

// overlapSlack is added to a task's time_limit for its default
// overlap_timeout: the worker kills the task at time_limit and reports the
// failure, so a run silent for longer than that (plus time queued, with
// some margin) is lost.
const overlapSlack = 5 * time.Minute

// runPolicy is what an entry does with its runs' outcomes.
type runPolicy struct {
	overlap        OverlapPolicy
	overlapTimeout time.Duration // 0: derived from the task's time_limit
	pauseAfter     int32
}

// runPolicyFields decodes overlap, overlap_timeout and
// pause_after_failures, for an entry or the file's defaults.
func (d *decoder) runPolicyFields(f fieldSet, p *runPolicy) {
	if v, ok := f.get("overlap"); ok {
		switch o := OverlapPolicy(scalar(v.val)); o {
		case OverlapAllow, OverlapSkip, OverlapBufferOne:
			p.overlap = o
		default:
			d.errorf(v.val, "overlap must be allow, skip or buffer_one, got %q", scalar(v.val))
		}
	}
	if v, ok := f.get("overlap_timeout"); ok {
		if dur, ok := d.duration(v.val, "overlap_timeout", false); ok {
			p.overlapTimeout = dur
		}
	}
	if v, ok := f.get("pause_after_failures"); ok {
		if n, ok := d.integer(v.val, "pause_after_failures"); ok {
			if n < 0 || n > 1000000 {
				d.errorf(v.val, "pause_after_failures must be between 0 (never) and 1000000, got %d", n)
			} else {
				p.pauseAfter = int32(n)
			}
		}
	}
}

// OverlapDeadline is how long an unfinished run of e blocks its overlap
// policy, from its publish: overlap_timeout when given, else the task's
// time_limit plus five minutes, else DefaultOverlapTimeout.
func (e *Entry) OverlapDeadline() time.Duration {
	if t := e.OverlapTimeout(); t > 0 {
		return t
	}
	if e.Options != nil {
		var secs float64
		switch v := e.Options.TimeLimit.(type) {
		case int64:
			secs = float64(v)
		case float64:
			secs = v
		}
		if secs > 0 && secs < math.MaxInt64/float64(time.Second) {
			return time.Duration(secs*float64(time.Second)) + overlapSlack
		}
	}
	return DefaultOverlapTimeout
}

// TracksOutcomes says whether e's scheduling depends on its runs'
// outcomes.
func (e *Entry) TracksOutcomes() bool {
	return e.HoldsOverlap() || e.PauseAfterFailures > 0
}

// HoldsOverlap says whether e's overlap policy holds slots back while a
// run is unfinished (skip, buffer_one).
func (e *Entry) HoldsOverlap() bool {
	return e.Overlap != OverlapAllow && e.Overlap != ""
}
