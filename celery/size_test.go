package celery

import (
	"math/big"
	"testing"
)

func TestJSONSize(t *testing.T) {
	t.Parallel()
	huge, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	tests := []struct {
		name string
		v    any
	}{
		{name: "nil", v: nil},
		{name: "bools", v: []any{true, false}},
		{name: "numbers", v: []any{int64(-42), 7, huge, 0.5, 1e300, -0.0, 12345678.25}},
		{name: "empty", v: []any{[]any{}, &Map{}}},
		{name: "strings", v: []any{"plain", "quote\" back\\ nl\n tab\t", "\x01ctl", "é", "日本", "🎉"}},
		{name: "nested", v: &Map{Keys: []string{"a", "b\n"}, Values: []any{[]any{int64(1), &Map{Keys: []string{"x"}, Values: []any{nil}}}, "z"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := len(appendJSON(nil, tt.v))
			if got := JSONSize(tt.v, -1); got != want {
				t.Errorf("JSONSize = %d, want %d (%s)", got, want, appendJSON(nil, tt.v))
			}
			if got := JSONSize(tt.v, want); got != want {
				t.Errorf("JSONSize at its own limit = %d, want %d", got, want)
			}
			if want > 2 {
				if got := JSONSize(tt.v, 1); got <= 1 {
					t.Errorf("JSONSize over limit 1 = %d, want > 1", got)
				}
			}
		})
	}
}
