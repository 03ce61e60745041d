package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// docFile is the file name of the decoder of one entry's document
// (ParseEntry): the entries API's, and django-celery-beat's rows.
const docFile = "entry"

// definedAtKey is the key the entries API stamps each document it writes
// with: when the definition was written. A document alone takes it (a
// file's entries are defined by the file, read whole at each start).
const definedAtKey = "defined_at"

// docEntryKeys are the keys of an entry given as a document.
var docEntryKeys = append(slices.Clone(entryKeys), definedAtKey)

// DefinedBy is an instant by which the entry's current definition had
// been written, zero when unknown (an entry of the file or of
// django-celery-beat, or a runtime entry written before the entries API
// stamped defined_at). It is defined_at's second rounded up, so it is
// never before the write: a leader that finds no baseline for the entry
// owes its slots from here, never from before the entry existed.
func (e *Entry) DefinedBy() time.Time {
	if e.definedAt == 0 {
		return time.Time{}
	}
	return time.Unix(int64(e.definedAt)+1, -1).UTC()
}

// definedAt decodes defined_at to its Unix second.
func (d *decoder) definedAt(n *yaml.Node) uint32 {
	t, ok := d.timestamp(n, definedAtKey, time.UTC)
	if !ok {
		return 0
	}
	if s := t.Unix(); s > 0 && s <= math.MaxUint32 {
		return uint32(s)
	}
	d.errorf(n, "%s %s is outside 1970-01-01 .. 2106-02-07", definedAtKey, t.Format(time.RFC3339))
	return 0
}

// StampDefinedAt returns the JSON object doc with defined_at set to t (in
// UTC, to the millisecond) as its first member, any defined_at of its own
// replaced: the entries API stamps each definition it writes, and a
// leader that finds no baseline for the entry owes its slots from then
// (Entry.DefinedBy). A document that is not a JSON object is returned
// unchanged, for ParseEntry to refuse.
func StampDefinedAt(doc []byte, t time.Time) ([]byte, error) {
	body := bytes.TrimSpace(doc)
	if len(body) < 2 || body[0] != '{' {
		return doc, nil
	}
	if bytes.Contains(body, []byte(`"`+definedAtKey+`"`)) {
		// Given (a document read back from the API, say): dropped, at
		// the cost of the members' order.
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return doc, nil //nolint:nilerr // ParseEntry reports the document's error
		}
		delete(m, definedAtKey)
		var err error
		if body, err = json.Marshal(m); err != nil {
			return nil, fmt.Errorf("config: re-encode the document without %s: %w", definedAtKey, err)
		}
	}
	stamp, err := json.Marshal(t.UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano))
	if err != nil {
		return nil, err
	}
	rest := bytes.TrimSpace(body[1:])
	out := make([]byte, 0, len(body)+len(definedAtKey)+len(stamp)+4)
	out = append(out, `{"`+definedAtKey+`":`...)
	out = append(out, stamp...)
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...), nil
}
