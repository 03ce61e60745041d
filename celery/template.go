package celery

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Slot templating: a string in args, kwargs, options.headers or a step's
// args, kwargs and options may hold placeholders, which each fire renders
// from its slot. The syntax is deliberately small and has no expressions:
//
//	{{ slot }}             the slot, ISO 8601 in the entry's zone (2026-03-01T02:00:00+01:00)
//	{{ slot.epoch }}       the slot, Unix seconds
//	{{ slot.date }}        the slot's date in the entry's zone (2026-03-01)
//	{{ prev_slot }}        the schedule's slot before it, likewise
//	{{ prev_slot.epoch }}  (and prev_slot.date)
//	{{ name }}             the entry's name
//	{{ attempt }}          1: see Placeholders
//	{{{{                   a literal "{{"
//
// Spaces inside the braces are optional. A string that is exactly one
// placeholder becomes that value's own type: epoch and attempt an integer,
// a missing prev_slot null. Inside a longer string every placeholder is
// text, a missing prev_slot the empty string.

// Placeholders are the names a template may use. attempt is always 1:
// beatd publishes a slot once, and a slot published again (by a new
// leader after a failover, by a catch-up, by a backfill) is the same
// message with the same task id, so that consumers can deduplicate it;
// a number that grew on each of those would make them differ. Celery
// counts a task's own retries on the worker (self.request.retries).
var Placeholders = []string{"slot", "slot.epoch", "slot.date", "prev_slot", "prev_slot.epoch", "prev_slot.date", "name", "attempt"}

// SlotVars are what one fire's templates render.
type SlotVars struct {
	Name       string
	Slot, Prev time.Time // Prev zero: the schedule has no earlier slot
	Zone       *time.Location
	Attempt    int
}

// CheckTemplate reports how many placeholders s holds, or why it is not
// a valid template (an unknown placeholder, an unclosed "{{").
func CheckTemplate(s string) (int, error) {
	n := 0
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			return n, nil
		}
		s = s[i:]
		if strings.HasPrefix(s, "{{{{") {
			s = s[4:]
			continue
		}
		j := strings.Index(s, "}}")
		if j < 0 {
			return n, fmt.Errorf("unclosed %q: a placeholder is {{ slot }}, and {{{{ writes a literal {{", truncate(s, 24))
		}
		name := strings.TrimSpace(s[2:j])
		if !known(name) {
			return n, fmt.Errorf("unknown placeholder %q (known: %s; {{{{ writes a literal {{)", s[:j+2], strings.Join(Placeholders, ", "))
		}
		n++
		s = s[j+2:]
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func known(name string) bool {
	for _, p := range Placeholders {
		if p == name {
			return true
		}
	}
	return false
}

// RenderValue returns v with every templated string rendered for vars;
// values without a placeholder are shared, not copied. v must have passed
// CheckTemplate.
func RenderValue(v any, vars *SlotVars) any {
	switch v := v.(type) {
	case string:
		return renderString(v, vars)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = RenderValue(e, vars)
		}
		return out
	case *Map:
		if v == nil {
			return v
		}
		out := &Map{Keys: v.Keys, Values: make([]any, len(v.Values))}
		for i, e := range v.Values {
			out.Values[i] = RenderValue(e, vars)
		}
		return out
	}
	return v
}

func renderString(s string, vars *SlotVars) any {
	if !strings.Contains(s, "{{") {
		return s
	}
	// A string that is one placeholder takes its value's type.
	if t := strings.TrimSpace(s); strings.HasPrefix(t, "{{") && !strings.HasPrefix(t, "{{{{") && strings.HasSuffix(t, "}}") &&
		strings.Count(t, "{{") == 1 && strings.Count(t, "}}") == 1 && t == s {
		return vars.value(strings.TrimSpace(t[2 : len(t)-2]))
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		s = s[i:]
		if strings.HasPrefix(s, "{{{{") {
			b.WriteString("{{")
			s = s[4:]
			continue
		}
		j := strings.Index(s, "}}")
		if j < 0 { // cannot happen after CheckTemplate
			b.WriteString(s)
			return b.String()
		}
		switch v := vars.value(strings.TrimSpace(s[2:j])).(type) {
		case string:
			b.WriteString(v)
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		}
		s = s[j+2:]
	}
}

// value is one placeholder's value: a string, an int64, or nil for a
// missing prev_slot.
func (v *SlotVars) value(name string) any {
	zone := v.Zone
	if zone == nil {
		zone = time.UTC
	}
	at := v.Slot
	if strings.HasPrefix(name, "prev_slot") {
		if v.Prev.IsZero() {
			return nil
		}
		at = v.Prev
	}
	switch name {
	case "slot", "prev_slot":
		return string(appendISO(nil, at.In(zone)))
	case "slot.epoch", "prev_slot.epoch":
		return at.Unix()
	case "slot.date", "prev_slot.date":
		return at.In(zone).Format(time.DateOnly)
	case "name":
		return v.Name
	case "attempt":
		return int64(v.Attempt)
	}
	return nil
}

// CountPlaceholders is how many placeholders v's strings hold (v must
// have passed CheckTemplate; invalid strings count none).
func CountPlaceholders(v any) int {
	switch v := v.(type) {
	case string:
		n, _ := CheckTemplate(v)
		return n
	case []any:
		total := 0
		for _, e := range v {
			total += CountPlaceholders(e)
		}
		return total
	case *Map:
		total := 0
		for i := 0; i < v.Len(); i++ {
			total += CountPlaceholders(v.Values[i])
		}
		return total
	}
	return 0
}
