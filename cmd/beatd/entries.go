package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/tlsfiles"
	"gopkg.in/yaml.v3"
)

// runEntries is `beatd entries list|get|apply|delete`: the entries API
// from the command line, kubectl-style.
func runEntries(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, `usage:
  beatd entries list [-o table|json|yaml] [--name-prefix P] [--task T] [--queue Q] [--limit N]
                                   (read page by page; --limit stops after N entries)
  beatd entries get NAME [-o yaml|json]
  beatd entries apply -f FILE [--atomic]
                                   (entries: {NAME: ENTRY, ...}; in transactions of 128 entries,
                                   or with --atomic in one, which takes at most 128)
  beatd entries delete NAME
flags: --etcd-endpoints URLS, --prefix P (the cluster, whose leader's HTTP address is in etcd;
       --timeout D to find it),
       --server URL (BEATD_SERVER: this replica instead of the leader),
       --token-file FILE (else BEATD_TOKEN, else BEATD_ADMIN_TOKEN),
       --server-cacert FILE (an https server's CA), --note TEXT (why, for the audit trail)`)
		return 2
	}
	if code, done := subcommandHelp(args, usage); done {
		return code
	}
	verb := args[0]
	fs := flagenv.New("entries "+verb, stderr)
	target := newAPITarget()
	target.register(fs)
	output := fs.StringP("output", "o", "", "output format: table (list only), json or yaml")
	file := fs.StringP("filename", "f", "", "apply: the file of entries (- for stdin)")
	note := fs.String("note", "", "why: kept in the audit trail with each change")
	// Not --prefix: that is the cluster's etcd prefix, on every command.
	namePrefix := fs.String("name-prefix", "", "list: only entries whose names start with this")
	task := fs.String("task", "", "list: only running entries of this task")
	queue := fs.String("queue", "", "list: only running entries of this queue")
	limit := fs.Int("limit", 0, "list: at most this many entries (0: all)")
	timeout := fs.Duration("timeout", defaultTimeout, "deadline for finding the leader in etcd (each request has its own)")
	atomic := fs.Bool("atomic", false, "apply: all entries in one etcd transaction, all or none (at most 128 entries: etcd's default --max-txn-ops)")
	if err := flagenv.Parse(fs, args[1:]); err != nil { // pflag takes flags among the arguments
		return exitCode(err)
	}
	pos := fs.Args()
	switch {
	case verb == "apply" && len(pos) == 0 && *file != "":
	case verb == "list" && len(pos) == 0:
	case (verb == "get" || verb == "delete") && len(pos) == 1:
	default:
		return usage() // before finding the cluster: nothing to send
	}
	cl, err := target.client(ctx, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "beatd entries:", termErr(err))
		return 1
	}
	c := &entriesClient{base: cl.base + "/api/v1/entries", token: cl.token, note: *note, http: cl.http, via: cl.via}
	if verb == "apply" {
		// Each transaction has its own deadline: a large file takes many.
		if len(pos) == 0 && *file != "" {
			err = c.apply(ctx, stdout, *file, *atomic)
		} else {
			return usage()
		}
		if err != nil {
			fmt.Fprintln(stderr, "beatd entries apply:", termErr(err))
			return 1
		}
		return 0
	}
	if verb == "list" && len(pos) == 0 {
		// Each page has its own deadline: a million entries take many.
		if err := c.list(ctx, stdout, *output, api.ListQuery{Prefix: *namePrefix, Task: *task, Queue: *queue, Limit: *limit}); err != nil {
			fmt.Fprintln(stderr, "beatd entries list:", termErr(err))
			return 1
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	switch {
	case verb == "get" && len(pos) == 1:
		err = c.get(ctx, stdout, pos[0], *output)
	case verb == "delete" && len(pos) == 1:
		if err = c.do(ctx, "DELETE", "/"+pos[0], nil, nil); err == nil {
			fmt.Fprintf(stdout, "entry %s deleted\n", term(pos[0]))
		}
	default:
		return usage()
	}
	if err != nil {
		fmt.Fprintln(stderr, "beatd entries "+term(verb)+":", termErr(err))
		return 1
	}
	return 0
}

// entriesClient is a client of beatd's HTTP API (the entries API and
// the rest under /api/v1).
type entriesClient struct {
	base, token string
	note        string // sent with each change, for the audit trail
	http        *http.Client
	// via is where base came from: "--server", or "etcd" (the leader's
	// registration).
	via string
}

// newAPIClient is a client of the API at server, with the token from
// tokenFile, else BEATD_TOKEN, else BEATD_ADMIN_TOKEN; caFile verifies an
// https server (default: the system's roots).
func newAPIClient(server, tokenFile, caFile string) (*entriesClient, error) {
	token, err := etcdflags.Secret(tokenFile, "BEATD_TOKEN")
	if err != nil {
		return nil, err
	}
	if token == "" {
		token = os.Getenv("BEATD_ADMIN_TOKEN")
	}
	hc, err := cliHTTP(caFile)
	if err != nil {
		return nil, err
	}
	return &entriesClient{base: strings.TrimRight(server, "/"), token: token, http: hc}, nil
}

// cliHTTP is the CLI's HTTP client: it trusts caFile when given.
func cliHTTP(caFile string) (*http.Client, error) {
	if caFile == "" {
		return http.DefaultClient, nil
	}
	pool, err := tlsfiles.Pool(caFile)
	if err != nil {
		return nil, fmt.Errorf("--server-cacert: %w", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}}, nil
}

// serverCACertHelp is --server-cacert's help, the same on every command.
const serverCACertHelp = "CA bundle to verify an https --server (or the leader's https status URL); default the system's roots"

// do sends a request and decodes a JSON answer into out; an error answer
// becomes an error listing its JSON pointers.
func (c *entriesClient) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set(api.ClientHeader, "cli")
	if c.note != "" {
		req.Header.Set(api.NoteHeader, c.note)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return unreachable(req.URL, c.via, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("beatd at %s: %s: reading the answer: %w", serverOf(req.URL), resp.Status, err)
	}
	if resp.StatusCode >= 300 {
		return answerError(resp.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// answerError is the error of an answer with an error status: the
// status, then the server's reason, whatever shape its body has: the
// API's {"errors": [{pointer, message}]}, {"error": "..."}, plain text,
// or nothing.
func answerError(status string, body []byte) error {
	var e struct {
		Errors     []config.FieldError `json:"errors"`
		Error      string              `json:"error"`
		MaxEntries int                 `json:"max_entries"`
	}
	text := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) != nil {
		e.Errors, e.Error = nil, ""
	}
	lines := []string{status}
	for _, fe := range e.Errors {
		switch {
		case fe.Pointer != "" && fe.Message != "":
			lines = append(lines, fmt.Sprintf("  %s: %s", fe.Pointer, fe.Message))
		case fe.Message != "":
			lines = append(lines, "  "+fe.Message)
		}
	}
	switch {
	case len(lines) > 1:
	case e.Error != "":
		lines = append(lines, "  "+e.Error)
	case text != "":
		if r := []rune(text); len(r) > 2000 {
			text = string(r[:2000]) + "…"
		}
		lines = append(lines, "  "+text)
	default:
		lines[0] += " (the server gave no reason)"
	}
	return &serverError{msg: strings.Join(lines, "\n"), maxEntries: e.MaxEntries}
}

// unreachable is the error of a request that got no answer: it names
// the server and where its address comes from (via: "etcd" for the
// leader's registration).
func unreachable(u *url.URL, via string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, context.DeadlineExceeded) {
		if via == "etcd" {
			return fmt.Errorf("no answer from beatd at %s, the address the leader registered in etcd (is it reachable from here? --server or BEATD_SERVER give another): %w", serverOf(u), err)
		}
		return fmt.Errorf("no answer from beatd at %s (is it running? --server or BEATD_SERVER give beatd's HTTP address): %w", serverOf(u), err)
	}
	return fmt.Errorf("beatd at %s: %w", serverOf(u), err)
}

// serverOf is the scheme and host of a request's URL.
func serverOf(u *url.URL) string { return u.Scheme + "://" + u.Host }

func (c *entriesClient) list(ctx context.Context, w io.Writer, output string, q api.ListQuery) error {
	switch output {
	case "", "table", "json", "yaml":
	default:
		return fmt.Errorf("-o must be table, json or yaml")
	}
	// Pages of the server's size; a table is printed as they come, json
	// and yaml at the end (one document).
	var all []api.Entry
	var tw *tabwriter.Writer
	if output == "" || output == "table" {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSOURCE\tTASK\tSCHEDULE\tSTATE\tNEXT RUN")
	}
	left := q.Limit
	after := ""
	for {
		v := url.Values{}
		for k, s := range map[string]string{"prefix": q.Prefix, "task": q.Task, "queue": q.Queue, "after": after} {
			if s != "" {
				v.Set(k, s)
			}
		}
		if left > 0 {
			v.Set("limit", strconv.Itoa(min(left, api.MaxPageLimit)))
		}
		path := ""
		if len(v) > 0 {
			path = "?" + v.Encode()
		}
		var page api.Page
		pctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := c.do(pctx, "GET", path, nil, &page)
		cancel()
		if err != nil {
			return err
		}
		if left > 0 && len(page.Entries) > left {
			page.Entries = page.Entries[:left]
		}
		if tw != nil {
			printEntryRows(tw, page.Entries)
		} else {
			all = append(all, page.Entries...)
		}
		if left > 0 {
			if left -= len(page.Entries); left <= 0 {
				break
			}
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	switch {
	case tw != nil:
		return tw.Flush()
	case output == "json":
		return printJSON(w, api.Page{Entries: all})
	default:
		return printYAML(w, api.Page{Entries: all})
	}
}

func printEntryRows(tw *tabwriter.Writer, entries []api.Entry) {
	for _, e := range entries {
		state := "enabled"
		switch {
		case e.Problem != "":
			state = e.Problem
		case e.Paused:
			state = "paused"
		case !e.Enabled:
			state = "disabled"
		}
		next := "-"
		if len(e.NextRuns) > 0 {
			next = e.NextRuns[0].Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", dash(e.Name), dash(e.Source), dash(e.Task), dash(e.Schedule), dash(state), next)
	}
}

func (c *entriesClient) get(ctx context.Context, w io.Writer, name, output string) error {
	var e api.Entry
	if err := c.do(ctx, "GET", "/"+name, nil, &e); err != nil {
		return err
	}
	switch output {
	case "json":
		return printJSON(w, e)
	case "yaml", "":
		return printYAML(w, e)
	}
	return fmt.Errorf("-o must be yaml or json")
}

// apply sends a file of entries (a mapping under entries:, as in
// schedules.yaml): in one transaction when atomic or when it fits one,
// else in transactions of api.MaxApplyEntries, with progress.
func (c *entriesClient) apply(ctx context.Context, w io.Writer, path string, atomic bool) error {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return err
	}
	entries, err := applyEntries(w, path, data)
	if err != nil {
		return err
	}
	if len(entries.Content) == 0 {
		return fmt.Errorf("%s: no runtime entries to apply", path)
	}
	total := len(entries.Content) / 2
	chunk := api.MaxApplyEntries
	if atomic || total <= chunk {
		// One transaction: all or none (the server states its limit;
		// without --atomic a lower one splits the file).
		names, err := c.applyChunk(ctx, path, entries.Content)
		limit, lower := smallerChunk(err, total)
		if atomic || !lower {
			if err != nil {
				return err
			}
			for _, n := range names {
				fmt.Fprintf(w, "entry %s applied\n", term(n))
			}
			return nil
		}
		chunk = limit
	}
	// The first chunk alone: a server whose etcd takes fewer operations a
	// transaction says how many, and the file is split by that.
	first := entries.Content[:min(2*chunk, len(entries.Content))]
	_, err = c.applyChunk(ctx, path, first)
	if limit, lower := smallerChunk(err, chunk); lower {
		chunk = limit
		first = entries.Content[:2*chunk]
		_, err = c.applyChunk(ctx, path, first)
	}
	if err != nil {
		return fmt.Errorf("after 0 of %d entries applied: %w", total, err)
	}
	// The rest in transactions of chunk entries, applyParallel at a time: what is
	// applied stays applied if a later chunk is refused, and the error
	// says how far it got. Chunks in flight together are independent
	// (each name is in one chunk), so their order does not matter.
	var (
		mu      sync.Mutex
		done    = len(first) / 2
		failed  error
		next    = len(first)
		wg      sync.WaitGroup
		printed = time.Now()
	)
	take := func() []*yaml.Node {
		mu.Lock()
		defer mu.Unlock()
		if failed != nil || next >= len(entries.Content) {
			return nil
		}
		pairs := entries.Content[next:min(next+2*chunk, len(entries.Content))]
		next += len(pairs)
		return pairs
	}
	for range applyParallel {
		wg.Go(func() {
			for pairs := take(); pairs != nil; pairs = take() {
				_, err := c.applyChunk(ctx, path, pairs)
				mu.Lock()
				if err != nil && failed == nil {
					failed = err
				}
				if err == nil {
					done += len(pairs) / 2
					// A line a second (and the last): a million entries
					// are 7,813 chunks.
					if time.Since(printed) >= time.Second || done == total {
						fmt.Fprintf(w, "applied %d/%d entries\n", done, total)
						printed = time.Now()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed != nil {
		return fmt.Errorf("after %d of %d entries applied: %w", done, total, failed)
	}
	return nil
}

// applyEntries reads a file for apply into the mapping of its entries,
// its aliases bounded as schedules.yaml's are before anything expands
// them (nodeJSON does, into the JSON sent).
func applyEntries(w io.Writer, path string, data []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if n, ok := config.JSONNode(data); ok {
		// JSON is read as JSON, as the server reads it (yaml.v3 refuses
		// or changes some strings JSON writers produce); it has no aliases.
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{n}}
	} else if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	} else if err := config.CheckAliases(path, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping with an entries key", path)
	}
	return entriesNode(w, path, doc.Content[0])
}

// smallerChunk is the server's limit when err is its refusal of a set of
// more entries than it takes and the limit is below than.
func smallerChunk(err error, than int) (int, bool) {
	var se *serverError
	if errors.As(err, &se) && se.maxEntries > 0 && se.maxEntries < than {
		return se.maxEntries, true
	}
	return 0, false
}

// applyParallel is how many chunks apply sends at once: the server
// validates one while etcd commits another.
const applyParallel = 4

// serverError is an error response of the entries API; maxEntries is
// set when it refused an apply of more entries than one transaction
// takes.
type serverError struct {
	msg        string
	maxEntries int
}

func (e *serverError) Error() string { return e.msg }

// requestTimeout bounds one request of the entries client.
const requestTimeout = 30 * time.Second

// applyChunk writes the entries of pairs (key, value nodes) in one
// transaction and returns their names.
func (c *entriesClient) applyChunk(ctx context.Context, path string, pairs []*yaml.Node) ([]string, error) {
	body, err := nodeJSON(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: "entries"}, {Kind: yaml.MappingNode, Content: pairs}}}, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var resp struct {
		Applied     []string `json:"applied"`
		ModRevision int64    `json:"mod_revision"`
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := c.do(ctx, "POST", "", body, &resp); err != nil {
		return nil, err
	}
	return resp.Applied, nil
}

// entriesNode reads what apply accepts: a file like schedules.yaml with
// only entries: (a mapping from name to entry), or what get and list
// print with -o yaml (an entry view with name and spec, or entries: a
// list of them; views without a spec, of other sources, are skipped).
func entriesNode(w io.Writer, path string, top *yaml.Node) (*yaml.Node, error) {
	field := func(n *yaml.Node, key string) *yaml.Node {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return n.Content[i+1]
			}
		}
		return nil
	}
	views := func(list []*yaml.Node) (*yaml.Node, error) {
		out := &yaml.Node{Kind: yaml.MappingNode}
		for _, v := range list {
			name, spec := field(v, "name"), field(v, "spec")
			if v.Kind != yaml.MappingNode || name == nil {
				return nil, fmt.Errorf("%s:%d:%d: want an entry with name and spec", path, v.Line, v.Column)
			}
			if spec == nil {
				src := "another source"
				if s := field(v, "source"); s != nil {
					src = "source " + s.Value
				}
				fmt.Fprintf(w, "entry %s skipped: %s is not written through the API\n", term(name.Value), term(src))
				continue
			}
			out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name.Value}, spec)
		}
		return out, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping with an entries key", path)
	}
	if field(top, "name") != nil {
		return views([]*yaml.Node{top})
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if k := top.Content[i]; k.Value != "entries" {
			return nil, fmt.Errorf("%s:%d:%d: only entries is allowed here (timezone and defaults come from the server's schedules.yaml)", path, k.Line, k.Column)
		}
	}
	entries := field(top, "entries")
	switch {
	case entries != nil && entries.Kind == yaml.MappingNode:
		return entries, nil
	case entries != nil && entries.Kind == yaml.SequenceNode:
		return views(entries.Content)
	}
	return nil, fmt.Errorf("%s: entries must be a mapping from entry name to entry", path)
}

// nodeJSON converts YAML to JSON keeping the order of mapping keys (kwargs
// and headers are sent in the order written).
func nodeJSON(n *yaml.Node, depth int) ([]byte, error) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if depth > 64 {
		return nil, fmt.Errorf("line %d: nested too deeply", n.Line)
	}
	var b bytes.Buffer
	switch n.Kind {
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(n.Content[i].Value)
			b.Write(k)
			b.WriteByte(':')
			v, err := nodeJSON(n.Content[i+1], depth+1)
			if err != nil {
				return nil, err
			}
			b.Write(v)
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			v, err := nodeJSON(c, depth+1)
			if err != nil {
				return nil, err
			}
			b.Write(v)
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null", "!!bool", "!!int", "!!float":
			// The value schedules.yaml reads (config.Value), written as
			// Celery's body carries it (celery.AppendJSON): 1.0 and 2.5e2
			// stay floats, an integer of any size stays exact, so the
			// server reads back the value the file would give.
			v, err := config.Value(n)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n.Line, err)
			}
			b.Write(celery.AppendJSON(nil, v))
		default: // strings and timestamps travel as written
			out, _ := json.Marshal(n.Value)
			b.Write(out)
		}
	default:
		return nil, fmt.Errorf("line %d: unsupported YAML", n.Line)
	}
	return b.Bytes(), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printYAML prints v's JSON form as block YAML, keeping key order.
func printYAML(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// Read as JSON (config.JSONNode), not by yaml.v3, which refuses the
	// surrogate-pair escapes a spec written by Python holds.
	n := yaml.Node{Kind: yaml.DocumentNode}
	if root, ok := config.JSONNode(data); ok {
		n.Content = []*yaml.Node{root}
	} else if err := yaml.Unmarshal(data, &n); err != nil {
		return err
	}
	blockStyle(&n)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle drops JSON's flow style and quotes; the encoder quotes a
// string again where YAML would read it as something else ("07", "~").
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for i, c := range n.Content {
		blockStyle(c)
		if n.Kind == yaml.MappingNode && i%2 == 0 && strings.ContainsFunc(c.Value, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			// yaml.v3 writes such a key plain and loses a leading line
			// break; quoted, it reads back as itself.
			c.Style = yaml.DoubleQuotedStyle
		}
	}
}
