package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// sent is one message seen in the broker, from celery beat or beatd.
type sent struct {
	at    time.Time // when the observer popped it
	task  string
	beatd bool
	slot  time.Time // beatd's nominal slot (beat_slot header)
}

// observer pops every message from the "celery" queue as it arrives, so
// the test knows when each was sent, whoever sent it.
type observer struct {
	mu   sync.Mutex
	msgs []sent
	stop context.CancelFunc
	done chan struct{}
}

func startObserver(t *testing.T, r *testutil.Redis) *observer {
	cli := r.Client()
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for ctx.Err() == nil {
			res, err := cli.BRPop(ctx, time.Second, "celery").Result()
			if err != nil {
				continue // timeout (redis.Nil) or the context ended
			}
			at := time.Now()
			var m struct {
				Headers struct {
					Task     string `json:"task"`
					BeatSlot string `json:"beat_slot"`
				} `json:"headers"`
			}
			if err := json.Unmarshal([]byte(res[1]), &m); err != nil {
				t.Errorf("observer: %v: %s", err, res[1])
				continue
			}
			s := sent{at: at, task: m.Headers.Task}
			if m.Headers.BeatSlot != "" {
				s.beatd = true
				s.slot, _ = time.Parse(time.RFC3339Nano, m.Headers.BeatSlot)
			}
			o.mu.Lock()
			o.msgs = append(o.msgs, s)
			o.mu.Unlock()
		}
	}()
	t.Cleanup(func() { o.close(); cli.Close() })
	return o
}

func (o *observer) close() {
	o.stop()
	<-o.done
}

func (o *observer) snapshot() []sent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]sent(nil), o.msgs...)
}

// waitUntil polls the observed messages until cond holds.
func (o *observer) waitUntil(t *testing.T, timeout time.Duration, what string, cond func([]sent) bool) {
	t.Helper()
	testutil.EventuallyErr(t, timeout, 20*time.Millisecond, what, func() error {
		if msgs := o.snapshot(); !cond(msgs) {
			return fmt.Errorf("seen %d messages", len(msgs))
		}
		return nil
	})
}

// TestCutoverFromCeleryBeat runs real celery beat on a real app (a crontab
// every minute, intervals of 1, 2 and 5 s) against Redis across a minute
// boundary, stops it with SIGTERM, imports its schedule and state with the
// shipped helper and `beatd import --state`, and starts beatd (the built
// binary, embedded etcd). Counting both schedulers' messages: the minute
// slot is sent exactly once; no interval entry is sent sooner than its
// interval after celery beat's last send, no send of beatd's is seen
// before its slot and no two of its slots are closer than the interval
// minus 0.1 s (but for its catch-up fire at start, by policy, and the slot
// right after it), and no gap is longer than the interval plus the cutover
// (SIGTERM to beatd leading).
func TestCutoverFromCeleryBeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs celery beat and beatd processes")
	}
	if out, err := exec.Command(testutil.CeleryPython, "-c", "import celery, redis").CombinedOutput(); err != nil {
		t.Fatalf("Debian's python3-celery and python3-redis are needed: %v: %s", err, out)
	}
	r := testutil.MustStartRedis(t)
	dir := t.TempDir()
	appDir, _ := filepath.Abs(filepath.Join("testdata", "cutover"))
	helper, _ := filepath.Abs(filepath.Join("..", "..", "contrib", "celery_dump.py"))
	scheduleFile := filepath.Join(dir, "celerybeat-schedule")
	env := append(os.Environ(), "CUTOVER_BROKER="+r.URL(0), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH="+appDir)
	obs := startObserver(t, r)

	// celery beat, until it has sent the slot of the next minute boundary
	// that is at least 3 s after it began sending.
	beatLog := filepath.Join(dir, "celery-beat.log")
	logf, err := os.Create(beatLog)
	if err != nil {
		t.Fatal(err)
	}
	beat := exec.Command(testutil.CeleryPython, "-m", "celery", "-A", "cutover_app", "beat",
		"-s", scheduleFile, "--loglevel", "INFO")
	beat.Dir, beat.Env, beat.Stdout, beat.Stderr = appDir, env, logf, logf
	beat.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := beat.Start(); err != nil {
		t.Fatal(err)
	}
	beatDone := make(chan struct{})
	go func() { _ = beat.Wait(); logf.Close(); close(beatDone) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-beat.Process.Pid, syscall.SIGKILL)
		<-beatDone
		if t.Failed() {
			b, _ := os.ReadFile(beatLog)
			t.Logf("--- celery beat log ---\n%s", b)
		}
	})
	// Most of the test is celery beat running until a crontab boundary (up
	// to a minute): it starts here, while the serial tests run (it is a
	// light load: a Python process sending a few messages a second to a
	// Redis of its own), and the rest runs beside the other parallel ones.
	t.Parallel()
	obs.waitUntil(t, 60*time.Second, "celery beat's first send", func(m []sent) bool { return len(m) > 0 })
	firstSend := obs.snapshot()[0].at
	boundary := firstSend.Truncate(time.Minute).Add(time.Minute)
	if boundary.Sub(firstSend) < 3*time.Second {
		boundary = boundary.Add(time.Minute)
	}
	t.Logf("celery beat is sending since %s; the crontab slot it must send is %s", firstSend.Format(time.TimeOnly), boundary.Format(time.TimeOnly))
	obs.waitUntil(t, max(time.Until(boundary), 0)+20*time.Second, "celery beat's minute slot", func(m []sent) bool {
		for _, s := range m {
			if s.task == "tasks.minute" && !s.at.Before(boundary) {
				return true
			}
		}
		return false
	})
	// Each interval entry sent at least twice by celery beat, so the
	// switch is seen from both sides however slowly a loaded machine
	// started it (its first i5 send comes 5 s after it starts).
	obs.waitUntil(t, 60*time.Second, "celery beat's interval sends", func(m []sent) bool {
		n := map[string]int{}
		for _, s := range m {
			if !s.beatd {
				n[s.task]++
			}
		}
		return n["tasks.i1"] >= 2 && n["tasks.i2"] >= 2 && n["tasks.i5"] >= 2
	})
	// The switch must not straddle a minute slot, which neither scheduler
	// would owe (celery beat stopped, beatd not yet leading): celery beat
	// ran through the serial tests, so the next boundary may be near.
	// Within 20 s of it (a cutover takes 1-6 s here), celery beat sends it
	// first.
	if next := time.Now().Truncate(time.Minute).Add(time.Minute); time.Until(next) < 20*time.Second {
		obs.waitUntil(t, time.Until(next)+20*time.Second, "celery beat's next minute slot", func(m []sent) bool {
			for _, s := range m {
				if s.task == "tasks.minute" && !s.at.Before(next) {
					return true
				}
			}
			return false
		})
	}
	time.Sleep(300 * time.Millisecond) // a few interval sends after the boundary
	sigterm := time.Now()
	if err := syscall.Kill(beat.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-beatDone:
	case <-time.After(20 * time.Second):
		t.Fatal("celery beat did not exit on SIGTERM")
	}

	// Import: the helper dumps the app and celery beat's shelve; beatd
	// converts it and writes the state into its embedded etcd's data dir.
	dump := exec.Command(testutil.CeleryPython, helper, "cutover_app:app", "--state", scheduleFile)
	dump.Dir, dump.Env = appDir, env
	dumpJSON, err := dump.Output()
	if err != nil {
		t.Fatalf("celery_dump.py: %v: %s", err, stderrOf(err))
	}
	dumpPath := filepath.Join(dir, "dump.json")
	config := filepath.Join(dir, "schedules.yaml")
	dataDir := filepath.Join(dir, "beatd-data")
	const prefix = "/beatd/cutover/"
	if err := os.WriteFile(dumpPath, dumpJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	imp := exec.Command(beatdBin, "import", "--state", "--data-dir", dataDir, "--prefix", prefix, dumpPath)
	yamlOut, err := imp.Output()
	if err != nil {
		t.Fatalf("beatd import: %v: %s", err, stderrOf(err))
	}
	if err := os.WriteFile(config, yamlOut, 0o644); err != nil {
		t.Fatal(err)
	}

	// beatd takes over.
	rep := newReplica(t, "cutover", filepath.Join(dir, "beatd.log"))
	rep.Args = []string{"run", "--config", config, "--data-dir", dataDir,
		"--etcd-client-port", strconv.Itoa(testutil.FreePort(t)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)),
		"--broker", r.URL(0), "--id", rep.ID, "--lease-ttl", "2s", "--prefix", prefix,
		"--http", "127.0.0.1:" + strconv.Itoa(rep.HTTPPort), "--log-format", "json"}
	rep.start()
	t.Cleanup(func() {
		rep.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(rep.LogPath)
			t.Logf("--- beatd log ---\n%s\n--- schedules.yaml ---\n%s", b, yamlOut)
		}
	})
	waitFor(t, 60*time.Second, "beatd leading", func() bool {
		resp, err := http.Get(rep.URL("/status"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			Leader bool `json:"leader"`
		}
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Leader
	})
	leading := time.Now()
	cutover := leading.Sub(sigterm)
	t.Logf("cutover (SIGTERM to celery beat, import, beatd leading) took %s", cutover.Round(time.Millisecond))
	obs.waitUntil(t, 30*time.Second, "beatd's sends", func(m []sent) bool {
		n := 0
		for _, s := range m {
			if s.beatd && s.task == "tasks.i5" {
				n++
			}
		}
		return n >= 2
	})
	rep.Signal(syscall.SIGTERM)
	<-rep.Done()
	time.Sleep(300 * time.Millisecond) // the observer's last BRPOP: beatd has stopped, nothing else is sent
	obs.close()
	msgs := obs.snapshot()

	// The minute crontab: each boundary in the run was sent exactly once.
	first, last := msgs[0].at, msgs[len(msgs)-1].at
	perSlot := map[time.Time][]sent{}
	for _, s := range msgs {
		if s.task != "tasks.minute" {
			continue
		}
		slot := s.at.Truncate(time.Minute)
		if s.beatd {
			slot = s.slot
		}
		perSlot[slot] = append(perSlot[slot], s)
	}
	for b := first.Truncate(time.Minute).Add(time.Minute); b.Before(last.Add(-2 * time.Second)); b = b.Add(time.Minute) {
		if n := len(perSlot[b]); n != 1 {
			t.Errorf("minute slot %s sent %d times: %+v", b.Format(time.TimeOnly), n, perSlot[b])
		}
	}
	if got := perSlot[boundary]; len(got) != 1 || got[0].beatd {
		t.Errorf("minute slot %s: want exactly one send, by celery beat: %+v", boundary.Format(time.TimeOnly), got)
	}
	for slot, ss := range perSlot {
		// A send's slot is its minute: celery beat's first send may be
		// the minute slot it sends at the boundary itself.
		if slot.Before(first.Truncate(time.Minute)) || slot.After(last) {
			t.Errorf("minute slot %s outside the run was sent: %+v", slot, ss)
		}
	}

	// The intervals.
	for task, iv := range map[string]time.Duration{"tasks.i1": time.Second, "tasks.i2": 2 * time.Second, "tasks.i5": 5 * time.Second} {
		var seq []sent
		for _, s := range msgs {
			if s.task == task {
				seq = append(seq, s)
			}
		}
		sort.Slice(seq, func(i, j int) bool { return seq[i].at.Before(seq[j].at) })
		fb := -1 // beatd's first send
		for i, s := range seq {
			if s.beatd {
				if fb < 0 {
					fb = i
				}
			} else if fb >= 0 {
				t.Fatalf("%s: celery beat sent after beatd started", task)
			}
		}
		if fb < 2 || len(seq)-fb < 2 {
			t.Fatalf("%s: %d sends by celery beat, %d by beatd; want 2 or more of each", task, fb, len(seq)-fb)
		}
		lastCelery := seq[fb-1].at
		if d := seq[fb].slot.Sub(lastCelery); d < iv-100*time.Millisecond {
			t.Errorf("%s: beatd's first slot %s is %s after celery beat's last send: sooner than one interval", task, seq[fb].slot.Format(time.RFC3339Nano), d)
		}
		maxGap := iv + cutover + 500*time.Millisecond
		for i := 1; i < len(seq); i++ {
			gap := seq[i].at.Sub(seq[i-1].at)
			if gap > maxGap {
				t.Errorf("%s: gap of %s before send %d (%s), longer than the interval plus the cutover (%s)", task, gap, i, seq[i].at.Format(time.RFC3339Nano), maxGap)
			}
			exempt := i == fb || i == fb+1 // the catch-up fire at start, and the slot after it
			switch {
			case i < fb && gap < iv-100*time.Millisecond:
				// celery beat's own sends, as they reached Redis: its first
				// publish opens a connection and lands late. Not the cutover.
				t.Logf("%s: celery beat's sends %d and %d only %s apart", task, i-1, i, gap)
			case i > fb && !exempt && seq[i].slot.Sub(seq[i-1].slot) < iv-100*time.Millisecond:
				// Slots, not the times seen: a send seen late (beatd or this
				// observer slowed by a loaded machine) and the next one on
				// time are not two sends too close; a slot twice, or one
				// sooner than the interval, is. Sooner than its slot is
				// checked below.
				t.Errorf("%s: beatd's sends %d and %d are of slots only %s apart", task, i-1, i, seq[i].slot.Sub(seq[i-1].slot))
			}
			if i >= fb && seq[i].at.Before(seq[i].slot.Add(-100*time.Millisecond)) {
				t.Errorf("%s: beatd's send %d seen at %s, before its slot %s", task, i, seq[i].at.Format(time.RFC3339Nano), seq[i].slot.Format(time.RFC3339Nano))
			}
		}
		t.Logf("%s: %d sends by celery beat, %d by beatd; across the switch %s", task, fb, len(seq)-fb, seq[fb].at.Sub(lastCelery).Round(time.Millisecond))
	}
}

func stderrOf(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}
