package config

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/celery"
	"gopkg.in/yaml.v3"
)

// FieldError is one problem in a single entry given as a document (JSON
// from the entries API), located by a JSON pointer (RFC 6901) into it.
type FieldError struct {
	Pointer string `json:"pointer"`
	Message string `json:"message"`
}

// FieldErrors is every problem found in one entry document.
type FieldErrors []FieldError

func (es FieldErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%q: %s", e.Pointer, e.Message)
	}
	return strings.Join(parts, "; ")
}

// ParseEntry validates one entry called name, given as a JSON (or YAML)
// document in the schema of an entry of schedules.yaml, exactly as if it
// stood in c's file: c's timezone and defaults apply, and so do all of the
// file's rules. c may be nil (no file: UTC and the built-in defaults). On
// failure the error is a FieldErrors.
func (c *Config) ParseEntry(name string, data []byte) (*Entry, error) {
	slabs := parseSlabs.Get().(*jsonSlabs)
	defer slabs.release()
	body, err := entryNode(data, slabs)
	if err != nil {
		return nil, err
	}
	loc, def := c.locationAndDefaults()
	d := &decoder{file: docFile, shared: def, opt: c.options()}
	// The name is checked by the file's own loop: a one-entry mapping.
	key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name, Line: 0, Column: 0}
	cfg := &Config{Timezone: loc}
	d.entries(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{key, body}}, cfg, def)
	if len(d.errs) > 0 {
		ptrs := pointers(body)
		out := make(FieldErrors, 0, len(d.errs))
		for _, e := range d.errs {
			p, ok := ptrs[pos{e.Line, e.Column}]
			if !ok && e.Line == 0 {
				p = "" // the entry itself (its name, a missing key)
			}
			out = append(out, FieldError{Pointer: p, Message: e.Msg})
		}
		return nil, out
	}
	if len(cfg.Entries) != 1 {
		return nil, errors.New("config: entry not decoded") // cannot happen without an error
	}
	e := cfg.Entries[0]
	e.Line, e.Column = 0, 0
	return e, nil
}

// entryNode reads an entry's document: JSON (what the entries API
// stores) on the fast path, anything else through yaml.v3.
// A JSON tree is in slabs, which the caller releases once done with it.
func entryNode(data []byte, slabs *jsonSlabs) (*yaml.Node, error) {
	if n, ok := jsonNode(data, slabs); ok {
		return n, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, FieldErrors{{Pointer: "", Message: "invalid document: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, FieldErrors{{Pointer: "", Message: "empty entry: want an object with task and a schedule"}}
	}
	if err := CheckAliases("entry", &doc); err != nil {
		e := err.(*Error)
		return nil, FieldErrors{{Pointer: "", Message: fmt.Sprintf("line %d, column %d: %s", e.Line, e.Column, e.Msg)}}
	}
	return doc.Content[0], nil
}

// WithEntries returns a copy of c (which may be nil: the built-in
// defaults) holding entries instead of c's own, sorted by name (in place,
// unless they already are). Everything else of c is kept, its timezone
// and defaults included.
func (c *Config) WithEntries(entries []*Entry) *Config {
	if c == nil {
		c = builtinDefaults
	}
	out := *c
	if out.defaults == nil {
		out.defaults = builtinDefaults.defaults
	}
	if out.Timezone == nil {
		out.Timezone = builtinDefaults.Timezone
	}
	out.Entries = entries
	if !sort.SliceIsSorted(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name }) {
		(&decoder{}).finish(&out)
	}
	return &out
}

// options are the Options c was read with (c may be nil: the defaults).
func (c *Config) options() Options {
	if c == nil {
		return Options{}
	}
	return c.opt
}

func (c *Config) locationAndDefaults() (*time.Location, *defaults) {
	if c == nil || c.defaults == nil {
		c = builtinDefaults
	}
	return c.Timezone, c.defaults
}

// builtinDefaults is a file with no timezone and no defaults.
var builtinDefaults = func() *Config {
	c, err := Parse("", []byte("entries: {}\n"))
	if err != nil {
		panic(err)
	}
	return c
}()

type pos struct{ line, col int }

// pointers maps the position of each node in an entry document to its
// JSON pointer; a key's position maps to its value's pointer, so "unknown
// key" points at the key. Deeper nodes win a shared position.
func pointers(root *yaml.Node) map[pos]string {
	out := map[pos]string{}
	var walk func(n *yaml.Node, ptr string, depth int)
	walk = func(n *yaml.Node, ptr string, depth int) {
		if n == nil || depth > 70 {
			return
		}
		out[pos{n.Line, n.Column}] = ptr
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := ptr + "/" + escapePointer(k.Value)
				out[pos{k.Line, k.Column}] = p
				walk(v, p, depth+1)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, ptr+"/"+strconv.Itoa(i), depth+1)
			}
		}
	}
	walk(root, "", 0)
	return out
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// DefaultsHash identifies c's timezone and defaults (c may be nil): entries
// parsed by ParseEntry depend on nothing else of c.
func (c *Config) DefaultsHash() [32]byte {
	_, d := c.locationAndDefaults()
	return d.hash
}

// Spec is what e's messages say, in the celery package's terms: the task,
// its arguments and send options.
func (e *Entry) Spec() *celery.Spec {
	s := &celery.Spec{Name: e.Name, Task: e.Task, Args: e.Args, Kwargs: e.Kwargs}
	if e.Options != nil {
		s.Options = *e.Options
		if s.Options.Templated {
			s.Zone, s.Prev = e.Location, prevSlot(e.Schedule)
		}
	}
	return s
}
