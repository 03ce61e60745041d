package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// sameTree compares what the decoder reads of two trees: kinds, tags,
// values and quoting, not positions.
func sameTree(a, b *yaml.Node, path string) error {
	if a.Kind != b.Kind || a.Tag != b.Tag || a.Value != b.Value || len(a.Content) != len(b.Content) {
		return fmt.Errorf("%s: fast {%v %q %q %d} vs yaml.v3 {%v %q %q %d}", path,
			a.Kind, a.Tag, a.Value, len(a.Content), b.Kind, b.Tag, b.Value, len(b.Content))
	}
	if a.Kind == yaml.ScalarNode && a.Style&yaml.DoubleQuotedStyle != b.Style&yaml.DoubleQuotedStyle {
		return fmt.Errorf("%s: quoting differs", path)
	}
	for i := range a.Content {
		if err := sameTree(a.Content[i], b.Content[i], fmt.Sprintf("%s/%d", path, i)); err != nil {
			return err
		}
	}
	return nil
}

func checkJSONNode(t testing.TB, doc string) (fast bool) {
	n, ok := jsonNode([]byte(doc), nil)
	if !ok {
		return false
	}
	var y yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &y); err != nil {
		if strings.Contains(err.Error(), "escape") {
			// JSON escapes yaml.v3 does not read (\/, surrogate pairs):
			// encoding/json decodes those strings, by JSON's rules.
			return true
		}
		t.Fatalf("%s: the fast path took a document yaml.v3 refuses: %v", doc, err)
	}
	if err := sameTree(n, y.Content[0], ""); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	seen := map[pos]bool{}
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if len(n.Content) > 0 && cap(n.Content) != len(n.Content) {
			t.Fatalf("%s: a Content with room past its end (an append would write into its neighbour's)", doc)
		}
		if seen[pos{n.Line, n.Column}] {
			t.Fatalf("%s: two nodes at %d:%d (error pointers need unique positions)", doc, n.Line, n.Column)
		}
		seen[pos{n.Line, n.Column}] = true
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	// The slabs are sized by the count: exact for every document taken,
	// so a parse allocates each slab once.
	if c := countJSONNodes([]byte(doc)); c != len(seen) {
		t.Fatalf("%s: countJSONNodes %d, the tree has %d nodes", doc, c, len(seen))
	}
	return true
}

func TestJSONNode(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		fast bool // false: left to yaml.v3
	}{
		{`{"task":"tasks.add","every":"60s","args":[1,"two",3.5,-4,1e3,true,null,[],{}],"kwargs":{"a":{"b":[false]}}}`, true},
		{` { "task" : "t" , "crontab" : { "minute" : "*/5" } } `, true},
		{`{"s":"esc \" \\ \n \u00e9","big":123456789012345678901234567890,"neg0":-0,"f":-1.5E-3}`, true},
		{`{"zoë":"☃","empty":""}`, true},
		{`{}`, true},
		{`{"url":"http:\/\/x","emoji":"\ud83d\ude00"}`, true}, // JSON escapes yaml.v3 does not know
		{`{"a":1,"a":2}`, false},                              // duplicate: yaml.v3 reports it
		{`{"<<":{"task":"t"}}`, true},                         // quoted, not a YAML merge key
		{`{task: t}`, false},                                  // YAML flow, not JSON
		{`{"a":01}`, false},                                   // a leading zero
		{`{"a":1} trailing`, false},                           // trailing content
		{`{"a":"tab	in"}`, false},                             // a raw control character
		{"{\"a\":\"\xff\"}", false},                           // invalid UTF-8
		{`["not an object"]`, false},
		{`{"a":[1,2}`, false},
		{`{"a":tru}`, false},
		{strings.Repeat(`{"a":`, 70) + `1` + strings.Repeat(`}`, 70), false},
	} {
		if got := checkJSONNode(t, tc.doc); got != tc.fast {
			t.Errorf("%.60s: fast path %v, want %v", tc.doc, got, tc.fast)
		}
	}
}

// FuzzJSONNode: whatever the fast path takes, yaml.v3 reads the same.
func FuzzJSONNode(f *testing.F) {
	for _, s := range []string{`{"task":"t","every":5,"args":[1,"x",null,true,2.5e-1]}`, `{"a":{"b":["\u00e9"]}}`, `{"a":-0.0}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) { checkJSONNode(t, doc) })
}

// TestParseEntryJSONMatchesYAML: an entry parsed on the fast path has the
// fingerprint and errors it has through yaml.v3.
func TestParseEntryJSONMatchesYAML(t *testing.T) {
	for _, doc := range []string{
		`{"task":"tasks.add","every":"60s","args":[1,2],"options":{"queue":"q","priority":3}}`,
		`{"task":"tasks.r","crontab":{"minute":"5","hour":"*/2"},"timezone":"Asia/Tokyo","kwargs":{"t":1}}`,
		`{"task":"tasks.r","at":"2027-01-02T03:04:05Z"}`,
		`{"task":"tasks.r","every":"0s"}`,
		`{"task":7,"every":"1m","options":{"priority":"high"}}`,
	} {
		fast, ferr := (*Config)(nil).ParseEntry("e", []byte(doc))
		slow, serr := parseEntryYAML(t, doc)
		if fmt.Sprint(ferr) != fmt.Sprint(serr) {
			t.Errorf("%s: errors differ:\nfast %v\nyaml %v", doc, ferr, serr)
			continue
		}
		if ferr == nil && fast.Fingerprint != slow.Fingerprint {
			t.Errorf("%s: fingerprints differ", doc)
		}
	}
}

// parseEntryYAML parses doc through yaml.v3, as ParseEntry does for a
// document the fast path leaves (a YAML comment makes it not JSON).
func parseEntryYAML(t *testing.T, doc string) (*Entry, error) {
	t.Helper()
	return (*Config)(nil).ParseEntry("e", []byte(doc+" # yaml"))
}

// TestIntegersReadAsYAMLDoes: the plain-decimal path of value reads what
// yaml.v3's decoder reads, and every other form of integer still goes to
// yaml.v3 (a leading zero is octal to it).
func TestIntegersReadAsYAMLDoes(t *testing.T) {
	for _, lit := range []string{"0", "-0", "7", "-12", "017", "-017", "00", "0o17", "0x1F", "1_000", "+5",
		"9223372036854775807", "-9223372036854775808"} {
		n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: lit}
		var want int64
		if err := n.Decode(&want); err != nil {
			t.Fatalf("%s: yaml.v3: %v", lit, err)
		}
		got, ok := (&decoder{}).value(n)
		if !ok || got != want {
			t.Errorf("%s: read %v (%v), yaml.v3 reads %d", lit, got, ok, want)
		}
	}
}

// TestParseEntryKeepsNoTree: ParseEntry reuses its trees' memory from
// one parse to the next, so an entry must hold nothing of its tree.
// Entries parsed on two goroutines at once are kept, then compared with
// the same documents parsed again one at a time.
func TestParseEntryKeepsNoTree(t *testing.T) {
	docs := []string{
		`{"task":"tasks.sync","every":"3600s","start_at":"2026-01-01T05:17:44Z","args":[%d,"s%d",[1,{"k":"v%d"}]]}`,
		`{"task":"tasks.r%d","crontab":{"minute":"%d","hour":"*/6"},"timezone":"Europe/Berlin","kwargs":{"tenant":%d}}`,
		`{"task":"tasks.remind","at":"2027-03-12T05:00:00Z","options":{"queue":"q%d","headers":{"h":"%d"}},"args":[%d]}`,
	}
	const n = 3000
	doc := func(i int) []byte { return fmt.Appendf(nil, docs[i%len(docs)], i, i%60, i) }
	kept := make([]*Entry, n)
	done := make(chan struct{})
	for half := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := half; i < n; i += 2 {
				e, err := (*Config)(nil).ParseEntry(fmt.Sprint("e", i), doc(i))
				if err != nil {
					t.Errorf("%d: %v", i, err)
					return
				}
				kept[i] = e
			}
		}()
	}
	<-done
	<-done
	for i, e := range kept {
		again, err := (*Config)(nil).ParseEntry(fmt.Sprint("e", i), doc(i))
		if err != nil || e == nil {
			t.Fatalf("%d: %v", i, err)
		}
		if e.Fingerprint != again.Fingerprint || e.Task != again.Task ||
			!reflect.DeepEqual(e.Args, again.Args) || !reflect.DeepEqual(e.Kwargs, again.Kwargs) ||
			!reflect.DeepEqual(e.Options, again.Options) {
			t.Fatalf("entry %d changed after later parses:\nkept  %+v\nfresh %+v", i, e, again)
		}
	}
}
