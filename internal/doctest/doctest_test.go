package doctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
)

// A docSetup is how TestDocCommands runs one doc's shell blocks: every
// block of a doc without one must be marked illustrative.
type docSetup struct {
	// inRoot runs the commands in the module's directory (README's
	// quickstart, as in a fresh checkout); else in a new directory holding
	// a copy of schedules.yaml.
	inRoot bool
	// daemon is a `beatd run` the test starts first, for a doc whose
	// commands need a running cluster that the doc does not start itself.
	daemon string
	// check, if set, checks what the doc's commands left in their
	// directory once they have all run.
	check func(t *testing.T, dir string)
	// brokerURL sets BROKER_URL, the reader's broker in the doc's
	// commands, to the test's Redis.
	brokerURL bool
	// token sets BEATD_ADMIN_TOKEN for the daemons and TOKEN for the
	// commands to one new random token.
	token bool
	// prepare, if set, puts what the doc's reader already has into its
	// directory before its first command runs, and returns the variables
	// the reader's shell has for it.
	prepare func(t *testing.T, dir string) []string
}

var setups = map[string]docSetup{
	// The tokens file its recipe makes must be one beatd loads, with
	// alice's token in it.
	"docs/access.md": {daemon: "beatd run --config schedules.yaml --broker redis://127.0.0.1:6379/0", check: func(t *testing.T, dir string) {
		tokens, err := auth.New(auth.Options{File: filepath.Join(dir, "tokens.yaml")})
		if err != nil {
			t.Fatalf("the tokens file of docs/access.md's recipe: %v", err)
		}
		tok, err := os.ReadFile(filepath.Join(dir, "alice.token"))
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := tokens.Who(strings.TrimSpace(string(tok))); !ok || id.Name != "alice" || id.Role != auth.RoleOperate {
			t.Errorf("alice.token in the recipe's tokens file: %+v, %v; want alice, operate", id, ok)
		}
	}},
	"README.md": {inRoot: true},
	// The reader has a Celery app (proj/celery.py) and beatd's contrib/,
	// as a checkout next to the binary would; the doc dumps, imports,
	// validates and checks it against Celery itself.
	"docs/migrating.md": {prepare: celeryApp, check: func(t *testing.T, dir string) {
		data, err := os.ReadFile(filepath.Join(dir, "schedules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"nightly-report":`, `"every-30s":`, `args: [1.0, "eu"]`} {
			if !strings.Contains(string(data), want) {
				t.Errorf("docs/migrating.md's import: no %s in its schedules.yaml:\n%s", want, data)
			}
		}
	}},
	"docs/backfill.md":   {daemon: "beatd run --config schedules.yaml --broker redis://127.0.0.1:6379/0", token: true},
	"docs/operations.md": {daemon: "beatd run --config schedules.yaml --broker redis://127.0.0.1:6379/0", brokerURL: true},
	"docs/schedules.md":  {},
	"docs/entries.md":    {daemon: "beatd run --config schedules.yaml --broker redis://127.0.0.1:6379/0", token: true},
}

// TestDocBlocks fails for a shell block of README.md or docs/*.md that no
// test runs and that no `# illustrative: REASON` line excuses, for an
// indented code block in README.md, and for one in docs/*.md that starts
// with a command: commands are fenced `sh` blocks, so that this rule
// sees them.
func TestDocBlocks(t *testing.T) {
	counts := map[string][2]int{}
	for _, f := range docFiles(t) {
		blocks, err := parseFile(f)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, b := range blocks {
			switch {
			case b.Indented && f == "README.md":
				t.Errorf("%s: an indented code block: fence it (```sh for commands)", b.Where())
			case b.Indented && looksLikeCommand(b):
				t.Errorf("%s: an indented block of commands, out of this rule's sight: fence it as ```sh", b.Where())
			}
			if !b.Shell() {
				continue
			}
			n := counts[f]
			_, run := setups[f]
			switch {
			case b.Illustrative != "":
				n[1]++
			case run || isInstall(b):
				n[0]++
			default:
				t.Errorf("%s: a ```%s block that TestDocCommands does not run: give %s a docSetup, or start the block with `%s REASON`",
					b.Where(), b.Info, f, IllustrativePrefix)
			}
			counts[f] = n
		}
	}
	for _, f := range docFiles(t) {
		if n, ok := counts[f]; ok {
			t.Logf("%s: %d run, %d illustrative", f, n[0], n[1])
		}
	}
}

// commandWords start the shell commands of the docs.
var commandWords = map[string]bool{"beatd": true, "bin/beatd": true, "curl": true, "make": true, "go": true,
	"redis-cli": true, "etcdctl": true, "kubectl": true, "python3": true, "export": true, "sudo": true, "docker": true, "$": true}

// looksLikeCommand reports whether an indented block starts with a shell
// command (log lines such as `beatd: broker ...` and flag fragments such
// as `--broker ...` do not).
func looksLikeCommand(b Block) bool {
	for _, l := range b.Lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		return commandWords[f[0]] || assignRE.MatchString(strings.TrimSpace(l))
	}
	return false
}

// TestDocCommands runs the shell blocks of every doc with a docSetup, one
// cluster per doc, and checks each command's exit status: 0, or the N of
// a `# exit N` line before it; and its output where a `# stdout: TEXT`
// line before it says what it prints.
//
// The commands run with `sh -c` as written, with only these changes:
//   - 127.0.0.1:6379 is the test's redis-server, 127.0.0.1:2379 and
//     127.0.0.1:2380 the ports of beatd run's etcd, and
//     http://beatd:8080 the test's beatd HTTP address;
//   - $TOKEN (with docSetup.token) and $BROKER_URL (docSetup.brokerURL)
//     are set, as the reader's shell would have them;
//   - `beatd run` (started in the background, ready when /readyz answers
//     200, stopped with SIGTERM at the end of the doc or when the doc
//     starts another, and then it must exit 0) gets free loopback ports and a data directory from BEATD_HTTP,
//     BEATD_ETCD_CLIENT_PORT, BEATD_ETCD_PEER_PORT and BEATD_DATA_DIR;
//   - the other beatd commands get BEATD_ETCD_ENDPOINTS, BEATD_BROKER and
//     BEATD_SERVER for those servers where they would reach them at their default
//     addresses (see defaults);
//   - `export` and NAME=VALUE lines set variables for the doc's later
//     commands;
//   - bin/ (README's Install block's output) is first in PATH.
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and beatd")
	}
	files := make([]string, 0, len(setups))
	for f := range setups {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) { runDoc(t, f, setups[f]) })
	}
}

// cluster is the servers and the shell of one doc.
type cluster struct {
	t        *testing.T
	dir      string
	redis    string
	httpAddr string
	etcd     string   // the embedded etcd's client URL
	etcdPort int      // its client port
	peerPort int      // its peer port
	runEnv   []string // for `beatd run`
	cliEnv   []string // for every other command
	daemons  []*daemon
}

func runDoc(t *testing.T, file string, s docSetup) {
	blocks, err := parseFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, s)
	defer c.stop()
	if s.prepare != nil {
		env := s.prepare(t, c.dir)
		c.cliEnv, c.runEnv = append(c.cliEnv, env...), append(c.runEnv, env...)
	}
	if s.daemon != "" {
		c.start(Command{Text: s.daemon}, "setup")
	}
	for _, b := range blocks {
		if !b.Shell() || b.Illustrative != "" || isInstall(b) {
			continue
		}
		cmds, err := b.Commands()
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			where := fmt.Sprintf("%s:%d", file, cmd.Line)
			if isRun(cmd.Text) {
				c.start(cmd, where)
				continue
			}
			c.run(cmd, where)
		}
	}
	if s.check != nil {
		s.check(t, c.dir)
	}
}

func newCluster(t *testing.T, s docSetup) *cluster {
	r := testutil.MustStartRedis(t)
	c := &cluster{t: t, dir: root, redis: r.Addr(),
		httpAddr: "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))}
	if !s.inRoot {
		c.dir = t.TempDir()
		data, err := os.ReadFile(filepath.Join(root, "schedules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.dir, "schedules.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.etcdPort, c.peerPort = testutil.FreePort(t), testutil.FreePort(t)
	c.runEnv = append(os.Environ(),
		"BEATD_HTTP="+c.httpAddr,
		"BEATD_ETCD_CLIENT_PORT="+strconv.Itoa(c.etcdPort),
		"BEATD_ETCD_PEER_PORT="+strconv.Itoa(c.peerPort))
	c.etcd = "http://127.0.0.1:" + strconv.Itoa(c.etcdPort)
	c.cliEnv = os.Environ()
	if s.brokerURL {
		c.cliEnv = append(c.cliEnv, "BROKER_URL=redis://"+c.redis+"/0")
	}
	if s.token {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		tok := hex.EncodeToString(b)
		c.runEnv = append(c.runEnv, "BEATD_ADMIN_TOKEN="+tok, "TOKEN="+tok)
		c.cliEnv = append(c.cliEnv, "BEATD_ADMIN_TOKEN="+tok, "TOKEN="+tok)
	}
	return c
}

// subst is the whole of what the test changes in a command's text.
func (c *cluster) subst(text string) string {
	return strings.NewReplacer(
		"127.0.0.1:6379", c.redis,
		"127.0.0.1:2379", "127.0.0.1:"+strconv.Itoa(c.etcdPort),
		"127.0.0.1:2380", "127.0.0.1:"+strconv.Itoa(c.peerPort),
		"http://beatd:8080", "http://"+c.httpAddr,
	).Replace(text)
}

// isRun reports whether a command is `beatd run`, a daemon.
func isRun(text string) bool {
	f := strings.Fields(text)
	return len(f) > 1 && filepath.Base(f[0]) == "beatd" && f[1] == "run"
}

func (c *cluster) run(cmd Command, where string) {
	c.t.Helper()
	text := c.subst(cmd.Text)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if strings.HasPrefix(text, "export ") || assignRE.MatchString(text) {
		c.export(ctx, text, where)
		return
	}
	x := exec.CommandContext(ctx, "sh", "-c", text)
	x.Dir, x.Env = c.dir, append(c.cliEnv, c.defaults(text)...)
	// both is written by the stdout and the stderr copiers at once.
	var stdout bytes.Buffer
	var both testutil.SyncBuffer
	x.Stdout, x.Stderr = io.MultiWriter(&stdout, &both), &both
	err := x.Run()
	out := both.String()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("%s: %s: %v", where, text, err)
	}
	c.t.Logf("%s: $ %s  (exit %d)\n%s", where, text, code, out)
	if code != cmd.Exit {
		c.t.Errorf("%s: %s: exit %d, the doc expects %d\n%s", where, text, code, cmd.Exit, out)
	}
	if cmd.Stdout != nil && strings.TrimSpace(stdout.String()) != *cmd.Stdout {
		c.t.Errorf("%s: %s: stdout %q, the doc expects %q", where, text, strings.TrimSpace(stdout.String()), *cmd.Stdout)
	}
}

// assignRE matches a line that only sets a shell variable: NAME=WORD,
// NAME="...", NAME='...' or NAME=$(...), and maybe a comment.
var assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=("[^"]*"|'[^']*'|\$\([^)]*\)|[^\s#])*(\s+#.*)?$`)

// export runs an `export` or assignment line and keeps the variables it
// set for the doc's later commands, daemons included, as one shell would.
func (c *cluster) export(ctx context.Context, text, where string) {
	c.t.Helper()
	x := exec.CommandContext(ctx, "sh", "-c", "set -a; "+text+"\nenv -0")
	x.Dir, x.Env = c.dir, c.cliEnv
	out, err := x.Output()
	if err != nil {
		c.t.Fatalf("%s: %s: %v", where, text, err)
	}
	c.t.Logf("%s: $ %s", where, text)
	for _, kv := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		name, _, _ := strings.Cut(kv, "=")
		if strings.Contains(text, name) {
			c.cliEnv = append(c.cliEnv, kv)
			c.runEnv = append(c.runEnv, kv)
		}
	}
}

// defaults points a beatd command at the doc's servers where it would
// reach them at their default addresses: BEATD_ETCD_ENDPOINTS if its
// --help names http://127.0.0.1:2379 as its default, BEATD_BROKER if
// redis://127.0.0.1:6379/0, BEATD_SERVER if http://127.0.0.1:8080
// (`beatd next` and `validate`, say, read no
// etcd unless told to, so they get neither).
func (c *cluster) defaults(text string) []string {
	c.t.Helper()
	f := strings.Fields(text)
	if len(f) < 2 || filepath.Base(f[0]) != "beatd" {
		return nil
	}
	x := exec.Command(f[0], f[1], "--help")
	x.Dir = c.dir
	help, err := x.CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s --help: %v\n%s", f[0], f[1], err, help)
	}
	var env []string
	if strings.Contains(string(help), "http://127.0.0.1:2379") {
		env = append(env, "BEATD_ETCD_ENDPOINTS="+c.etcd)
	}
	if strings.Contains(string(help), "redis://127.0.0.1:6379/0") {
		env = append(env, "BEATD_BROKER=redis://"+c.redis+"/0")
	}
	if strings.Contains(string(help), "http://127.0.0.1:8080") {
		env = append(env, "BEATD_SERVER=http://"+c.httpAddr)
	}
	return env
}

// daemon is a `beatd run` of a doc.
type daemon struct {
	where, text string
	exit        int
	cmd         *exec.Cmd
	log         string
	done        chan struct{}
}

// start starts a `beatd run` and waits until its /readyz answers 200.
func (c *cluster) start(cmd Command, where string) {
	c.t.Helper()
	text := c.subst(cmd.Text)
	// One at a time: a doc's next `beatd run` replaces the one before,
	// on the same ports, with a new data directory.
	c.stop()
	d := &daemon{where: where, text: text, exit: cmd.Exit, done: make(chan struct{}),
		log: filepath.Join(c.t.TempDir(), "beatd.log")}
	f, err := os.Create(d.log)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	d.cmd = exec.Command("sh", "-c", "exec "+text)
	d.cmd.Dir, d.cmd.Stdout, d.cmd.Stderr = c.dir, f, f
	d.cmd.Env = append(c.runEnv, "BEATD_DATA_DIR="+filepath.Join(c.t.TempDir(), "beatd-data"))
	c.t.Logf("%s: $ %s &", where, text)
	if err := d.cmd.Start(); err != nil {
		c.t.Fatalf("%s: %s: %v", where, text, err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	c.daemons = append(c.daemons, d)
	err = harness.Poll(context.Background(), time.Minute, 100*time.Millisecond, func() error {
		select {
		case <-d.done:
			return fmt.Errorf("exited: %s: %w", d.cmd.ProcessState, harness.ErrGaveUp)
		default:
		}
		resp, err := http.Get("http://" + c.httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		log, _ := os.ReadFile(d.log)
		c.t.Fatalf("%s: %s: not ready: %v\n%s", where, text, err, log)
	}
}

// stop sends each daemon SIGTERM and checks it exits as the doc expects.
func (c *cluster) stop() {
	for _, d := range c.daemons {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
			c.t.Errorf("%s: %s: still running 30 s after SIGTERM", d.where, d.text)
		}
		log, _ := os.ReadFile(d.log)
		if code := d.cmd.ProcessState.ExitCode(); code != d.exit {
			c.t.Errorf("%s: %s: exit %d after SIGTERM, the doc expects %d\n%s", d.where, d.text, code, d.exit, log)
		}
	}
	c.daemons = nil
}

// celeryApp writes a small Celery app, proj.celery:app, with a crontab and
// an interval entry, and copies contrib/ (celery_dump.py) beside it. The
// reader's python3 is one with Celery: Debian's, which a python3 earlier
// in PATH (pyenv's, say) may hide.
func celeryApp(t *testing.T, dir string) []string {
	t.Helper()
	files := map[string]string{
		"proj/__init__.py": "",
		"proj/celery.py": `from celery import Celery
from celery.schedules import crontab

app = Celery("proj", broker="memory://")
app.conf.timezone = "Europe/Paris"
app.conf.beat_schedule = {
    "nightly-report": {
        "task": "proj.tasks.report",
        "schedule": crontab(minute=30, hour=2),
        "args": (1.0, "eu"),
    },
    "every-30s": {"task": "proj.tasks.ping", "schedule": 30.0},
}
`,
	}
	src, err := os.ReadFile(filepath.Join(root, "contrib", "celery_dump.py"))
	if err != nil {
		t.Fatal(err)
	}
	files["contrib/celery_dump.py"] = string(src)
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, ".python")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/bin/python3", filepath.Join(bin, "python3")); err != nil {
		t.Fatal(err)
	}
	return []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}
}
