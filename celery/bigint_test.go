package celery

import (
	"math/big"
	"os/exec"
	"strings"
	"testing"
)

// TestBigIntLikePython: an integer beyond int64 is written as CPython's
// json.dumps and repr write it, checked against the real python3.
func TestBigIntLikePython(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	for _, lit := range []string{"123456789012345678901234567890", "-99999999999999999999", "18446744073709551616"} {
		b, _ := new(big.Int).SetString(lit, 10)
		v := []any{b, int64(1)}
		out, err := exec.Command(py, "-c", "import json,sys; v=["+lit+", 1]; print(json.dumps(v)); print(repr(v))").Output()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if got := string(appendJSON(nil, v)); got != lines[0] {
			t.Errorf("json %s, python %s", got, lines[0])
		}
		if got := string(appendRepr(nil, v)); got != lines[1] {
			t.Errorf("repr %s, python %s", got, lines[1])
		}
	}
}
