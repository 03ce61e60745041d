package testutil

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CeleryPython is Debian's interpreter, which has python3-celery; a
// python3 earlier on PATH (pyenv, a venv) may not.
const CeleryPython = "/usr/bin/python3"

// CeleryWorker is a real `celery worker -P solo` on the tiny app in
// celeryapp/, consuming from r.
type CeleryWorker struct {
	cmd     *exec.Cmd
	results *redis.Client
	Log     string
}

// AppDir is the directory of the test Celery app.
func AppDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "celeryapp")
}

// MustStartCeleryWorker starts a worker on queues and stops it when the
// test ends. It waits until the worker is consuming.
func MustStartCeleryWorker(tb testing.TB, r *Redis, queues string) *CeleryWorker {
	tb.Helper()
	return startCeleryWorker(tb, r, queues)
}

// MustStartCeleryWorkerAMQP starts a worker consuming queues from the
// RabbitMQ at brokerURL (results go to r, database 1), with env added to
// its environment (e.g. QUEUE_MAX_PRIORITY=10).
func MustStartCeleryWorkerAMQP(tb testing.TB, r *Redis, brokerURL, queues string, env ...string) *CeleryWorker {
	tb.Helper()
	if out, err := exec.Command(CeleryPython, "-c", "import celery, amqp").CombinedOutput(); err != nil {
		tb.Fatalf("Debian's python3-celery and python3-amqp are needed: apt-get install -y python3-celery python3-amqp (%v: %s)", err, out)
	}
	return startCeleryWorker(tb, r, queues, append([]string{"BROKER_URL=" + brokerURL}, env...)...)
}

// CeleryOptions start a worker the way outcome tests need one.
type CeleryOptions struct {
	Queues string // default "celery"
	// Events starts it with -E: it sends task events.
	Events bool
	// Pool and Concurrency default to solo and 1. With Events, a pool
	// that runs tasks at once is prefork: threads loses events.
	Pool        string
	Concurrency int
	// Name is its node name (default e2e@%h).
	Name string
	Env  []string
}

// MustStartCeleryWorkerWith starts a worker on r as o says.
func MustStartCeleryWorkerWith(tb testing.TB, r *Redis, o CeleryOptions) *CeleryWorker {
	tb.Helper()
	return startCelery(tb, r, o)
}

func startCeleryWorker(tb testing.TB, r *Redis, queues string, env ...string) *CeleryWorker {
	tb.Helper()
	return startCelery(tb, r, CeleryOptions{Queues: queues, Env: env})
}

func startCelery(tb testing.TB, r *Redis, o CeleryOptions) *CeleryWorker {
	tb.Helper()
	if o.Queues == "" {
		o.Queues = "celery"
	}
	if o.Pool == "" {
		o.Pool = "solo"
	}
	if o.Events && o.Pool == "threads" {
		// Celery 5.2.6's threads pool sends a task's events from the
		// thread that ran it, and its event dispatcher appends to the
		// buffer of task events without the lock its flush holds while it
		// publishes and then empties that buffer: an event appended
		// meanwhile is lost (celery/celery#10434). A test judging beatd's
		// outcomes by such a worker fails for what the worker never sent.
		tb.Fatal("a threads-pool worker loses task events (celery/celery#10434): use prefork or solo with Events")
	}
	if o.Name == "" {
		o.Name = "e2e@%h"
	}
	queues, env := o.Queues, o.Env
	if out, err := exec.Command(CeleryPython, "-c", "import celery, redis").CombinedOutput(); err != nil {
		tb.Fatalf("Debian's python3-celery and python3-redis are needed: apt-get install -y python3-celery python3-redis (%v: %s)", err, out)
	}
	w := &CeleryWorker{Log: filepath.Join(tb.TempDir(), "worker.log")}
	logf, err := os.Create(w.Log)
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{"-m", "celery", "-A", "tasks", "worker", "-P", o.Pool,
		"-Q", queues, "--loglevel=INFO", "--without-mingle", "--without-gossip", "-n", o.Name}
	if !o.Events {
		// A worker sending events keeps its heartbeats, as a real -E worker
		// does: their timer also wakes the event loop that flushes buffered
		// task events, which can otherwise wait for the next I/O.
		args = append(args, "--without-heartbeat")
	}
	if o.Concurrency > 0 {
		args = append(args, "-c", strconv.Itoa(o.Concurrency))
	}
	if o.Events {
		args = append(args, "-E")
	}
	cmd := exec.Command(CeleryPython, args...)
	cmd.Dir = AppDir()
	cmd.Env = append(append(os.Environ(), "REDIS_PORT="+strconv.Itoa(r.Port), "PYTHONDONTWRITEBYTECODE=1"), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	w.cmd = cmd
	w.results = redis.NewClient(&redis.Options{Addr: r.Addr(), DB: 1})
	tb.Cleanup(func() {
		// SIGKILL, not a warm shutdown: the test has asserted by now, and
		// a warm shutdown waits for the running tasks (tasks.sleep runs
		// 2.5-60 s) and up to 10 s more, for nothing any test reads. The
		// kernel closes the worker's sockets, so a broker requeues the
		// messages it held unacked, as on a warm shutdown.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		logf.Close()
		w.results.Close()
	})
	// Ready when the worker has written "ready." to its log.
	deadline := time.Now().Add(60 * time.Second)
	for {
		data, _ := os.ReadFile(w.Log)
		if containsReady(data) {
			return w
		}
		if time.Now().After(deadline) {
			tb.Fatalf("celery worker did not start:\n%s", data)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containsReady(log []byte) bool {
	for i := 0; i+6 <= len(log); i++ {
		if string(log[i:i+6]) == "ready." {
			return true
		}
	}
	return false
}

// Kill sends SIGKILL to the worker and all its processes, as a crashed
// host would: it reports nothing about the task it was running.
func (w *CeleryWorker) Kill() {
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
}

// TaskResult is what the result backend recorded for a task.
type TaskResult struct {
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
}

// Result returns the result backend's state for id, if it has one.
func (w *CeleryWorker) Result(tb testing.TB, id string) (TaskResult, bool) {
	tb.Helper()
	raw, err := w.results.Get(context.Background(), "celery-task-meta-"+id).Bytes()
	if err != nil {
		return TaskResult{}, false
	}
	var r TaskResult
	if err := json.Unmarshal(raw, &r); err != nil {
		tb.Fatal(err)
	}
	return r, true
}

// WaitResult waits for the result backend to hold a final state for id.
func (w *CeleryWorker) WaitResult(tb testing.TB, id string, timeout time.Duration) TaskResult {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		raw, err := w.results.Get(context.Background(), "celery-task-meta-"+id).Bytes()
		if err == nil {
			var r TaskResult
			if err := json.Unmarshal(raw, &r); err != nil {
				tb.Fatal(err)
			}
			if r.Status != "PENDING" && r.Status != "STARTED" {
				return r
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(w.Log)
			tb.Fatalf("no result for task %s after %s; worker log:\n%s", id, timeout, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
