// Command sqsemu runs goaws v0.5.4, an SQS emulator, for beatd's tests:
// goaws's own main listens on 0.0.0.0, so this one serves the same router
// on the address it is given (tests pass a free 127.0.0.1 port).
//
// It corrects one known goaws v0.5.4 bug and nothing else: its JSON
// SendMessageBatch reply names its lists SendMessageBatchResultEntry and
// BatchResultErrorEntry (the query protocol's XML names) where SQS names
// them Successful and Failed, so an AWS SDK sees neither. The reply is
// renamed on the way out, so beatd's batch path runs against the
// emulator's real batch handling. Everything else goaws does, including
// its weaker FIFO deduplication (EnableDuplicates, records erased on
// delete), is left as it is: tests must not credit it with SQS's
// semantics.
//
// It is a module of its own so that beatd's module does not depend on
// the emulator; testkit/harness builds it from the module proxy.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/Admiral-Piett/goaws/app/conf"
	"github.com/Admiral-Piett/goaws/app/gosqs"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (host:port)")
	config := flag.String("config", "", "goaws YAML config (its Port must match -addr's)")
	env := flag.String("env", "Local", "environment in the config")
	flag.Parse()
	logrus.SetFormatter(&logrus.JSONFormatter{})
	logrus.SetOutput(os.Stderr)
	logrus.SetLevel(logrus.WarnLevel)
	conf.LoadYamlConfig(*config, *env)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("sqsemu: listen: %v", err)
	}
	quit := make(chan bool)
	go gosqs.PeriodicTasks(time.Second, quit)
	// The harness waits for this line.
	os.Stdout.WriteString("sqsemu listening on " + ln.Addr().String() + "\n")
	log.Fatal(http.Serve(ln, fixBatchReply(router.New())))
}

// fixBatchReply renames goaws's JSON SendMessageBatch reply keys to SQS's.
func fixBatchReply(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
			next.ServeHTTP(w, r)
			return
		}
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		body := rec.body.Bytes()
		var m map[string]json.RawMessage
		if rec.status == http.StatusOK && json.Unmarshal(body, &m) == nil {
			for from, to := range map[string]string{"SendMessageBatchResultEntry": "Successful", "BatchResultErrorEntry": "Failed"} {
				if v, ok := m[from]; ok {
					delete(m, from)
					m[to] = v
				}
			}
			if b, err := json.Marshal(m); err == nil {
				body = b
			}
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.status)
		_, _ = w.Write(body)
	})
}

type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
func (r *recorder) WriteHeader(code int)        { r.status = code }
