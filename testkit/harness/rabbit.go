package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitServer is Debian's start script without the su wrapper of
// /usr/sbin/rabbitmq-server, so it runs as the calling user.
const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Rabbit is a rabbitmq-server of its own: its own node name, data and log
// directories, AMQP and distribution ports, and its own epmd on a free
// port, so it never meets another node on the machine.
type Rabbit struct {
	Dir      string
	Port     int // AMQP
	DistPort int
	EpmdPort int
	Node     string

	epmd *exec.Cmd
	cmd  *exec.Cmd
	log  *os.File
}

// URL is the broker URL of the default vhost, user guest.
func (r *Rabbit) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d//", r.Port) }

// StartRabbit starts a node with data under dir and waits until it accepts
// AMQP connections.
func StartRabbit(dir string) (*Rabbit, error) {
	if _, err := os.Stat(rabbitServer); err != nil {
		return nil, errors.New("rabbitmq-server not installed (Debian: apt-get install -y rabbitmq-server)")
	}
	r := &Rabbit{Dir: dir}
	for _, p := range []*int{&r.Port, &r.DistPort, &r.EpmdPort} {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		*p = port
	}
	r.Node = fmt.Sprintf("beatd%d@localhost", r.Port)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n"+
		"log.console = true\nlog.console.level = warning\nlog.file = false\n", r.Port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o600); err != nil {
		return nil, err
	}
	// Our own epmd, in the foreground, so that stopping the node stops it
	// too (Erlang would otherwise start a daemon that outlives the test).
	epmd, err := exec.LookPath("epmd")
	if err != nil {
		epmd = "/usr/lib/erlang/bin/epmd"
	}
	r.epmd = exec.Command(epmd, "-port", strconv.Itoa(r.EpmdPort), "-address", "127.0.0.1")
	r.epmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.epmd.Start(); err != nil {
		return nil, fmt.Errorf("epmd: %w", err)
	}
	if err := r.Start(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Start (re)starts the node on the same ports and data, and waits until it
// accepts connections.
func (r *Rabbit) Start() error {
	if r.cmd != nil {
		return nil
	}
	var err error
	r.log, err = os.OpenFile(filepath.Join(r.Dir, "rabbit.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(rabbitServer)
	cmd.Env = append(os.Environ(),
		"HOME="+r.Dir, // the Erlang cookie
		"RABBITMQ_NODENAME="+r.Node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.Port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(r.DistPort),
		"ERL_EPMD_PORT="+strconv.Itoa(r.EpmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.Dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.Dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.Dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.Dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(r.Dir, "rabbit.pid"),
		"RABBITMQ_LOGS=-",
		// A node that cannot start writes its crash dump to the working
		// directory: the test's package, or the repository's root.
		"ERL_CRASH_DUMP="+filepath.Join(r.Dir, "erl_crash.dump"),
	)
	cmd.Dir = r.Dir
	cmd.Stdout, cmd.Stderr = r.log, r.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rabbitmq-server: %w", err)
	}
	r.cmd = cmd
	deadline := time.Now().Add(120 * time.Second)
	for {
		conn, err := amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.Dir, "rabbit.log"))
			r.Kill()
			return fmt.Errorf("rabbitmq-server on port %d did not start: %v\n%s", r.Port, err, tail(log, 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Kill stops the node with SIGKILL, like a crash. Persistent messages in
// durable queues that were confirmed survive it.
func (r *Rabbit) Kill() {
	if r.cmd == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	_ = r.cmd.Wait()
	r.cmd = nil
	if r.log != nil {
		r.log.Close()
		r.log = nil
	}
}

// Stop stops the node gracefully (SIGTERM), or kills it after timeout.
func (r *Rabbit) Stop(timeout time.Duration) {
	if r.cmd == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	r.cmd = nil
	if r.log != nil {
		r.log.Close()
		r.log = nil
	}
}

// Running reports whether the node's process is up.
func (r *Rabbit) Running() bool { return r.cmd != nil }

// Close stops the node and its epmd.
func (r *Rabbit) Close() {
	r.Stop(15 * time.Second)
	if r.epmd != nil && r.epmd.Process != nil {
		_ = syscall.Kill(-r.epmd.Process.Pid, syscall.SIGKILL)
		_ = r.epmd.Wait()
		r.epmd = nil
	}
}

// Dial opens a connection to the node.
func (r *Rabbit) Dial() (*amqp.Connection, error) {
	return amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}
