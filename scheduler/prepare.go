package scheduler

import (
	"time"

	"github.com/beatd/beatd/celery"
)

// keepTemplate is the longest gap to an entry's next slot for which its
// compiled message template is kept between fires: an entry that fires
// every few seconds reuses it, one that fires every minute or less often
// compiles it again (a few µs) rather than hold ~1.7 KB until then. At a
// million tenants' entries (~300 fires/s) the compiles cost ~1 ms a
// second; the 120,000 of them firing every 1–5 min held 200 MB of
// templates at 5 min.
const keepTemplate = 30 * time.Second

// dropTemplate forgets p's entry's template once published, unless its
// next slot is near.
func (l *loop) dropTemplate(p pendingFire) {
	if p.e.task == nil {
		return
	}
	if it := p.e.it; it == nil || it.e != p.e || it.slot.Sub(p.slot) > keepTemplate {
		p.e.task = nil
	}
}

// Templates of the slots due within prepareAhead are compiled while the
// loop is idle, prepareBatch at a time (~6 ms), prepareAgain apart when
// more are left. At a million entries most fires have no template
// (keepTemplate), and a crontab's minute makes thousands due at once: a
// compile each (~11 µs) was most of that burst's time, and its p99 lag.
const (
	prepareAhead = time.Second
	prepareBatch = 512
	prepareAgain = time.Millisecond
	// prepareEvery is how often the walk runs when it left nothing: it
	// visits every slot due within prepareAhead, and an idle loop wakes
	// for each due slot.
	prepareEvery = 100 * time.Millisecond
)

// prepWalk is prepare's, kept between calls: its walk's stack, when it
// last ran, and whether it left templates to compile.
type prepWalk struct {
	stack []int
	at    time.Time
	more  bool
}

// prepare compiles the templates of the slots due by now+prepareAhead,
// up to prepareBatch of them; more says some are left. It walks only
// the heap's top: a node due later than that has no child due sooner.
func (l *loop) prepare(now time.Time) (more bool) {
	if !l.prep.more && now.Sub(l.prep.at) < prepareEvery && !now.Before(l.prep.at) {
		return false
	}
	l.prep.at = now
	l.prep.more = l.prepareUpTo(now.Add(prepareAhead))
	return l.prep.more
}

func (l *loop) prepareUpTo(horizon time.Time) (more bool) {
	h := dueNs(horizon)
	if len(l.heap) == 0 || l.heap[0].due > h {
		return false
	}
	stack := append(l.prep.stack[:0], 0)
	n := 0
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		it := l.heap[i]
		if it.due > h {
			continue
		}
		if it.e.task == nil {
			if n == prepareBatch {
				l.prep.stack = stack[:0]
				return true
			}
			l.compiled(it.e)
			n++
		}
		for c := 2*i + 1; c <= 2*i+2 && c < len(l.heap); c++ {
			stack = append(stack, c)
		}
	}
	l.prep.stack = stack[:0]
	return false
}

// compiled returns e's message template, compiling it on first use.
// Reload validated the entry, so compiling cannot fail.
func (l *loop) compiled(e *entry) *celery.Task {
	if e.task == nil {
		t, err := celery.Compile(e.Entry.Spec(), l.s.cfg.Cluster, l.s.cfg.Origin, l.s.cfg.KombuPrefix)
		if err != nil {
			panic("scheduler: validated entry failed to compile: " + err.Error())
		}
		e.task = t
	}
	return e.task
}
