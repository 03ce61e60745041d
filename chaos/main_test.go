package chaos

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
)

func TestMain(m *testing.M) {
	testutil.MainWithBeatd(m, func() {
		if rabbit.node != nil {
			rabbit.node.Close()
		}
		if rabbit.dir != "" {
			os.RemoveAll(rabbit.dir)
		}
	})
}

// rabbit is the package's rabbitmq-server, started by the first drill on
// RabbitMQ and shared by the others (LocalConfig.Rabbit): a node's start
// took 36 s of a 88 s drill at load 15.
var rabbit struct {
	once sync.Once
	dir  string
	node *harness.Rabbit
	err  error
}

// sharedRabbit returns the package's rabbitmq-server.
func sharedRabbit(t *testing.T) *harness.Rabbit {
	t.Helper()
	rabbit.once.Do(func() {
		if rabbit.dir, rabbit.err = os.MkdirTemp("", "beatd-chaos-rabbit"); rabbit.err == nil {
			rabbit.node, rabbit.err = harness.StartRabbit(filepath.Join(rabbit.dir, "rabbit"))
		}
	})
	if rabbit.err != nil {
		t.Fatal(rabbit.err)
	}
	return rabbit.node
}
