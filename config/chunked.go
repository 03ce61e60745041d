package config

import (
	"bytes"
	"runtime"
	"sync"

	"gopkg.in/yaml.v3"
)

// entriesPerChunk is how many entries one chunk of a large config holds.
const entriesPerChunk = 2000

// parseChunked parses a large config without building one yaml.Node tree
// for the whole file: everything but the entries block is parsed as usual,
// and the entries block is cut at the lines where entries start (the
// block's own indentation) and parsed chunk by chunk, in parallel, each
// chunk's tree dropped once decoded. Node lines are shifted back to file
// lines, so errors read the same.
//
// It reports false when the file is not laid out that way, or when any
// chunk fails to parse (e.g. an alias to an anchor in another chunk) or
// its aliases expand it past the bound; the caller then parses the whole
// file, which is always right.
func (d *decoder) parseChunked(data []byte) (*Config, bool) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	start := -1
	for i, l := range lines {
		if bytes.HasPrefix(l, []byte("entries:")) {
			rest := bytes.TrimSpace(l[len("entries:"):])
			if len(rest) > 0 && rest[0] != '#' {
				return nil, false // flow style or inline value
			}
			start = i
			break
		}
	}
	if start < 0 {
		return nil, false
	}
	end := len(lines)
	indent := -1
	var starts []int // line indexes where entries begin
	for i := start + 1; i < len(lines); i++ {
		l := lines[i]
		content := bytes.TrimLeft(l, " ")
		if len(bytes.TrimSpace(content)) == 0 || content[0] == '#' {
			continue
		}
		ind := len(l) - len(content)
		if ind == 0 {
			end = i
			break
		}
		if bytes.HasPrefix(content, []byte("\t")) {
			return nil, false
		}
		if indent < 0 {
			indent = ind
		}
		switch {
		case ind < indent:
			return nil, false
		case ind == indent:
			if content[0] == '-' || content[0] == '?' || content[0] == '&' || content[0] == '*' {
				return nil, false
			}
			starts = append(starts, i)
		}
	}
	if len(starts) == 0 {
		return nil, false
	}

	// The header: the file with the entries block blanked, lines kept.
	var header bytes.Buffer
	for i, l := range lines {
		if i > start && i < end {
			header.WriteByte('\n')
			continue
		}
		header.Write(l)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(header.Bytes(), &doc); err != nil || CheckAliases(d.file, &doc) != nil {
		return nil, false
	}
	cfg, def, _ := d.header(&doc)
	if cfg == nil || len(d.errs) > 0 {
		return nil, false // let the whole-file parse report it
	}

	type chunk struct {
		first, last int // line indexes [first, last)
		node        *yaml.Node
		err         error
		done        chan struct{}
	}
	var chunks []*chunk
	for i := 0; i < len(starts); i += entriesPerChunk {
		last := end
		if j := i + entriesPerChunk; j < len(starts) {
			last = starts[j]
		}
		chunks = append(chunks, &chunk{first: starts[i], last: last, done: make(chan struct{})})
	}
	// Parse ahead on every core, but hold at most a few trees at once.
	workers := max(1, runtime.GOMAXPROCS(0))
	ahead := make(chan struct{}, workers+1)
	var wg sync.WaitGroup
	next := make(chan *chunk)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				var n yaml.Node
				c.err = yaml.Unmarshal(bytes.Join(lines[c.first:c.last], nil), &n)
				if c.err == nil && len(n.Content) == 1 && n.Content[0].Kind == yaml.MappingNode {
					shiftLines(n.Content[0], c.first)
					// Each chunk's aliases are bounded by its own size
					// (an alias cannot reach into another chunk); one
					// over it sends the file to the whole-file parse,
					// which bounds them by the file's and says where.
					c.err = CheckAliases(d.file, &n)
					c.node = n.Content[0]
				} else if c.err == nil {
					c.err = errBadChunk
				}
				close(c.done)
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		defer close(next)
		for _, c := range chunks {
			select {
			case ahead <- struct{}{}:
			case <-stop:
				return
			}
			select {
			case next <- c:
			case <-stop:
				return
			}
		}
	}()
	ok := true
	for _, c := range chunks {
		<-c.done
		<-ahead
		if c.err != nil {
			ok = false
			break
		}
		d.entries(c.node, cfg, def)
		c.node = nil
	}
	close(stop)
	wg.Wait()
	if !ok {
		return nil, false
	}
	d.finish(cfg)
	return cfg, true
}

var errBadChunk = &yaml.TypeError{Errors: []string{"chunk is not a mapping"}}

// shiftLines moves a chunk's node positions to file lines.
func shiftLines(n *yaml.Node, offset int) {
	n.Line += offset
	for _, c := range n.Content {
		shiftLines(c, offset)
	}
}
