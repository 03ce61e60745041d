package celery

import (
	"math/big"
	"strconv"
)

// JSONSize is the length of v as the message body writes it (json.dumps
// with ensure_ascii), for the values Compile takes, without building it.
// It stops counting once past limit (limit < 0: no limit) and then
// returns a size above limit.
func JSONSize(v any, limit int) int {
	c := sizer{limit: limit}
	c.value(v)
	return c.n
}

type sizer struct {
	n, limit int
}

func (c *sizer) over() bool { return c.limit >= 0 && c.n > c.limit }

func (c *sizer) value(v any) {
	if c.over() {
		return
	}
	switch v := v.(type) {
	case nil:
		c.n += len(jsonDialect.null)
	case bool:
		if v {
			c.n += len(jsonDialect.yes)
		} else {
			c.n += len(jsonDialect.no)
		}
	case int64:
		var buf [24]byte
		c.n += len(strconv.AppendInt(buf[:0], v, 10))
	case int:
		var buf [24]byte
		c.n += len(strconv.AppendInt(buf[:0], int64(v), 10))
	case *big.Int:
		c.n += len(v.Text(10))
	case float64:
		var buf [40]byte
		c.n += len(appendPyFloat(buf[:0], v))
	case string:
		c.str(v)
	case []any:
		c.n += 2 + 2*max(len(v)-1, 0) // [ ] and ", "
		for _, e := range v {
			c.value(e)
		}
	case *Map:
		c.n += 2 + 2*max(v.Len()-1, 0) + 2*v.Len() // { }, ", " and ": "
		for i := 0; i < v.Len(); i++ {
			c.str(v.Keys[i])
			c.value(v.Values[i])
		}
	default:
		panic("publisher: unsupported value type") // as appendPy
	}
}

// str counts appendJSONString's output.
func (c *sizer) str(s string) {
	c.n += 2
	for _, r := range s {
		switch {
		case r < rune(len(jsonEscapes)) && jsonEscapes[r] != 0:
			c.n += 2
		case r >= 0x20 && r < 0x7f:
			c.n++
		case r > 0xffff:
			c.n += 12
		default:
			c.n += 6
		}
	}
}
