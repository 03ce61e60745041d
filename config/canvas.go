package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/schedule"
	"gopkg.in/yaml.v3"
)

// The keys of one step of chain, link or link_error: a Celery signature.
var (
	stepKeys       = []string{"task", "args", "kwargs", "options", "immutable"}
	stepOptionKeys = []string{"queue", "exchange", "routing_key", "priority", "expires", "headers",
		"time_limit", "soft_time_limit", "ignore_result"}
)

// canvas reads an entry's chain, link and link_error (nil when it has
// none) and how many placeholders their values hold.
func (d *decoder) canvas(f fieldSet, name string) (*celery.Canvas, int) {
	var c celery.Canvas
	holes := 0
	if v, ok := f.get("chain"); ok {
		n := deref(v.val)
		switch {
		case n.Kind != yaml.SequenceNode:
			d.errorf(n, "entry %q: chain must be a list of steps, each a mapping with task (and args, kwargs, options, immutable)", name)
		case len(n.Content) == 0:
			d.errorf(n, "entry %q: chain is empty: leave it out, or list the steps that run after task", name)
		case len(n.Content) > celery.MaxChainSteps:
			d.errorf(n.Content[celery.MaxChainSteps], "entry %q: chain has %d steps; at most %d may follow task", name, len(n.Content), celery.MaxChainSteps)
		default:
			for i, sn := range n.Content {
				s, h := d.step(sn, fmt.Sprintf("entry %q chain step %d", name, i+1))
				c.Chain = append(c.Chain, s)
				holes += h
			}
		}
	}
	for _, k := range []string{"link", "link_error"} {
		v, ok := f.get(k)
		if !ok {
			continue
		}
		n := deref(v.val)
		items := []*yaml.Node{n}
		if n.Kind == yaml.SequenceNode {
			items = n.Content
			if len(items) == 0 {
				d.errorf(n, "entry %q: %s is empty: leave it out, or give a step (a mapping with task)", name, k)
			}
		}
		if len(items) > celery.MaxCallbacks {
			d.errorf(items[celery.MaxCallbacks], "entry %q: %s has %d steps; at most %d", name, k, len(items), celery.MaxCallbacks)
			continue
		}
		var steps []celery.Step
		for i, sn := range items {
			what := fmt.Sprintf("entry %q %s", name, k)
			if n.Kind == yaml.SequenceNode {
				what = fmt.Sprintf("entry %q %s step %d", name, k, i+1)
			}
			s, h := d.step(sn, what)
			steps = append(steps, s)
			holes += h
		}
		if k == "link" {
			c.Link = steps
		} else {
			c.LinkError = steps
		}
	}
	if len(c.Chain) == 0 && len(c.Link) == 0 && len(c.LinkError) == 0 {
		return nil, holes
	}
	out := c // c itself stays on the stack: most entries have no canvas
	return &out, holes
}

// step reads one signature: task (required), args, kwargs, options (kept
// as written: the worker passes them to apply_async) and immutable.
func (d *decoder) step(n *yaml.Node, what string) (celery.Step, int) {
	var s celery.Step
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s must be a mapping with task (and args, kwargs, options, immutable)", what)
		return s, 0
	}
	f := d.fields(n, what, stepKeys)
	if f == nil {
		return s, 0
	}
	holes := 0
	if v, ok := f.get("task"); ok {
		s.Task = internTask(scalar(v.val))
		if deref(v.val).Tag != "!!str" || strings.TrimSpace(s.Task) == "" {
			d.errorf(v.val, "%s: task must be a non-empty string naming a Celery task", what)
		}
	} else {
		d.errorf(n, "%s: missing key task: every step names the Celery task it sends", what)
	}
	if v, ok := f.get("args"); ok {
		if an := deref(v.val); an.Kind == yaml.SequenceNode {
			if val, ok := d.value(an); ok {
				s.Args = val.([]any)
			}
			holes += d.placeholders(an, 0)
		} else if !(an.Kind == yaml.ScalarNode && an.Tag == "!!null") {
			d.errorf(an, "%s: args must be a list", what)
		}
	}
	if v, ok := f.get("kwargs"); ok {
		if kn := deref(v.val); kn.Kind == yaml.MappingNode {
			if val, ok := d.value(kn); ok {
				s.Kwargs = val.(*celery.Map)
			}
			holes += d.placeholders(kn, 0)
		} else if !(kn.Kind == yaml.ScalarNode && kn.Tag == "!!null") {
			d.errorf(kn, "%s: kwargs must be a mapping", what)
		}
	}
	if v, ok := f.get("immutable"); ok {
		s.Immutable, _ = d.boolean(v.val, what+": immutable")
	}
	if v, ok := f.get("options"); ok {
		of := d.fields(v.val, what+" options", stepOptionKeys)
		if len(of) > 0 {
			s.Options, holes = d.stepOptions(deref(v.val), of, what), holes+d.placeholders(deref(v.val), 0)
		}
	}
	return s, holes
}

// stepOptions checks a step's options as the entry's own are checked, and
// keeps them as written, in order.
func (d *decoder) stepOptions(n *yaml.Node, f fieldSet, what string) *celery.Map {
	ok := true
	for _, fv := range f {
		k, vn := fv.key.Value, deref(fv.val)
		switch k {
		case "queue", "exchange", "routing_key":
			if vn.Kind != yaml.ScalarNode || vn.Tag != "!!str" || vn.Value == "" {
				d.errorf(vn, "%s: options.%s must be a non-empty string", what, k)
				ok = false
			}
		case "priority":
			if p, good := d.integer(vn, what+": options.priority"); !good {
				ok = false
			} else if p < 0 || p > 9 {
				d.errorf(vn, "%s: options.priority must be between 0 and 9, got %d", what, p)
				ok = false
			}
		case "expires":
			// Relative seconds: the worker sends the step when the step
			// before it ends, so an absolute time would mean little.
			if sec, good := d.number(vn, what+": options.expires"); !good {
				ok = false
			} else if sec <= 0 || time.Duration(sec*float64(time.Second)) > MaxDuration {
				d.errorf(vn, "%s: options.expires must be seconds, above 0 and at most %s", what, MaxDuration)
				ok = false
			}
		case "time_limit", "soft_time_limit":
			ok = d.timeLimit(vn, what+": options."+k) && ok
		case "ignore_result":
			_, good := d.boolean(vn, what+": options.ignore_result")
			ok = ok && good
		case "headers":
			if vn.Kind != yaml.MappingNode {
				d.errorf(vn, "%s: options.headers must be a mapping", what)
				ok = false
			}
		}
	}
	if !ok {
		return nil
	}
	v, good := d.value(n)
	if !good {
		return nil
	}
	return v.(*celery.Map)
}

// placeholders counts the slot placeholders in n's strings (mapping keys
// are not templated), reporting each bad template at its node.
func (d *decoder) placeholders(n *yaml.Node, depth int) int {
	n = deref(n)
	if n == nil || depth > 64 {
		return 0
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag != "!!str" || !strings.Contains(n.Value, "{{") {
			return 0
		}
		c, err := celery.CheckTemplate(n.Value)
		if err != nil {
			d.errorf(n, "%v", err)
		}
		return c
	case yaml.SequenceNode:
		total := 0
		for _, c := range n.Content {
			total += d.placeholders(c, depth+1)
		}
		return total
	case yaml.MappingNode:
		total := 0
		for i := 1; i < len(n.Content); i += 2 {
			total += d.placeholders(n.Content[i], depth+1)
		}
		return total
	}
	return 0
}

// maxPlaceholders bounds an entry's placeholders: each renders at every
// fire, and each may grow the message (by up to the name's length).
const maxPlaceholders = 64

// placeholderGrowth is the most one placeholder adds to a message's JSON:
// a time with microseconds and offset, or the entry's name.
func placeholderGrowth(name string) int {
	return max(40, celery.JSONSize(name, -1))
}

// prevSlot is the slot of s before a given slot, ignoring start_at,
// end_at and exclusions (the schedule's grid): what a templated entry's
// prev_slot renders. Zero when there is none within ten years.
func prevSlot(s schedule.Schedule) func(time.Time) time.Time {
	s = schedule.Base(s)
	if nb, ok := s.(*schedule.NotBefore); ok {
		s = nb.Schedule
	}
	if ev, ok := s.(*schedule.Every); ok {
		// Its grid is anchor + k·interval whatever the anchor.
		return func(slot time.Time) time.Time { return slot.Add(-ev.Interval) }
	}
	return func(slot time.Time) time.Time {
		// Widen the window back from slot until it holds a slot, then walk
		// it forward: the window is less than twice the gap, so the walk
		// visits few slots.
		for back := time.Second; back <= MaxDuration; back *= 2 {
			t := s.Next(slot.Add(-back - time.Nanosecond))
			if t.IsZero() || !t.Before(slot) {
				continue
			}
			for {
				n := s.Next(t)
				if n.IsZero() || !n.Before(slot) {
					return t
				}
				t = n
			}
		}
		return time.Time{}
	}
}

// Templated reports whether e's values hold slot placeholders.
func (e *Entry) Templated() bool { return e.Options != nil && e.Options.Templated }

// Canvas is e's chain and callbacks, nil for none.
func (e *Entry) Canvas() *celery.Canvas {
	if e.Options == nil {
		return nil
	}
	return e.Options.Canvas
}

// Render returns e's args and kwargs as the message of slot carries
// them: its placeholders rendered as a publish renders them.
func (e *Entry) Render(slot time.Time) ([]any, *celery.Map) {
	if !e.Templated() {
		return e.Args, e.Kwargs
	}
	s := e.Spec()
	vars := &celery.SlotVars{Name: e.Name, Slot: slot, Prev: s.Prev(slot), Zone: e.Location, Attempt: 1}
	args, _ := celery.RenderValue(e.Args, vars).([]any)
	kwargs, _ := celery.RenderValue(e.Kwargs, vars).(*celery.Map)
	return args, kwargs
}

// Workflow names e's tasks in the order they run, for people: "a → b →
// c", then "; link: d" and "; link_error: e" when set.
func (e *Entry) Workflow() string {
	c := e.Canvas()
	if c == nil {
		return e.Task
	}
	names := func(steps []celery.Step) []string {
		out := make([]string, len(steps))
		for i, s := range steps {
			out[i] = s.Task
		}
		return out
	}
	w := strings.Join(append([]string{e.Task}, names(c.Chain)...), " → ")
	if len(c.Link) > 0 {
		w += "; link: " + strings.Join(names(c.Link), ", ")
	}
	if len(c.LinkError) > 0 {
		w += "; link_error: " + strings.Join(names(c.LinkError), ", ")
	}
	return w
}

// StepWords names step n (0: its task) of a run of e whose message
// chained chain steps, for people: "step 2/3 etl.transform", counting e's
// task as step 1. The task's name is left out when e is nil or its chain
// is no longer the run's.
func StepWords(e *Entry, chain, n int) string {
	w := fmt.Sprintf("step %d/%d", n+1, chain+1)
	if e == nil || e.Canvas() == nil || len(e.Canvas().Chain) != chain || n < 0 || n > chain {
		return w
	}
	if n == 0 {
		return w + " " + e.Task
	}
	return w + " " + e.Canvas().Chain[n-1].Task
}
