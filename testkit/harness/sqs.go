package harness

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// SQSEmulatorVersion is the goaws release testkit/sqsemu is built from:
// the first that speaks SQS's JSON protocol (aws-sdk-go-v2's) beside the
// query protocol (boto3's, so Kombu's).
const SQSEmulatorVersion = "v0.5.4"

// SQS is an SQS emulator (goaws, through testkit/sqsemu) on a free
// loopback port, with its own config file. It checks no credentials and
// never throttles; its FIFO deduplication is weaker than SQS's (see
// testkit/sqsemu).
type SQS struct {
	Dir  string
	Port int
	proc *Proc
}

// Endpoint is the emulator's endpoint URL.
func (s *SQS) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.Port) }

// BrokerURL is the Celery broker URL that reaches it (Kombu's form: the
// host and port are the endpoint, plain HTTP).
func (s *SQS) BrokerURL() string {
	return fmt.Sprintf("sqs://127.0.0.1:%d?region=us-east-1&is_secure=false", s.Port)
}

// QueueURL is the URL the emulator gives the queue named name.
func (s *SQS) QueueURL(name string) string {
	return s.Endpoint() + "/100010001000/" + name
}

// Proc is the emulator's process.
func (s *SQS) Proc() *Proc { return s.proc }

// Close stops the emulator.
func (s *SQS) Close() {
	if s.proc != nil {
		s.proc.Kill()
	}
}

var (
	sqsemuOnce sync.Once
	sqsemuBin  string
	sqsemuErr  error
)

// sqsemuBinary builds testkit/sqsemu once per process into the user's
// cache, keyed by its source (so an edit rebuilds it), from the Go module
// proxy.
func sqsemuBinary() (string, error) {
	sqsemuOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "..", "sqsemu")
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		h := sha256.New()
		for _, f := range []string{"main.go", "go.mod", "go.sum"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				sqsemuErr = fmt.Errorf("harness: the SQS emulator's source: %w", err)
				return
			}
			h.Write(b)
		}
		sqsemuBin = filepath.Join(cache, "beatd", fmt.Sprintf("sqsemu-goaws-%s-%x", SQSEmulatorVersion, h.Sum(nil)[:6]))
		if _, err := os.Stat(sqsemuBin); err == nil {
			return
		}
		if err := os.MkdirAll(filepath.Dir(sqsemuBin), 0o755); err != nil {
			sqsemuErr = err
			return
		}
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		tmp := sqsemuBin + ".tmp" + strconv.Itoa(os.Getpid())
		cmd := exec.Command(goBin, "build", "-o", tmp, ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			sqsemuErr = fmt.Errorf("harness: build the SQS emulator (testkit/sqsemu, goaws %s): %w\n%s", SQSEmulatorVersion, err, out)
			return
		}
		// Another package's test may have built it meanwhile: either copy
		// is the same program.
		sqsemuErr = os.Rename(tmp, sqsemuBin)
	})
	return sqsemuBin, sqsemuErr
}

// StartSQS builds (once) and starts an emulator with its config and log
// under dir, and waits until it answers.
func StartSQS(dir string) (*SQS, error) {
	bin, err := sqsemuBinary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &SQS{Dir: dir, Port: port}
	// Host and Port make the queue URLs goaws hands out; EnableDuplicates
	// turns its FIFO deduplication on (SQS always has it).
	conf := fmt.Sprintf("Local:\n  Host: 127.0.0.1\n  Port: %d\n  AccountId: \"100010001000\"\n  EnableDuplicates: true\n"+
		"  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n    ReceiveMessageWaitTimeSeconds: 0\n", port)
	cfg := filepath.Join(dir, "goaws.yaml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	s.proc, err = Start(Spec{Name: "sqsemu", Bin: bin, Dir: dir, LogPath: filepath.Join(dir, "sqsemu.log"),
		Args: []string{"-addr", "127.0.0.1:" + strconv.Itoa(port), "-config", cfg}})
	if err != nil {
		return nil, err
	}
	err = Poll(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
		if s.proc.Exited() {
			log, _ := os.ReadFile(s.proc.LogPath)
			return fmt.Errorf("%w: sqsemu exited: %s", ErrGaveUp, tail(log, 2000))
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		s.Close()
		return nil, errors.Join(errors.New("harness: the SQS emulator did not start"), err)
	}
	return s, nil
}

// Drain takes every message out of the emulator's queue named name (its
// SQS name) and returns their bodies. It stops when the queue reports
// none left, not at the first empty receive: a receive whose reply is
// lost (the SDK retries it on a reset connection) hides its messages, so
// they are received with a 1 s visibility timeout and taken again once
// they reappear. A queue that does not exist has none.
func (s *SQS) Drain(ctx context.Context, name string) ([]string, error) {
	c := awssqs.New(awssqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.Endpoint()), Credentials: aws.AnonymousCredentials{}})
	url := aws.String(s.QueueURL(name))
	var out []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url, MaxNumberOfMessages: 10, VisibilityTimeout: 1})
		if err != nil {
			if strings.Contains(err.Error(), "NonExistentQueue") {
				return out, nil
			}
			return out, fmt.Errorf("harness: receive from %s: %w", name, err)
		}
		for _, m := range r.Messages {
			out = append(out, aws.ToString(m.Body))
			if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: url, ReceiptHandle: m.ReceiptHandle}); err != nil {
				return out, fmt.Errorf("harness: delete from %s: %w", name, err)
			}
		}
		if len(r.Messages) > 0 {
			continue
		}
		a, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: url,
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
		if err != nil {
			return out, fmt.Errorf("harness: attributes of %s: %w", name, err)
		}
		if a.Attributes["ApproximateNumberOfMessages"] == "0" && a.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0" {
			return out, nil
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("harness: %s still holds messages it does not hand out: %v", name, a.Attributes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
