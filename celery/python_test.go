package celery

import (
	"testing"
)

// TestPythonEncoding: expectations printed by CPython 3.11's json.dumps and
// repr for the same values.
func TestPythonEncoding(t *testing.T) {
	t.Parallel()
	m := func(kv ...any) *Map {
		out := &Map{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i].(string), kv[i+1])
		}
		return out
	}
	tests := []struct {
		name       string
		v          any
		json, repr string
	}{
		{name: "None", v: nil, json: `null`, repr: `None`},
		{name: "True", v: true, json: `true`, repr: `True`},
		{name: "False", v: false, json: `false`, repr: `False`},
		{name: "zero", v: int64(0), json: `0`, repr: `0`},
		{name: "negative", v: int64(-7), json: `-7`, repr: `-7`},
		{name: "big int", v: int64(1) << 62, json: `4611686018427387904`, repr: `4611686018427387904`},
		{name: "1.0", v: 1.0, json: `1.0`, repr: `1.0`},
		{name: "0.1", v: 0.1, json: `0.1`, repr: `0.1`},
		{name: "-2.5", v: -2.5, json: `-2.5`, repr: `-2.5`},
		{name: "1e16", v: 1e16, json: `1e+16`, repr: `1e+16`},
		{name: "1.5e16", v: 1.5e16, json: `1.5e+16`, repr: `1.5e+16`},
		{name: "1e-05", v: 1e-05, json: `1e-05`, repr: `1e-05`},
		{name: "0.0001", v: 0.0001, json: `0.0001`, repr: `0.0001`},
		{name: "fraction", v: 123456789.125, json: `123456789.125`, repr: `123456789.125`},
		{name: "1e300", v: 1e300, json: `1e+300`, repr: `1e+300`},
		{name: "3e-10", v: 3.0e-10, json: `3e-10`, repr: `3e-10`},
		{name: "100.0", v: 100.0, json: `100.0`, repr: `100.0`},
		{name: "plain", v: "plain", json: `"plain"`, repr: `'plain'`},
		{name: "unicode", v: "Zoë ☃", json: `"Zo\u00eb \u2603"`, repr: `'Zoë ☃'`},
		{name: "single quote", v: "it's", json: `"it's"`, repr: `"it's"`},
		{name: "both quotes", v: `both ' and "`, json: `"both ' and \""`, repr: `'both \' and "'`},
		{name: "tab newline", v: "tab\tnl\n", json: `"tab\tnl\n"`, repr: `'tab\tnl\n'`},
		{name: "cr backspace formfeed", v: "cr\rbs\bff\f", json: `"cr\rbs\bff\f"`, repr: `'cr\rbs\x08ff\x0c'`},
		{name: "controls", v: "bell\x07del\x7f", json: `"bell\u0007del\u007f"`, repr: `'bell\x07del\x7f'`},
		{name: "format chars", v: "\u00ad\u200b", json: `"\u00ad\u200b"`, repr: `'\xad\u200b'`},
		{name: "astral", v: "\U0001F600 emoji", json: `"\ud83d\ude00 emoji"`, repr: "'\U0001F600 emoji'"},
		{name: "backslash", v: `\back`, json: `"\\back"`, repr: `'\\back'`},
		{name: "nbsp", v: "nbsp\u00a0x", json: `"nbsp\u00a0x"`, repr: `'nbsp\xa0x'`},
		{name: "line separator", v: "\u2028", json: `"\u2028"`, repr: `'\u2028'`},
		{name: "nested list", v: []any{int64(1), int64(2), m("b", nil)}, json: `[1, 2, {"b": null}]`, repr: `[1, 2, {'b': None}]`},
		{name: "dict order kept", v: m("who", "Zoë ☃", "n", []any{1.5, nil, true}),
			json: `{"who": "Zo\u00eb \u2603", "n": [1.5, null, true]}`, repr: `{'who': 'Zoë ☃', 'n': [1.5, None, True]}`},
		{name: "empty list", v: []any{}, json: `[]`, repr: `[]`},
		{name: "empty dict", v: &Map{}, json: `{}`, repr: `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(appendJSON(nil, tt.v)); got != tt.json {
				t.Errorf("json = %s, want %s", got, tt.json)
			}
			if got := string(appendRepr(nil, tt.v)); got != tt.repr {
				t.Errorf("repr = %s, want %s", got, tt.repr)
			}
		})
	}
}

func TestSaferepr(t *testing.T) {
	t.Parallel()
	long := make([]any, 600)
	for i := range long {
		long[i] = int64(i % 10)
	}
	got := saferepr(long, 1024)
	if len(got) != 1024 || got[len(got)-3:] != "..." {
		t.Errorf("len %d, tail %q", len(got), got[len(got)-5:])
	}
	if got := saferepr([]any{int64(2), int64(3)}, 1024); got != "[2, 3]" {
		t.Errorf("short repr = %q", got)
	}
}
