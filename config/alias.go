package config

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// A YAML document is refused when its aliases expand it to more nodes
// than the larger of aliasFloor and aliasRatio times its own nodes.
//
// yaml.v3 caps alias expansion when it decodes into Go values, but not
// into a yaml.Node tree, which is what beatd reads: a ~400-byte document
// of nested aliases expands to tens of millions of nodes for anything that
// walks it (Kubernetes' CVE-2019-11253). The floor lets any document of
// ordinary size use aliases freely (100,000 nodes is a few MB to walk);
// the ratio lets a large file merge its defaults into every entry
// (`<<: *defaults`, a handful of nodes per entry) and still refuses a
// small document that expands a thousandfold.
const (
	aliasFloor = 100_000
	aliasRatio = 10
)

// aliasSaturate caps the sizes the count works with: nested aliases can
// describe more nodes than an int64 holds.
const aliasSaturate = 1 << 50

// CheckAliases counts what doc's aliases expand it to, before anything
// walks it, and returns an *Error at the alias where the expansion passes
// the bound (see aliasFloor), or at an alias inside the node it names (a
// cycle, which yaml.v3 builds and a walk would follow forever). Each node
// is visited once: the size of an anchored node is kept for its aliases.
// file names the document in the error.
func CheckAliases(file string, doc *yaml.Node) error {
	if doc == nil {
		return nil
	}
	own, aliases := countNodes(doc)
	if aliases == 0 {
		return nil // most documents: nothing expands
	}
	c := aliasCount{
		file:   file,
		limit:  max(aliasFloor, aliasRatio*own),
		own:    own,
		sizes:  map[*yaml.Node]int64{},
		inside: map[*yaml.Node]bool{},
	}
	c.size(doc)
	if c.err != nil {
		return c.err
	}
	return nil
}

// countNodes counts n's own nodes, aliases as one each, and its aliases.
func countNodes(n *yaml.Node) (nodes, aliases int64) {
	if n.Kind == yaml.AliasNode {
		return 1, 1
	}
	nodes = 1
	for _, c := range n.Content {
		cn, ca := countNodes(c)
		nodes += cn
		aliases += ca
	}
	return nodes, aliases
}

type aliasCount struct {
	file     string
	limit    int64
	own      int64
	expanded int64                // nodes of the document so far, aliases expanded
	sizes    map[*yaml.Node]int64 // expanded size of each anchored node
	inside   map[*yaml.Node]bool  // anchored nodes being counted (for cycles)
	err      *Error
}

// size returns n's expanded size, adding n's own nodes and what its
// aliases stand for to c.expanded; it stops at the first error.
func (c *aliasCount) size(n *yaml.Node) int64 {
	if c.err != nil || n == nil {
		return 0
	}
	if n.Kind == yaml.AliasNode {
		t := n.Alias
		if t == nil {
			return 1
		}
		if c.inside[t] {
			c.fail(n, fmt.Sprintf("alias *%s is inside the node it names, so it never ends", n.Value))
			return 0
		}
		s, ok := c.sizes[t]
		if !ok {
			// An anchor is defined before its aliases, so this is rare
			// (an alias to an anchor whose count is under way is a cycle).
			s = c.size(t)
		} else {
			c.expanded = min(c.expanded+s, aliasSaturate)
		}
		if c.expanded > c.limit {
			c.fail(n, fmt.Sprintf("aliases expand this document to more than %d nodes (it has %d of its own; the limit is the larger of %d and %d times its own)",
				c.limit, c.own, aliasFloor, aliasRatio))
		}
		return s
	}
	if s, ok := c.sizes[n]; ok {
		c.expanded = min(c.expanded+s, aliasSaturate)
		return s
	}
	if n.Anchor != "" {
		c.inside[n] = true
		defer delete(c.inside, n)
	}
	c.expanded = min(c.expanded+1, aliasSaturate)
	s := int64(1)
	for _, ch := range n.Content {
		s = min(s+c.size(ch), aliasSaturate)
		if c.err != nil {
			return 0
		}
	}
	if n.Anchor != "" {
		c.sizes[n] = s
	}
	return s
}

func (c *aliasCount) fail(n *yaml.Node, msg string) {
	if c.err == nil {
		c.err = &Error{File: c.file, Line: max(n.Line, 1), Column: max(n.Column, 1), Msg: msg}
	}
}
