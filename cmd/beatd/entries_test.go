package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fired is one beatd message as read back from Redis, with its args.
type fired struct {
	Entry string
	Slot  time.Time
	Args  string // JSON
}

// fires reads every beatd message in queue, with the args of its body.
func (c *cluster) fires(queue string) []fired {
	c.t.Helper()
	raws, err := c.rdb.LRange(context.Background(), queue, 0, -1).Result()
	if err != nil {
		c.t.Fatal(err)
	}
	var out []fired
	for _, raw := range raws {
		var m struct {
			Body    string `json:"body"`
			Headers struct {
				Entry string `json:"beat_entry"`
				Slot  string `json:"beat_slot"`
			} `json:"headers"`
		}
		if json.Unmarshal([]byte(raw), &m) != nil || m.Headers.Entry == "" {
			continue
		}
		body, err := base64.StdEncoding.DecodeString(m.Body)
		if err != nil {
			c.t.Fatalf("message body: %v", err)
		}
		var parts []json.RawMessage
		if err := json.Unmarshal(body, &parts); err != nil || len(parts) != 3 {
			c.t.Fatalf("message body %s: %v", body, err)
		}
		slot, _ := time.Parse(time.RFC3339Nano, m.Headers.Slot)
		out = append(out, fired{Entry: m.Headers.Entry, Slot: slot, Args: string(parts[0])})
	}
	return out
}

func (c *cluster) firesOf(entry string) []fired {
	var out []fired
	for _, f := range c.fires("celery") {
		if f.Entry == entry {
			out = append(out, f)
		}
	}
	return out
}

type apiResp struct {
	code int
	etag string
	body string
}

func call(t *testing.T, method, url, token string, body []byte, hdr ...string) apiResp {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiResp{resp.StatusCode, resp.Header.Get("ETag"), string(b)}
}

// TestProcessEntriesAPI drives runtime entries through the HTTP API and
// the CLI while two replicas run, and checks the broker: a new entry fires
// promptly, a change applies, a lost update is refused, a delete stops it.
func TestProcessEntriesAPI(t *testing.T) {
	c := newCluster(t, "entries:\n  filed: {task: tasks.add, every: 1h}\n  wf: {task: etl.fetch, every: 1h, chain: [{task: etl.transform}], link_error: [{task: etl.alert}]}\n", 2, "--read-token-file", writeTemp(t, "read-token"))
	lead, _ := c.leader("", 20*time.Second)
	standby := c.replicas[0]
	if standby == lead {
		standby = c.replicas[1]
	}
	const admin = "test-token"
	url := standby.URL("/api/v1/entries/")
	good := []byte(`{"task": "tasks.add", "every": "1s", "args": [1, 1]}`)

	// Refusals: auth, the file's names, bad documents, oversize bodies.
	for _, tt := range []struct {
		name, method, path, token string
		body                      []byte
		code                      int
		contains                  string
	}{
		{"write without token", "PUT", "dyn", "", good, 401, ""},
		{"write with the read token", "PUT", "dyn", "read-token", good, 403, "has the read role; this needs admin"},
		{"read without token", "GET", "", "", nil, 401, ""},
		{"file owns the name", "PUT", "filed", admin, good, 409, "schedules.yaml"},
		{"invalid field", "PUT", "dyn", admin, []byte(`{"task": "tasks.add", "every": "soon"}`), 422, `"pointer": "/every"`},
		{"unknown key", "PUT", "dyn", admin, []byte(`{"task": "tasks.add", "every": 1, "options": {"qeue": "x"}}`), 422, `"pointer": "/options/qeue"`},
		{"not JSON", "PUT", "dyn", admin, []byte(`task: x`), 400, `"pointer": ""`},
		// Issue 45's entries that wedged the leader are refused at the door.
		{"every 1ns", "PUT", "dyn", admin, []byte(`{"task": "tasks.add", "every": "1ns"}`), 422, `below the minimum interval`},
		{"every 2400000h", "PUT", "dyn", admin, []byte(`{"task": "tasks.add", "every": "2400000h"}`), 422, `"pointer": "/every"`},
		{"start_at 2300", "PUT", "dyn", admin, []byte(`{"task": "tasks.add", "every": "1h", "start_at": "2300-01-01T00:00:00Z"}`), 422, `"pointer": "/start_at"`},
		{"too large", "PUT", "dyn", admin, bytes.Repeat([]byte(" "), 100<<10), 413, ""},
		{"delete unknown", "DELETE", "nope", admin, nil, 404, ""},
	} {
		u := url + tt.path
		if tt.path == "" {
			u = standby.URL("/api/v1/entries")
		}
		r := call(t, tt.method, u, tt.token, tt.body)
		if r.code != tt.code || !strings.Contains(r.body, tt.contains) {
			t.Errorf("%s: %d %s, want %d containing %q", tt.name, r.code, r.body, tt.code, tt.contains)
		}
	}

	// Create (create-only) on the standby: the leader fires it.
	put := time.Now()
	r := call(t, "PUT", url+"dyn", admin, good, "If-None-Match", "*")
	if r.code != 200 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	rev1 := r.etag
	// The leader applies it within 1 s of the write (its log says when).
	applied := lead.logTime(t, 5*time.Second, `"msg":"entry added"`, `"entry":"dyn"`)
	t.Logf("PUT (on the standby) to applied on the leader: %s", applied.Sub(put))
	if applied.Sub(put) > time.Second {
		t.Errorf("the leader applied the new entry %s after the PUT", applied.Sub(put))
	}
	waitFor(t, 10*time.Second, "dyn to fire", func() bool { return len(c.firesOf("dyn")) > 0 })
	first := c.firesOf("dyn")[0]
	t.Logf("PUT to first fire: %s (slot %s after the PUT; every: 1s)", time.Since(put), first.Slot.Sub(put))
	if first.Slot.Sub(put) > 2*time.Second {
		t.Errorf("first slot %s after the PUT; want within 1 s of the change plus one period", first.Slot.Sub(put))
	}
	if r := call(t, "PUT", url+"dyn", admin, good, "If-None-Match", "*"); r.code != 409 {
		t.Errorf("second create-only: %d", r.code)
	}
	// PUT is idempotent: the same document again changes nothing.
	// (It is a new revision, though: If-Match needs the latest.)
	if r := call(t, "PUT", url+"dyn", admin, good); r.code != 200 {
		t.Errorf("repeated PUT: %d %s", r.code, r.body)
	} else {
		rev1 = r.etag
	}

	// Change with the right revision; a writer holding the old one loses.
	changed := []byte(`{"task": "tasks.add", "every": "1s", "args": [2, 2]}`)
	r = call(t, "PUT", url+"dyn", admin, changed, "If-Match", rev1)
	if r.code != 200 {
		t.Fatalf("update: %d %s", r.code, r.body)
	}
	changedAt := time.Now()
	rev2 := r.etag
	if r := call(t, "PUT", url+"dyn", admin, []byte(`{"task": "tasks.add", "every": "1s", "args": [3, 3]}`), "If-Match", rev1); r.code != 409 {
		t.Errorf("lost update: %d %s, want 409", r.code, r.body)
	}
	waitFor(t, 10*time.Second, "the changed args to fire", func() bool {
		for _, f := range c.firesOf("dyn") {
			if f.Args == "[2,2]" || f.Args == "[2, 2]" {
				return true
			}
		}
		return false
	})
	var firstNew time.Time
	for _, f := range c.firesOf("dyn") {
		if strings.Contains(f.Args, "3") {
			t.Errorf("the lost update fired: %+v", f)
		}
		if strings.Contains(f.Args, "2") && (firstNew.IsZero() || f.Slot.Before(firstNew)) {
			firstNew = f.Slot
		}
	}
	t.Logf("change to first new slot: %s", firstNew.Sub(changedAt))
	if firstNew.Sub(changedAt) > 2*time.Second {
		t.Errorf("changed entry first fired %s after the change", firstNew.Sub(changedAt))
	}
	for _, f := range c.firesOf("dyn") {
		if strings.Contains(f.Args, "1") && f.Slot.After(firstNew) {
			t.Errorf("old version fired after the new one: %+v", f)
		}
	}

	// Reads: the list has every source, the read token suffices.
	r = call(t, "GET", standby.URL("/api/v1/entries"), "read-token", nil)
	var list struct {
		Entries []struct {
			Name, Source string
			Workflow     string
			NextRuns     []time.Time     `json:"next_runs"`
			ModRevision  int64           `json:"mod_revision"`
			Spec         json.RawMessage `json:"spec"`
		}
	}
	if err := json.Unmarshal([]byte(r.body), &list); err != nil || r.code != 200 {
		t.Fatalf("list: %d %s %v", r.code, r.body, err)
	}
	got := map[string]string{}
	for _, e := range list.Entries {
		got[e.Name] = e.Source
		// The list says what a chained entry runs, as status does.
		if want := "etl.fetch → etl.transform; link_error: etl.alert"; e.Name == "wf" && e.Workflow != want {
			t.Errorf("wf's workflow in the list: %q, want %q", e.Workflow, want)
		}
		if e.Name == "dyn" && (len(e.NextRuns) != 3 || strconv.FormatInt(e.ModRevision, 10) != strings.Trim(rev2, `"`) || !strings.Contains(compact(e.Spec), `"args":[2,2]`)) {
			t.Errorf("dyn in list: %+v (rev2 %s)", e, rev2)
		}
	}
	if got["filed"] != "file" || got["dyn"] != "api" {
		t.Errorf("sources in list: %v", got)
	}
	if v, ok := lead.Metric(`beatd_source_entries{source="api"}`); !ok || v != 1 {
		t.Errorf(`beatd_source_entries{source="api"} = %v %v, want 1`, v, ok)
	}

	// The fire log names the source.
	logb, _ := os.ReadFile(lead.LogPath)
	sourced := false
	for _, line := range strings.Split(string(logb), "\n") {
		if strings.Contains(line, `"msg":"fired"`) && strings.Contains(line, `"entry":"dyn"`) && strings.Contains(line, `"source":"api"`) {
			sourced = true
			break
		}
	}
	if !sourced {
		t.Error(`no "fired" log line for dyn with "source":"api"`)
	}

	// Delete with a stale revision is refused; then deleted, it stops.
	if r := call(t, "DELETE", url+"dyn", admin, nil, "If-Match", rev1); r.code != 409 {
		t.Errorf("stale delete: %d", r.code)
	}
	if r := call(t, "DELETE", url+"dyn", admin, nil, "If-Match", rev2); r.code != 204 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	deleted := time.Now()
	time.Sleep(2500 * time.Millisecond) // proves a negative: the deleted every: 1s entry would fire twice in it
	for _, f := range c.firesOf("dyn") {
		if f.Slot.After(deleted.Add(time.Second)) {
			t.Errorf("fire after the delete took effect: slot %s, deleted at %s", f.Slot, deleted)
		}
	}

	// The CLI: apply a file of two entries in one go, list, get, delete.
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(beatdBin, append(args, "--server", "http://127.0.0.1:"+strconv.Itoa(standby.HTTPPort))...)
		cmd.Env = append(os.Environ(), "BEATD_ADMIN_TOKEN="+admin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("beatd %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	file := filepath.Join(c.dir, "more.yaml")
	if err := os.WriteFile(file, []byte("entries:\n  clia:\n    task: tasks.add\n    every: 1s\n    kwargs: {z: 1, a: 2}\n  clib: {task: tasks.add, every: 1s, args: [5, 5]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := cli("entries", "apply", "-f", file); !strings.Contains(out, "entry clia applied") || !strings.Contains(out, "entry clib applied") {
		t.Fatalf("apply: %s", out)
	}
	waitFor(t, 10*time.Second, "both applied entries to fire", func() bool {
		return len(c.firesOf("clia")) > 0 && len(c.firesOf("clib")) > 0
	})
	if out := cli("entries", "list"); !strings.Contains(out, "clia") || !strings.Contains(out, "filed") || !strings.Contains(out, "api") {
		t.Errorf("list:\n%s", out)
	}
	if out := cli("entries", "get", "clia", "-o", "json"); !strings.Contains(out, `"z": 1`) || strings.Index(out, `"z": 1`) > strings.Index(out, `"a": 2`) {
		t.Errorf("get -o json does not keep the kwargs as written:\n%s", out)
	}
	if out := cli("entries", "get", "clia", "-o", "yaml"); !strings.Contains(out, "source: api") {
		t.Errorf("get -o yaml:\n%s", out)
	}
	// beatd status reads etcd directly: runtime entries are there too.
	status, err := exec.Command(beatdBin, "status", "--json", "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", c.prefix, "--broker", c.redis.URL(0)).CombinedOutput()
	if out := string(status); err != nil || !strings.Contains(out, `"name": "clib",
      "source": "api"`) {
		t.Errorf("status lacks the runtime entry and its source:\n%s", out)
	}
	// A change through the CLI.
	if err := os.WriteFile(file, []byte("entries:\n  clib: {task: tasks.add, every: 1s, args: [6, 6]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := cli("entries", "apply", "-f", file); !strings.Contains(out, "entry clib applied") {
		t.Fatalf("apply change: %s", out)
	}
	waitFor(t, 5*time.Second, "clib's changed args to fire", func() bool {
		for _, f := range c.firesOf("clib") {
			if strings.Contains(f.Args, "6") {
				return true
			}
		}
		return false
	})
	// get -o yaml is what apply reads back (kubectl's edit loop).
	view := cli("entries", "get", "clib", "-o", "yaml")
	if err := os.WriteFile(file, []byte(view), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := cli("entries", "apply", "-f", file); !strings.Contains(out, "entry clib applied") {
		t.Errorf("apply of get -o yaml: %s\n%s", out, view)
	}
	if out := cli("entries", "delete", "clia"); !strings.Contains(out, "deleted") {
		t.Errorf("delete: %s", out)
	}
	c.checkNoDuplicates()
	// A bad file names the field.
	if err := os.WriteFile(file, []byte("entries:\n  clic: {task: tasks.add, every: 1s, jitter: -5s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(beatdBin, "entries", "apply", "-f", file, "--server", "http://127.0.0.1:"+strconv.Itoa(standby.HTTPPort))
	cmd.Env = append(os.Environ(), "BEATD_ADMIN_TOKEN="+admin)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "/entries/clic/jitter") {
		t.Errorf("bad apply: %v\n%s", err, out)
	}
	// A file past one transaction's 128 entries goes in chunks, with
	// progress; --atomic keeps one transaction and says its limit.
	var big strings.Builder
	big.WriteString("entries:\n")
	for i := range 300 {
		fmt.Fprintf(&big, "  bulk-%03d: {task: tasks.add, cron: \"0 3 * * *\"}\n", i)
	}
	if err := os.WriteFile(file, []byte(big.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := cli("entries", "apply", "-f", file); !strings.Contains(out, "applied 300/300 entries") {
		t.Errorf("chunked apply: %s", out)
	}
	if out := cli("entries", "list", "-o", "json"); strings.Count(out, `"bulk-`) != 300 {
		t.Errorf("list after the chunked apply has %d bulk entries", strings.Count(out, `"bulk-`))
	}
	cmd = exec.Command(beatdBin, "entries", "apply", "--atomic", "-f", file, "--server", "http://127.0.0.1:"+strconv.Itoa(standby.HTTPPort))
	cmd.Env = append(os.Environ(), "BEATD_ADMIN_TOKEN="+admin)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "one transaction takes at most 128") {
		t.Errorf("atomic apply of 300: %v\n%s", err, out)
	}
	gone := time.Now()
	// The standby, which followed the changes all along, takes over:
	// clib keeps firing, the deleted clia stays deleted.
	lead.Kill()
	killed := time.Now()
	c.leader(lead.ID, 10*time.Second)
	waitFor(t, 10*time.Second, "clib to fire under the new leader", func() bool {
		for _, f := range c.firesOf("clib") {
			if f.Slot.After(killed) {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // proves a negative: a fire of clia after its delete would be in by now
	for _, f := range c.firesOf("clia") {
		if f.Slot.After(gone.Add(time.Second)) {
			t.Errorf("clia fired after its delete: %s", f.Slot)
		}
	}
	c.checkNoDuplicates()
}

// checkNoDuplicates fails the test if any (entry, slot) was enqueued twice.
func (c *cluster) checkNoDuplicates() {
	c.t.Helper()
	seen := map[string]int{}
	for _, f := range c.fires("celery") {
		seen[f.Entry+" "+f.Slot.Format(time.RFC3339Nano)]++
	}
	for k, n := range seen {
		if n > 1 {
			c.t.Errorf("duplicate: %s enqueued %d times", k, n)
		}
	}
	if len(seen) == 0 {
		c.t.Error("no messages to check for duplicates")
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// logTime waits for a log line of r holding every part and returns its
// time.
func (r *replica) logTime(t *testing.T, timeout time.Duration, parts ...string) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, timeout, strings.Join(parts, " "), func() bool {
		b, _ := os.ReadFile(r.LogPath)
	lines:
		for _, line := range strings.Split(string(b), "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			var rec struct {
				Time time.Time `json:"time"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil {
				at = rec.Time
				return true
			}
		}
		return false
	})
	return at
}

func compact(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}
