package config

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
)

// TestCanvasAndTemplateErrors: a bad step or placeholder is reported at
// its line and column in a file, and at its JSON pointer through the API.
func TestCanvasAndTemplateErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, entry string // the entry's JSON, as the API takes it
		mark        string // where in it the error points (its first occurrence)
		pointer     string
		msg         string
	}{
		{"step without task", `{"task":"a","every":"1m","chain":[{"task":"b"},{"args":[1]}]}`, `{"args"`, "/chain/1", "chain step 2: missing key task"},
		{"step with empty task", `{"task":"a","every":"1m","chain":[{"task":""}]}`, `""`, "/chain/0/task", "task must be a non-empty string"},
		{"chain not a list", `{"task":"a","every":"1m","chain":{"task":"b"}}`, `{"task":"b"}`, "/chain", "chain must be a list"},
		{"empty chain", `{"task":"a","every":"1m","chain":[]}`, `[]`, "/chain", "chain is empty"},
		{"link without task", `{"task":"a","every":"1m","link":{"kwargs":{}}}`, `{"kwargs"`, "/link", "link: missing key task"},
		{"link_error list step", `{"task":"a","every":"1m","link_error":[{"task":"e"},{"task":"f","bogus":1}]}`, `"bogus"`, "/link_error/1/bogus", "unknown key \"bogus\""},
		{"step priority", `{"task":"a","every":"1m","chain":[{"task":"b","options":{"priority":12}}]}`, `12`, "/chain/0/options/priority", "between 0 and 9"},
		{"unknown placeholder in args", `{"task":"a","every":"1m","args":["{{ slot }}","x {{ slott }}"]}`, `"x {{`, "/args/1", "unknown placeholder \"{{ slott }}\""},
		{"unclosed placeholder", `{"task":"a","every":"1m","kwargs":{"day":"{{ slot.date"}}`, `"{{ slot.date"`, "/kwargs/day", "unclosed"},
		{"placeholder in a header", `{"task":"a","every":"1m","options":{"headers":{"h":"{{ now }}"}}}`, `"{{ now`, "/options/headers/h", "unknown placeholder"},
		{"placeholder in a step", `{"task":"a","every":"1m","chain":[{"task":"b","kwargs":{"k":"{{ slot.iso }}"}}]}`, `"{{ slot.iso`, "/chain/0/kwargs/k", "unknown placeholder"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("s.yaml", []byte("entries:\n  e:\n    "+tt.entry+"\n"))
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("file: want an error, got %v", err)
			}
			// The entry's JSON stands at line 3, column 5.
			at := fmt.Sprintf("s.yaml:3:%d", 5+strings.Index(tt.entry, tt.mark))
			if got := es[0].Error(); !strings.HasPrefix(got, at+": ") || !strings.Contains(got, tt.msg) {
				t.Errorf("file: %s\n want %s: …%s…", got, at, tt.msg)
			}
			_, err = (*Config)(nil).ParseEntry("e", []byte(tt.entry))
			var fe FieldErrors
			if !errors.As(err, &fe) || len(fe) == 0 {
				t.Fatalf("API: want field errors, got %v", err)
			}
			if fe[0].Pointer != tt.pointer || !strings.Contains(fe[0].Message, tt.msg) {
				t.Errorf("API: %q %s\n want %q …%s…", fe[0].Pointer, fe[0].Message, tt.pointer, tt.msg)
			}
		})
	}
}

// TestCanvasBounds: the number of steps is capped, and steps count
// toward the 256 KiB bound on an entry's values.
func TestCanvasBounds(t *testing.T) {
	t.Parallel()
	steps := strings.Repeat(`{"task":"b"},`, celery.MaxChainSteps+1)
	_, err := (*Config)(nil).ParseEntry("e", []byte(`{"task":"a","every":"1m","chain":[`+strings.TrimSuffix(steps, ",")+`]}`))
	if err == nil || !strings.Contains(err.Error(), "at most 32 may follow task") {
		t.Errorf("33 steps: %v", err)
	}
	big := strings.Repeat("x", 40<<10)
	// Each of 8 steps is small, but link_error travels in every one.
	var chain []string
	for range 8 {
		chain = append(chain, `{"task":"b"}`)
	}
	_, err = (*Config)(nil).ParseEntry("e", []byte(`{"task":"a","every":"1m","chain":[`+strings.Join(chain, ",")+`],"link_error":{"task":"e","args":["`+big+`"]}}`))
	if err == nil || !strings.Contains(err.Error(), "more than 262144 bytes") {
		t.Errorf("9 copies of a 40 KiB link_error: %v", err)
	}
	_, err = (*Config)(nil).ParseEntry("e", []byte(`{"task":"a","every":"1m","args":[`+strings.TrimSuffix(strings.Repeat(`"{{ slot }}",`, maxPlaceholders+1), ",")+`]}`))
	if err == nil || !strings.Contains(err.Error(), "65 placeholders in its args, kwargs, headers and steps; at most 64") {
		t.Errorf("65 placeholders: %v", err)
	}
}

// TestTemplateRendersTheSlot: each placeholder renders the slot, in the
// entry's zone, and the same slot always renders the same message.
func TestTemplateRendersTheSlot(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("s.yaml", []byte(`entries:
  report:
    task: app.report
    timezone: Europe/Berlin
    crontab: {minute: 0, hour: "2,14"}
    args: ["{{ slot }}", "{{ slot.epoch }}", "{{prev_slot}}", "{{ attempt }}"]
    kwargs: {day: "{{ slot.date }}", range: "{{ prev_slot.date }}..{{ slot.date }}", who: "{{ name }}", at: "epoch {{ slot.epoch }}", lit: "{{{{ slot }}"}
    options: {headers: {period_end: "{{ slot }}"}}
    chain:
      - {task: app.mail, kwargs: {since: "{{ prev_slot.epoch }}"}}
`))
	if err != nil {
		t.Fatal(err)
	}
	spec := cfg.Entries[0].Spec()
	task, err := celery.Compile(spec, "beatd/test", "beatd@h", "")
	if err != nil {
		t.Fatal(err)
	}
	// 2026-03-29 02:00 does not exist in Berlin (DST): the crontab's
	// slot that day is 03:00 CEST; the one before it 14:00 CET.
	slot := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)
	body := func(now time.Time) []any {
		f := &celery.Fire{Task: task, Slot: slot}
		var env struct{ Body string }
		if err := json.Unmarshal(task.AppendMessage(nil, f, 1, now), &env); err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.StdEncoding.DecodeString(env.Body)
		var b []any
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := body(slot.Add(3 * time.Hour))
	args, _ := json.Marshal(b[0])
	if want := `["2026-03-29T03:00:00+02:00",1774746000,"2026-03-28T14:00:00+01:00",1]`; string(args) != want {
		t.Errorf("args %s\n want %s", args, want)
	}
	kw, _ := json.Marshal(b[1])
	if want := `{"at":"epoch 1774746000","day":"2026-03-29","lit":"{{ slot }}","range":"2026-03-28..2026-03-29","who":"report"}`; string(kw) != want {
		t.Errorf("kwargs %s\n want %s", kw, want)
	}
	chain, _ := json.Marshal(b[2].(map[string]any)["chain"].([]any)[0].(map[string]any)["kwargs"])
	if want := `{"since":1774702800}`; string(chain) != want {
		t.Errorf("chain step kwargs %s, want %s", chain, want)
	}
	// Published a day late (a catch-up, a backfill), the slot renders the same.
	late, _ := json.Marshal(body(slot.Add(24 * time.Hour)))
	now, _ := json.Marshal(b)
	if string(late) != string(now) {
		t.Errorf("a late publish rendered\n%s\nnot\n%s", late, now)
	}
}

// TestPrevSlot: prev_slot is the schedule's grid before the slot, for
// every kind of schedule.
func TestPrevSlot(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ sched, slot, want string }{
		{`crontab: {minute: 0, hour: "2,14"}`, "2026-03-29T02:00:00Z", "2026-03-28T14:00:00Z"},
		{`every: 90s`, "2026-03-29T01:00:00Z", "2026-03-29T00:58:30Z"},
		{`cron: "0 0 1 * *"`, "2026-03-01T00:00:00Z", "2026-02-01T00:00:00Z"},
		{`cron: "0 0 29 2 *"`, "2028-02-29T00:00:00Z", "2024-02-29T00:00:00Z"},
		{`at: "2026-03-29T01:00:00Z"`, "2026-03-29T01:00:00Z", ""},
	} {
		cfg, err := Parse("s.yaml", []byte("entries:\n  e: {task: t, "+tt.sched+", args: ['{{ prev_slot }}']}\n"))
		if err != nil {
			t.Fatal(err)
		}
		got := cfg.Entries[0].Spec().Prev(mustTime(t, tt.slot))
		if s := ""; !got.IsZero() {
			s = got.UTC().Format(time.RFC3339)
			if s != tt.want {
				t.Errorf("%s: prev of %s = %s, want %s", tt.sched, tt.slot, s, tt.want)
			}
		} else if tt.want != "" {
			t.Errorf("%s: prev of %s = none, want %s", tt.sched, tt.slot, tt.want)
		}
	}
}

// TestHeaderPlaceholdersCount: placeholders in headers, the defaults'
// included, count toward the bound.
func TestHeaderPlaceholdersCount(t *testing.T) {
	t.Parallel()
	var hs []string
	for i := range maxPlaceholders - 1 {
		hs = append(hs, fmt.Sprintf("h%d: '{{ slot }}'", i))
	}
	file := "defaults: {options: {headers: {" + strings.Join(hs, ", ") + "}}}\nentries:\n  ok: {task: t, every: 1m, args: ['{{ slot }}']}\n  over: {task: t, every: 1m, args: ['{{ slot }}', '{{ name }}']}\n"
	_, err := Parse("s.yaml", []byte(file))
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || !strings.Contains(es[0].Error(), `s.yaml:4:3: entry "over": 65 placeholders`) {
		t.Errorf("want one error for over at 65 placeholders, got %v", err)
	}
}
