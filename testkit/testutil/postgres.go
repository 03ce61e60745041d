package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// PostgresBin is where Debian's postgresql-15 keeps initdb and postgres.
var PostgresBin = "/usr/lib/postgresql/15/bin"

// Postgres is a throwaway PostgreSQL server on a free loopback port, with
// a trust-authenticated superuser "postgres".
type Postgres struct {
	Port int
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
	cred *syscall.Credential // set when running as root
	log  *os.File
}

// URL is the server's postgres:// URL for database db.
func (p *Postgres) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}

// MustStartPostgres runs initdb in a temp dir and starts postgres for the
// test; it is stopped and removed when the test ends. initdb refuses to
// run as root, so as root both run as the "postgres" system user (or
// "nobody") on a directory chowned to it.
func MustStartPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	p, err := StartPostgres(FreePort(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// StartPostgres is MustStartPostgres for TestMain: the caller closes it.
func StartPostgres(port int) (*Postgres, error) {
	dir, err := os.MkdirTemp("", "beatd-pg")
	if err != nil {
		return nil, err
	}
	p := &Postgres{Port: port, Dir: dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, fmt.Errorf("postgres as root needs a postgres or nobody user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(PostgresBin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale", "C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := p.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections.
func (p *Postgres) Start() error {
	logf, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("beatd-pg-%d.log", p.Port)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.log = logf
	cmd := exec.Command(filepath.Join(PostgresBin, "postgres"), "-D", filepath.Join(p.Dir, "data"), "-p", strconv.Itoa(p.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+p.Dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := exec.Command(filepath.Join(PostgresBin, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres").CombinedOutput()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("postgres exited at start; see %s", logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			p.Stop()
			return fmt.Errorf("postgres not ready in 60s: %s", bytes.TrimSpace(out))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the server (fast shutdown) and waits for it.
func (p *Postgres) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
	p.log.Close()
}

// Close stops the server and removes its files.
func (p *Postgres) Close() {
	p.Stop()
	os.RemoveAll(p.Dir)
	os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("beatd-pg-%d.log", p.Port)))
}

// MustCreateDB creates a new database on p named after prefix (unique
// in this process, so -count=N reruns get fresh ones) and returns its name.
func MustCreateDB(tb testing.TB, p *Postgres, prefix string) string {
	tb.Helper()
	return mustCreateDBFrom(tb, p, prefix, "")
}

// mustCreateDBFrom is MustCreateDB copying database template ("": the
// server's default, template1).
func mustCreateDBFrom(tb testing.TB, p *Postgres, prefix, template string) string {
	tb.Helper()
	name := fmt.Sprintf("%s_%d", prefix, dbSeq.Add(1))
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres"}
	if template != "" {
		args = append(args, "-T", template)
	}
	out, err := exec.Command(filepath.Join(PostgresBin, "createdb"), append(args, name)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("createdb %s: %v\n%s", name, err, out)
	}
	return name
}

var dbSeq atomic.Int64
