package migrate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/beatd/beatd/config"
)

// signature is a Celery signature as celery_dump.py writes it: the dict
// a Signature is.
type signature struct {
	Task        string          `json:"task"`
	Args        json.RawMessage `json:"args"`
	Kwargs      json.RawMessage `json:"kwargs"`
	Options     json.RawMessage `json:"options"`
	SubtaskType *string         `json:"subtask_type"`
	Immutable   bool            `json:"immutable"`
}

// celeryChain is the task add_periodic_task(schedule, chain(a, b, c))
// makes celery beat send: celery.chain with the steps in kwargs.tasks.
const celeryChain = "celery.chain"

// unchain rewrites an entry that sends celery.chain as beatd's own chain:
// the first step is the entry's task, the rest its chain. It reports
// false (and leaves e alone) when the steps cannot be read as plain
// signatures.
func unchain(e *Entry) (steps []signature, ok bool) {
	if e.Task != celeryChain {
		return nil, false
	}
	var kw struct {
		Tasks []signature `json:"tasks"`
	}
	if json.Unmarshal(e.Kwargs, &kw) != nil || len(kw.Tasks) < 2 {
		return nil, false
	}
	for _, s := range kw.Tasks {
		if s.Task == "" || s.SubtaskType != nil {
			return nil, false // a group or chord inside: beatd chains tasks only
		}
	}
	first := kw.Tasks[0]
	e.Task, e.Args, e.Kwargs = first.Task, first.Args, first.Kwargs
	return kw.Tasks[1:], true
}

// callbacks reads an option link or link_error: one signature or a list.
func callbacks(raw json.RawMessage) ([]signature, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '{' {
		raw = append(append([]byte{'['}, raw...), ']')
	}
	var out []signature
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("not a signature or a list of them")
	}
	for _, s := range out {
		if s.Task == "" || s.SubtaskType != nil {
			return nil, fmt.Errorf("a %s, not a task's signature", subtask(s))
		}
	}
	return out, nil
}

func subtask(s signature) string {
	if s.SubtaskType != nil {
		return *s.SubtaskType
	}
	return "signature without a task"
}

// stepsYAML writes steps as schedules.yaml's flow list, each step with
// the keys beatd reads; the whole entry is checked by config later.
func stepsYAML(steps []signature) (string, error) {
	var parts []string
	for _, s := range steps {
		fields := []string{"task: " + quote(s.Task)}
		for _, f := range []struct {
			key   string
			raw   json.RawMessage
			empty string
		}{{"args", s.Args, "[]"}, {"kwargs", s.Kwargs, "{}"}, {"options", s.Options, "{}"}} {
			if v := strings.TrimSpace(string(f.raw)); v == "" || v == f.empty || v == "null" {
				continue
			}
			c, err := canonical(f.raw)
			if err != nil {
				return "", fmt.Errorf("%s: %w", f.key, err)
			}
			fields = append(fields, f.key+": "+c)
		}
		if s.Immutable {
			fields = append(fields, "immutable: true")
		}
		parts = append(parts, "{"+strings.Join(fields, ", ")+"}")
	}
	return "[" + strings.Join(parts, ", ") + "]", nil
}

// canvas adds the entry's chain, link and link_error, from a celery.chain
// task or the link and link_error options. A step beatd cannot send (a
// group, a chord, an option it does not carry) drops the callback or
// chain with a warning, not the entry.
func (c *conv) canvas(add func(string, ...any), chain []signature) {
	lines := map[string]string{}
	if len(chain) > 0 {
		if y, err := stepsYAML(chain); err == nil {
			lines["chain"] = y
		}
	}
	for _, o := range c.e.Options {
		if o.Key != "link" && o.Key != "link_error" {
			continue
		}
		steps, err := callbacks(o.Value)
		if err == nil {
			var y string
			if y, err = stepsYAML(steps); err == nil {
				lines[o.Key] = y
			}
		}
		if err != nil {
			// One line, for the warning and the YAML comment: the dump is
			// indented.
			var buf bytes.Buffer
			v := strings.TrimSpace(string(o.Value))
			if json.Compact(&buf, o.Value) == nil {
				v = buf.String()
			}
			if r := []rune(v); len(r) > 120 {
				v = string(r[:120]) + "…"
			}
			c.warn("option %s=%s not imported: %v", o.Key, v, err)
			c.note("not imported: option %s=%s (%v)", o.Key, v, err)
		}
	}
	for _, k := range []string{"chain", "link", "link_error"} {
		y, ok := lines[k]
		if !ok {
			continue
		}
		probe := "entries:\n  x: {task: t, every: 1s, " + k + ": " + y + "}\n"
		if _, err := config.Parse("option", []byte(probe)); err != nil {
			c.warn("%s not imported: %s", k, optionError(err))
			c.note("not imported: %s (%s)", k, optionError(err))
			continue
		}
		add("%s: %s", k, y)
	}
}
