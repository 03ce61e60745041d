package chaos

import (
	"os"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBeatdBinary()
	os.Exit(code)
}
