package harness

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process in its own process group, so stopping it stops
// anything it spawned and a terminal's signals do not reach it, and
// killed by the kernel if its parent dies (Pdeathsig).
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// Spec says how to run a process.
type Spec struct {
	// Name names the process in errors.
	Name string
	Bin  string
	Args []string
	// Env is added to the parent's environment.
	Env []string
	// Dir is the working directory ("" for the parent's).
	Dir string
	// LogPath receives stdout and stderr, appended.
	LogPath string
}

// Start launches s.
func Start(s Spec) (*Proc, error) {
	f, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("harness: open log of %s: %w", s.Name, err)
	}
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = f, f
	if s.Env != nil {
		cmd.Env = append(os.Environ(), s.Env...)
	}
	// Pdeathsig is the backstop for a parent killed with SIGKILL (it fires
	// when the forking OS thread ends; the Go runtime keeps its threads
	// unless a goroutine exits locked to one, which the harness never does).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("harness: start %s: %w", s.Name, err)
	}
	p := &Proc{Name: s.Name, LogPath: s.LogPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done closes when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitErr is the process's exit status, once Done.
func (p *Proc) ExitErr() error { return p.waitErr }

// ExitCode is the exit code once Done (-1 if a signal ended it).
func (p *Proc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Signal sends sig to the process itself (not its group).
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit.
func (p *Proc) Wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Kill SIGKILLs the process group, like a crash (waking a stopped
// process first), and waits for the process to exit.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, waits up to grace, then
// SIGKILLs the group. It returns how long the process took to exit and
// whether it had to be killed.
func (p *Proc) Stop(grace time.Duration) (took time.Duration, killed bool) {
	start := time.Now()
	if p.Exited() {
		return 0, false
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return time.Since(start), false
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return time.Since(start), true
}

// Procs owns a set of processes, so one call stops them all, on success,
// failure or cancellation alike. A nil *Procs owns nothing.
type Procs struct {
	mu    sync.Mutex
	procs []*Proc
}

// Start launches s and owns the process.
func (ps *Procs) Start(s Spec) (*Proc, error) {
	p, err := Start(s)
	if err != nil {
		return nil, err
	}
	ps.add(p)
	return p, nil
}

func (ps *Procs) add(p *Proc) {
	if ps == nil {
		return
	}
	ps.mu.Lock()
	ps.procs = append(ps.procs, p)
	ps.mu.Unlock()
}

// StopAll stops every process still running, the newest first.
func (ps *Procs) StopAll(grace time.Duration) {
	if ps == nil {
		return
	}
	ps.mu.Lock()
	procs := append([]*Proc(nil), ps.procs...)
	ps.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(grace)
	}
}
