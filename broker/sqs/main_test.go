package sqs

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/testkit/harness"
)

// One SQS emulator and one etcd for the package, started by the first
// test that needs them and stopped by TestMain.
var (
	emuOnce sync.Once
	emu     *harness.SQS
	emuErr  error
	emuDir  string

	etcdOnce sync.Once
	etcdSrv  *embedetcd.Server
	etcdCli  *clientv3.Client
	etcdErr  error
	etcdDir  string
)

func TestMain(m *testing.M) {
	// The emulator checks no credentials, but the AWS chain must yield
	// some; the tests that check the chain itself override these.
	os.Setenv("AWS_ACCESS_KEY_ID", "beatd-test")
	os.Setenv("AWS_SECRET_ACCESS_KEY", "beatd-test")
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	code := m.Run()
	if emu != nil {
		emu.Close()
	}
	if etcdCli != nil {
		etcdCli.Close()
	}
	if etcdSrv != nil {
		etcdSrv.Close()
	}
	for _, d := range []string{emuDir, etcdDir} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
	os.Exit(code)
}

func sharedSQS(t testing.TB) *harness.SQS {
	t.Helper()
	emuOnce.Do(func() {
		emuDir, emuErr = os.MkdirTemp("", "beatd-sqs-")
		if emuErr == nil {
			emu, emuErr = harness.StartSQS(emuDir)
		}
	})
	if emuErr != nil {
		t.Fatal(emuErr)
	}
	return emu
}

func sharedEtcd(t testing.TB) *clientv3.Client {
	t.Helper()
	etcdOnce.Do(func() {
		etcdDir, etcdErr = os.MkdirTemp("", "beatd-sqs-etcd-")
		if etcdErr != nil {
			return
		}
		var cp, pp int
		if cp, etcdErr = harness.FreePort(); etcdErr != nil {
			return
		}
		if pp, etcdErr = harness.FreePort(); etcdErr != nil {
			return
		}
		if etcdSrv, etcdErr = embedetcd.Start(embedetcd.Config{Dir: etcdDir, ClientPort: cp, PeerPort: pp}); etcdErr != nil {
			return
		}
		etcdCli, etcdErr = clientv3.New(clientv3.Config{Endpoints: etcdSrv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	})
	if etcdErr != nil {
		t.Fatal(etcdErr)
	}
	return etcdCli
}

var seq atomic.Int64

// uniq names a queue or cluster no other test uses.
func uniq(prefix string) string { return fmt.Sprintf("%s%d-%d", prefix, os.Getpid()%10000, seq.Add(1)) }

// cluster is a test's etcd prefix and its terms: elect makes a new
// leader key (its create revision is the token), depose deletes it.
type cluster struct {
	t      *testing.T
	cli    *clientv3.Client
	prefix string
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, cli: sharedEtcd(t), prefix: keys.Prefix("/beatd-test/" + uniq("c"))}
}

func (c *cluster) elect(id string) int64 {
	c.t.Helper()
	resp, err := c.cli.Put(context.Background(), keys.Leaders(c.prefix)+id, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Header.Revision
}

func (c *cluster) depose(id string) {
	c.t.Helper()
	if _, err := c.cli.Delete(context.Background(), keys.Leaders(c.prefix)+id); err != nil {
		c.t.Fatal(err)
	}
}

// dispatcher is an SQS dispatcher of c on the emulator with the broker
// URL's extra query q.
func (c *cluster) dispatcher(e *harness.SQS, q string) *SQS {
	c.t.Helper()
	u := e.BrokerURL()
	if q != "" {
		u += "&" + q
	}
	s, err := New(context.Background(), Options{URL: u, Etcd: c.cli, Prefix: c.prefix})
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// received is one message read back from the emulator.
type received struct {
	Body string
}

// drain takes every message out of queue (its SQS name).
func drain(t *testing.T, e *harness.SQS, queue string) []received {
	t.Helper()
	bodies, err := e.Drain(context.Background(), queue)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]received, len(bodies))
	for i, b := range bodies {
		out[i] = received{Body: b}
	}
	return out
}
