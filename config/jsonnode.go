package config

import (
	"encoding/json"
	"sync"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// jsonNode reads a JSON object into the yaml.Node tree that yaml.v3
// would build for it, or reports false for anything it does not take
// on: not JSON, a duplicate key, deep nesting. The caller then parses
// with yaml.v3, which gives the error or the YAML reading. A "<<" key is
// taken: quoted, it is a string to yaml.v3 too, not a merge (and
// yaml.v3 cannot read the surrogate-pair escapes Python's json.dumps
// writes, so a fallback would refuse a kwargs key "<<" next to an emoji).
//
// Why by hand: the entries API stores each entry as compact JSON, and a
// leader parses every one at start. yaml.v3's general parser was ~60% of
// the start of 300,000 entries; this one does the same work several
// times faster, and the tree it builds is the same (tags, values and
// kinds; positions are unique byte offsets on line 1, which is all the
// JSON-pointer mapping of errors needs).
//
// The tree is built in slabs (nil: slabs of its own).
func jsonNode(data []byte, slabs *jsonSlabs) (*yaml.Node, bool) {
	n := countJSONNodes(data)
	if slabs == nil {
		slabs = &jsonSlabs{}
	}
	if cap(slabs.nodes) < n {
		slabs.nodes = make([]yaml.Node, n)
	}
	// Every node but the root is in one Content, and the stack holds at
	// most every node: one slab for both.
	if cap(slabs.ptrs) < 2*n {
		slabs.ptrs = make([]*yaml.Node, 2*n)
	}
	ptrs := slabs.ptrs[:2*n]
	p := jsonParser{data: data, nodes: slabs.nodes[:0:n], ptrs: ptrs[:0:n], stack: ptrs[n:n]}
	p.ws()
	if p.i >= len(data) || data[p.i] != '{' {
		return nil, false
	}
	root, ok := p.value(0)
	if !ok {
		return nil, false
	}
	p.ws()
	return root, p.i == len(data)
}

// JSONNode reads a JSON object as JSON, into the tree yaml.v3 would build
// for it, or reports false (not a JSON object, a duplicate key, deep
// nesting: read it with yaml.v3). JSON is YAML, but yaml.v3 refuses some
// JSON (a DEL or C1 control character as itself, a surrogate-pair escape
// such as Python's json.dumps writes for an emoji) and folds a raw U+0085
// or U+2028 in a string into a space; read this way, a JSON document
// means what a JSON reader says, as in ParseEntry.
func JSONNode(data []byte) (*yaml.Node, bool) { return jsonNode(data, nil) }

// jsonSlabs are the memory of one tree: its nodes, and its Content
// slices with the parser's stack.
type jsonSlabs struct {
	nodes []yaml.Node
	ptrs  []*yaml.Node
}

// parseSlabs keeps ParseEntry's slabs from one parse to the next. A
// runtime entry's tree is ~1.9 KB, more than half of what its parse
// allocates, and dead once the entry is decoded (the entry keeps strings
// and values, never a node); a shard's load parses tens of thousands,
// and what it allocates while the collector marks the replica's heap is
// what its peak RSS holds above its live heap.
var parseSlabs = sync.Pool{New: func() any { return new(jsonSlabs) }}

// maxPooledNodes bounds the slabs kept: a large document's are dropped.
const maxPooledNodes = 256

// release clears s, so that no value of the tree stays reachable, and
// keeps it for the next parse if it is small.
func (s *jsonSlabs) release() {
	if cap(s.nodes) > maxPooledNodes {
		return
	}
	clear(s.nodes[:cap(s.nodes)])
	clear(s.ptrs[:cap(s.ptrs)])
	parseSlabs.Put(s)
}

// jsonParser builds the tree in two slabs, sized by countJSONNodes: its
// nodes, and its Content slices. A runtime entry's tree is a dozen nodes
// that live only while the entry is decoded, and allocating each (and
// growing each Content by append) was ~40% of a leader's parse garbage
// at start. The tree is used and dropped whole, so one slab keeping the
// rest alive costs nothing.
type jsonParser struct {
	data  []byte
	i     int
	nodes []yaml.Node  // the node slab
	ptrs  []*yaml.Node // the Content slab
	stack []*yaml.Node // the children of the containers being read
}

// countJSONNodes counts the nodes of a JSON document: strings (keys
// too), containers, and other scalars (each begins after ':', ',' or
// '['). A count off for input that is not JSON costs only a fresh
// allocation (jsonParser.node), never a wrong tree.
func countJSONNodes(data []byte) int {
	n := 0
	inStr, esc := false, false
	var prev byte // the last structural character outside strings
	for _, c := range data {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
			n++
		case '{', '[':
			n++
			prev = c
		case ':', ',':
			prev = c
		case '}', ']':
			prev = 0
		case ' ', '\t', '\n', '\r':
		default:
			if prev == ':' || prev == ',' || prev == '[' {
				n++
			}
			prev = 0
		}
	}
	return n
}

// maxJSONDepth bounds nesting; deeper documents go to yaml.v3 (and its
// own limits).
const maxJSONDepth = 64

func (p *jsonParser) ws() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) node(kind yaml.Kind, tag string, at int) *yaml.Node {
	if len(p.nodes) == cap(p.nodes) {
		// Past the count (not JSON): a new slab, so that the nodes
		// already handed out are not copied.
		p.nodes = make([]yaml.Node, 0, 8)
	}
	p.nodes = append(p.nodes, yaml.Node{Kind: kind, Tag: tag, Line: 1, Column: at + 1})
	return &p.nodes[len(p.nodes)-1]
}

// content moves the children pushed since base off the stack into the
// Content slab.
func (p *jsonParser) content(base int) []*yaml.Node {
	kids := p.stack[base:]
	if len(kids) == 0 {
		return nil
	}
	if cap(p.ptrs)-len(p.ptrs) < len(kids) {
		p.ptrs = make([]*yaml.Node, 0, max(len(kids), 8))
	}
	at := len(p.ptrs)
	p.ptrs = append(p.ptrs, kids...)
	p.stack = p.stack[:base]
	return p.ptrs[at:len(p.ptrs):len(p.ptrs)]
}

func (p *jsonParser) value(depth int) (*yaml.Node, bool) {
	if depth > maxJSONDepth || p.i >= len(p.data) {
		return nil, false
	}
	at := p.i
	switch c := p.data[p.i]; {
	case c == '{':
		p.i++
		n := p.node(yaml.MappingNode, "!!map", at)
		n.Style = yaml.FlowStyle
		p.ws()
		if p.i < len(p.data) && p.data[p.i] == '}' {
			p.i++
			return n, true
		}
		base := len(p.stack)
		for {
			p.ws()
			if p.i >= len(p.data) || p.data[p.i] != '"' {
				return nil, false
			}
			k, ok := p.str()
			if !ok {
				return nil, false
			}
			for j := base; j < len(p.stack); j += 2 {
				if p.stack[j].Value == k.Value {
					return nil, false
				}
			}
			p.ws()
			if p.i >= len(p.data) || p.data[p.i] != ':' {
				return nil, false
			}
			p.i++
			p.ws()
			v, ok := p.value(depth + 1)
			if !ok {
				return nil, false
			}
			p.stack = append(p.stack, k, v)
			p.ws()
			if p.i >= len(p.data) {
				return nil, false
			}
			if p.data[p.i] == '}' {
				p.i++
				n.Content = p.content(base)
				return n, true
			}
			if p.data[p.i] != ',' {
				return nil, false
			}
			p.i++
		}
	case c == '[':
		p.i++
		n := p.node(yaml.SequenceNode, "!!seq", at)
		n.Style = yaml.FlowStyle
		p.ws()
		if p.i < len(p.data) && p.data[p.i] == ']' {
			p.i++
			return n, true
		}
		base := len(p.stack)
		for {
			p.ws()
			v, ok := p.value(depth + 1)
			if !ok {
				return nil, false
			}
			p.stack = append(p.stack, v)
			p.ws()
			if p.i >= len(p.data) {
				return nil, false
			}
			if p.data[p.i] == ']' {
				p.i++
				n.Content = p.content(base)
				return n, true
			}
			if p.data[p.i] != ',' {
				return nil, false
			}
			p.i++
		}
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(p.data)-p.i >= len(lit) && string(p.data[p.i:p.i+len(lit)]) == lit {
				p.i += len(lit)
				return p.plain(lit, at), true
			}
		}
		return nil, false
	}
}

// plain is a scalar yaml.v3 reads unquoted: its tag is what YAML's
// resolution gives the text (!!int, !!float, !!bool, !!null).
func (p *jsonParser) plain(text string, at int) *yaml.Node {
	n := p.node(yaml.ScalarNode, "", at)
	n.Value = text
	n.Tag = n.ShortTag()
	return n
}

func (p *jsonParser) str() (*yaml.Node, bool) {
	at := p.i
	p.i++ // the opening quote
	escaped := false
	for p.i < len(p.data) {
		switch c := p.data[p.i]; {
		case c == '"':
			raw := p.data[at : p.i+1]
			p.i++
			n := p.node(yaml.ScalarNode, "!!str", at)
			n.Style = yaml.DoubleQuotedStyle
			if !escaped {
				if !utf8.Valid(raw) {
					return nil, false // yaml.v3 refuses it; let it say so
				}
				n.Value = string(raw[1 : len(raw)-1])
				return n, true
			}
			if !utf8.Valid(raw) || json.Unmarshal(raw, &n.Value) != nil {
				return nil, false
			}
			return n, true
		case c == '\\':
			escaped = true
			p.i += 2
		case c < 0x20:
			return nil, false
		default:
			p.i++
		}
	}
	return nil, false
}

func (p *jsonParser) number() (*yaml.Node, bool) {
	at := p.i
	digits := func() bool {
		start := p.i
		for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
			p.i++
		}
		return p.i > start
	}
	if p.data[p.i] == '-' {
		p.i++
	}
	intStart := p.i
	if !digits() {
		return nil, false
	}
	if p.i-intStart > 1 && p.data[intStart] == '0' {
		return nil, false // not JSON (and YAML would read it as octal)
	}
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		if !digits() {
			return nil, false
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if !digits() {
			return nil, false
		}
	}
	return p.plain(string(p.data[at:p.i]), at), true
}
