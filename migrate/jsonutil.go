package migrate

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// orderedObject splits a JSON object into its members, in order.
func orderedObject(raw json.RawMessage) ([]Option, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, got %s", raw)
	}
	var out []Option
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, Option{Key: kt.(string), Value: v})
	}
	return out, nil
}

// canonical re-encodes JSON compactly with Go's string escapes (which YAML
// reads in double-quoted scalars; JSON's "\/" it does not), keeping the
// order of object members and the text of numbers.
func canonical(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b bytes.Buffer
	if err := writeCanonical(&b, dec); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeCanonical(b *bytes.Buffer, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		closer := map[json.Delim]byte{'[': ']', '{': '}'}[t]
		b.WriteByte(byte(t))
		first := true
		for dec.More() {
			if !first {
				b.WriteString(", ")
			}
			first = false
			if t == '{' {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				writeString(b, kt.(string))
				b.WriteString(": ")
			}
			if err := writeCanonical(b, dec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		b.WriteByte(closer)
	case string:
		writeString(b, t)
	case json.Number:
		b.WriteString(t.String())
	case bool:
		fmt.Fprint(b, t)
	case nil:
		b.WriteString("null")
	}
	return nil
}

// writeString writes s double-quoted, as Go's JSON encoder does, except
// that the characters YAML does not read as themselves in a
// double-quoted scalar are escaped too: DEL and the C1 controls (refused
// as "control characters"), U+0085 (a line break YAML folds into a
// space; U+2028 and U+2029 Go escapes already), U+FEFF, U+FFFE and U+FFFF.
func writeString(b *bytes.Buffer, s string) {
	var enc bytes.Buffer
	e := json.NewEncoder(&enc)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)
	out := bytes.TrimSuffix(enc.Bytes(), []byte("\n")) // the encoder's newline
	for _, r := range string(out) {
		if r == 0x7f || r >= 0x80 && r <= 0x9f || r == 0xfeff || r == 0xfffe || r == 0xffff {
			fmt.Fprintf(b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
}

// quote is s as a YAML double-quoted scalar.
func quote(s string) string {
	var b bytes.Buffer
	writeString(&b, s)
	return b.String()
}
