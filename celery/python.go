package celery

import (
	"math"
	"math/big"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Values are nil, bool, int64, *big.Int, float64, string, []any and *Map, as
// schedule's config loader produces them. These encoders write them the way
// CPython does, so messages match a Python producer's byte for byte.

const hexDigits = "0123456789abcdef"

// dialect is how one Python output format writes the pieces of a value.
type dialect struct {
	null, yes, no string
	str           func(dst []byte, s string) []byte
}

var (
	// jsonDialect is json.dumps with its defaults: separators ", " and
	// ": ", ensure_ascii=True.
	jsonDialect = dialect{null: "null", yes: "true", no: "false", str: appendJSONString}
	// reprDialect is Python's repr(): None/True/False, quoted strings.
	reprDialect = dialect{null: "None", yes: "True", no: "False", str: appendPyStr}
)

// appendJSON writes v as json.dumps would.
func appendJSON(dst []byte, v any) []byte { return appendPy(dst, v, &jsonDialect) }

// AppendJSON appends v (a value of the kinds above) as Python's
// json.dumps writes it, which is how a message body carries it: a float
// always as a float (1.0, 250.0, 1e+300, -0.0), an integer exactly,
// whatever its size. Read back as JSON or YAML, the text is the same
// value.
func AppendJSON(dst []byte, v any) []byte { return appendJSON(dst, v) }

// appendRepr writes Python's repr() of v.
func appendRepr(dst []byte, v any) []byte { return appendPy(dst, v, &reprDialect) }

func appendPy(dst []byte, v any, d *dialect) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, d.null...)
	case bool:
		if v {
			return append(dst, d.yes...)
		}
		return append(dst, d.no...)
	case int64:
		return strconv.AppendInt(dst, v, 10)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case *big.Int:
		return v.Append(dst, 10) // Python's int: exact, whatever its size
	case float64:
		return appendPyFloat(dst, v)
	case string:
		return d.str(dst, v)
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPy(dst, e, d)
		}
		return append(dst, ']')
	case *Map:
		dst = append(dst, '{')
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = d.str(dst, v.Keys[i])
			dst = append(dst, ": "...)
			dst = appendPy(dst, v.Values[i], d)
		}
		return append(dst, '}')
	}
	panic("celery: unsupported value type") // the config loader never produces one
}

// jsonEscapes and pyEscapes are the two-character escapes (after the
// backslash) of CPython's JSON encoder and of str.__repr__.
var (
	jsonEscapes = [...]byte{'"': '"', '\\': '\\', '\n': 'n', '\r': 'r', '\t': 't', '\b': 'b', '\f': 'f'}
	pyEscapes   = [...]byte{'\n': 'n', '\r': 'r', '\t': 't'}
)

// appendJSONString escapes like CPython's ensure_ascii encoder: everything
// outside printable ASCII becomes \uXXXX (surrogate pairs above the BMP).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r < rune(len(jsonEscapes)) && jsonEscapes[r] != 0:
			dst = append(dst, '\\', jsonEscapes[r])
		case r >= 0x20 && r < 0x7f:
			dst = append(dst, byte(r))
		case r > 0xffff:
			r -= 0x10000
			dst = appendU4(dst, 0xd800+(r>>10))
			dst = appendU4(dst, 0xdc00+(r&0x3ff))
		default:
			dst = appendU4(dst, r)
		}
	}
	return append(dst, '"')
}

func appendU4(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}

// appendPyFloat writes float.__repr__: the shortest round-trip digits, in
// fixed notation when the exponent is in [-4, 16), else d.ddde+XX.
func appendPyFloat(dst []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		panic("celery: non-finite float") // rejected by the config loader
	}
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // e.g. -1.2345e+06
	neg := e[0] == '-'
	if neg {
		e = e[1:]
	}
	mant, exp := e, 0
	for i, c := range e {
		if c == 'e' {
			mant = e[:i]
			exp, _ = strconv.Atoi(string(e[i+1:]))
			break
		}
	}
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	if neg {
		dst = append(dst, '-')
	}
	if exp >= -4 && exp < 16 {
		if exp < 0 {
			dst = append(dst, '0', '.')
			for i := 0; i < -exp-1; i++ {
				dst = append(dst, '0')
			}
			return append(dst, digits...)
		}
		if len(digits) <= exp+1 {
			dst = append(dst, digits...)
			for i := len(digits); i < exp+1; i++ {
				dst = append(dst, '0')
			}
			return append(dst, '.', '0')
		}
		dst = append(dst, digits[:exp+1]...)
		dst = append(dst, '.')
		return append(dst, digits[exp+1:]...)
	}
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'e')
	if exp < 0 {
		dst = append(dst, '-')
		exp = -exp
	} else {
		dst = append(dst, '+')
	}
	if exp < 10 {
		dst = append(dst, '0')
	}
	return strconv.AppendInt(dst, int64(exp), 10)
}

// appendPyStr is str.__repr__: single quotes unless the string holds a
// single quote and no double quote; printable characters stay as they are,
// others become \xNN, \uNNNN or \UNNNNNNNN.
func appendPyStr(dst []byte, s string) []byte {
	quote := byte('\'')
	if containsByte(s, '\'') && !containsByte(s, '"') {
		quote = '"'
	}
	dst = append(dst, quote)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == rune(quote) || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r < rune(len(pyEscapes)) && pyEscapes[r] != 0:
			dst = append(dst, '\\', pyEscapes[r])
		case r < 0x20 || r == 0x7f:
			dst = append(dst, '\\', 'x', hexDigits[r>>4], hexDigits[r&0xf])
		case r < 0x7f:
			dst = append(dst, byte(r))
		case unicode.IsPrint(r):
			dst = utf8.AppendRune(dst, r)
		case r < 0x100:
			dst = append(dst, '\\', 'x', hexDigits[r>>4], hexDigits[r&0xf])
		case r < 0x10000:
			dst = append(dst, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		default:
			dst = append(dst, '\\', 'U')
			for shift := 28; shift >= 0; shift -= 4 {
				dst = append(dst, hexDigits[r>>uint(shift)&0xf])
			}
		}
	}
	return append(dst, quote)
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

// saferepr truncates like Celery's saferepr(o, maxlen): a repr longer than
// maxlen is cut and ends in "...". Celery truncates inside the structure;
// beatd cuts the flat text, which keeps the header informative and bounded.
func saferepr(v any, maxlen int) string {
	b := appendRepr(nil, v)
	if len(b) <= maxlen {
		return string(b)
	}
	cut := maxlen - 3
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "..."
}
