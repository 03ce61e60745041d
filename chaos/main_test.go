package chaos

import (
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

func TestMain(m *testing.M) { testutil.MainWithBeatd(m) }
