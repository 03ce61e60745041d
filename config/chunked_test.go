package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func bigConfig(n int, extra func(i int) string) string {
	var b strings.Builder
	b.WriteString("# a large config\ntimezone: Europe/Berlin\ndefaults:\n  catchup: all\nentries:\n")
	for i := 0; i < n; i++ {
		if x := extra(i); x != "" {
			b.WriteString(x)
			continue
		}
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, "  e%05d: {task: tasks.add, every: %ds, args: [%d, 1]}\n", i, 1+i%60, i)
		case 1:
			fmt.Fprintf(&b, "  e%05d:\n    task: tasks.hello\n    crontab: {minute: '%d'}\n    # a comment\n\n    kwargs: {who: x%d}\n", i, i%60, i)
		default:
			fmt.Fprintf(&b, "  e%05d: {task: tasks.report, cron: '%d * * * *', timezone: Asia/Tokyo}\n", i, i%60)
		}
	}
	b.WriteString("# trailing comment\n")
	return b.String()
}

func parseBoth(t *testing.T, text string) (chunked, whole *Config, errC, errW error) {
	t.Helper()
	if len(text) < chunkThreshold {
		t.Fatalf("config of %d bytes is below the chunking threshold", len(text))
	}
	dc := &decoder{file: "big.yaml"}
	chunked = dc.parse([]byte(text))
	if len(dc.errs) > 0 {
		chunked, errC = nil, dc.errs
	}
	dw := &decoder{file: "big.yaml", whole: true}
	whole = dw.parse([]byte(text))
	if len(dw.errs) > 0 {
		whole, errW = nil, dw.errs
	}
	return
}

func TestChunkedParseMatchesWhole(t *testing.T) {
	t.Parallel()
	text := bigConfig(9000, func(int) string { return "" })
	c, w, errC, errW := parseBoth(t, text)
	if errC != nil || errW != nil {
		t.Fatalf("errors: %v / %v", errC, errW)
	}
	if len(c.Entries) != 9000 || len(w.Entries) != 9000 {
		t.Fatalf("%d and %d entries", len(c.Entries), len(w.Entries))
	}
	for i := range c.Entries {
		a, b := c.Entries[i], w.Entries[i]
		if a.Name != b.Name || a.Line != b.Line || a.Column != b.Column || a.Fingerprint != b.Fingerprint ||
			a.Location.String() != b.Location.String() || fmt.Sprint(a.Schedule) != fmt.Sprint(b.Schedule) ||
			!reflect.DeepEqual(a.Args, b.Args) || !reflect.DeepEqual(a.Kwargs, b.Kwargs) || a.Catchup != b.Catchup {
			t.Fatalf("entry %d differs:\n%+v\n%+v", i, a, b)
		}
	}
}

func TestChunkedParseErrorsMatchWhole(t *testing.T) {
	t.Parallel()
	text := bigConfig(9000, func(i int) string {
		switch i {
		case 10:
			return "  bad1: {task: t, every: 0s}\n"
		case 4500:
			return "  bad2: {task: t, crontab: {minute: 61}}\n"
		case 8999:
			return "  e00003: {task: t, every: 1s}\n" // duplicate of an early entry
		}
		return ""
	})
	_, _, errC, errW := parseBoth(t, text)
	var ec, ew Errors
	if !errors.As(errC, &ec) || !errors.As(errW, &ew) {
		t.Fatalf("errors: %v / %v", errC, errW)
	}
	if errC.Error() != errW.Error() {
		t.Fatalf("chunked errors differ:\n%v\nwhole:\n%v", errC, errW)
	}
	if len(ec) != 3 || !strings.Contains(errC.Error(), "duplicate entry \"e00003\"") {
		t.Errorf("errors: %v", errC)
	}
}

func TestChunkedParseFallsBackOnCrossChunkAlias(t *testing.T) {
	t.Parallel()
	text := bigConfig(9000, func(i int) string {
		switch i {
		case 1:
			return "  anchor: &shared {task: tasks.add, every: 5s}\n"
		case 8000:
			return "  aliased: *shared\n"
		}
		return ""
	})
	c, w, errC, errW := parseBoth(t, text)
	if errC != nil || errW != nil {
		t.Fatalf("errors: %v / %v", errC, errW)
	}
	if c.Entry("aliased") == nil || w.Entry("aliased") == nil || c.Entry("aliased").Fingerprint != c.Entry("anchor").Fingerprint {
		t.Fatal("alias across chunks lost")
	}
}
