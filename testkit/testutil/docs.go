package testutil

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DocumentedACL returns the rules of docs/brokers.md's `ACL SETUSER beatd`
// line (the arguments after the user name), with its password placeholder
// replaced, so tests check exactly what the docs tell people to paste.
func DocumentedACL(t testing.TB, password string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(moduleRoot(t), "docs", "brokers.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "ACL SETUSER beatd ") {
			continue
		}
		rules := strings.Fields(line)[3:]
		for i, a := range rules {
			if strings.HasPrefix(a, ">") {
				rules[i] = ">" + password
			}
		}
		return rules
	}
	t.Fatal("docs/brokers.md has no `ACL SETUSER beatd ...` line")
	return nil
}

// GoldenVaryingHeaders are the Celery headers that differ between any two
// messages (ids, origin, expiry), and GoldenBeatdHeaders the ones beatd
// adds on purpose over Celery 5.2's set (Celery 5.6's headers and beatd's
// identity headers): the wire golden tests of every transport skip or
// require exactly these.
var (
	GoldenVaryingHeaders = []string{"id", "root_id", "origin", "expires"}
	GoldenBeatdHeaders   = []string{"replaced_task_nesting", "stamped_headers", "stamps", "beat_entry", "beat_slot", "beat_fencing_token"}
)

// moduleRoot is the directory holding go.mod, above the test's package.
func moduleRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// JSONKeys returns the keys of a JSON object in the order written: the
// wire tests hold beatd to the order Python's json.dumps writes.
func JSONKeys(t testing.TB, raw []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// Published is one message of a `redis-cli PSUBSCRIBE` capture.
type Published struct {
	Channel string
	Payload []byte
}

// ReadPSubscribe reads a file of redis-cli's PSUBSCRIBE output (the wire
// captures of Celery's events and results) into its messages.
func ReadPSubscribe(t testing.TB, path string) []Published {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []Published
	for i := 0; i+3 < len(lines); i++ {
		if lines[i] != "pmessage" {
			continue
		}
		out = append(out, Published{Channel: lines[i+2], Payload: []byte(lines[i+3])})
		i += 3
	}
	return out
}
