package soak

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat. It
// is 100 on every Linux architecture Go supports (the kernel exports ticks
// in USER_HZ, not in its internal HZ).
const clockTick = 100

// Proc is a child process the harness owns: in its own process group, so
// stopping it stops anything it spawned, and killed by the kernel if the
// harness dies (Pdeathsig).
type Proc struct {
	Name    string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	logf    *os.File
	LogPath string
}

// Procs owns every process the harness started, so one call stops them
// all, on success, failure or cancellation alike.
type Procs struct {
	mu    sync.Mutex
	procs []*Proc
}

// Start launches name with args, stdout and stderr to logPath, in dir.
func (ps *Procs) Start(name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("soak: open log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Pdeathsig is the backstop for a harness killed with SIGKILL (it fires
	// when the forking OS thread ends; the Go runtime keeps its threads
	// unless a goroutine exits locked to one, which this package never does).
	err = cmd.Start()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("soak: start %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{}), logf: f, LogPath: logPath}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.procs = append(ps.procs, p)
	ps.mu.Unlock()
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

// StopAll stops every process still running, the newest first.
func (ps *Procs) StopAll(grace time.Duration) {
	ps.mu.Lock()
	procs := append([]*Proc(nil), ps.procs...)
	ps.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(grace)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("soak: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitTCP waits until addr accepts connections, the process exits, or the
// timeout passes.
func WaitTCP(ctx context.Context, p *Proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("soak: %s exited before listening on %s (log %s)", p.Name, addr, p.LogPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("soak: %s not listening after %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ProcStats is what /proc says about a process and its live descendants.
type ProcStats struct {
	// CPU is user + system time of the tree, children already reaped
	// included (cutime, cstime).
	CPU time.Duration
	// RSS is the sum of the tree's resident sets; HWM is the root's peak.
	RSS, HWM int64
	// WriteBytes is what the tree caused to be written to storage
	// (/proc/PID/io write_bytes).
	WriteBytes int64
	Procs      int
}

// ReadProcStats reads pid's tree. An error means pid itself is gone.
func ReadProcStats(pid int) (ProcStats, error) {
	var st ProcStats
	tree := append([]int{pid}, descendants(pid)...)
	for i, p := range tree {
		cpu, err := readCPU(p)
		if err != nil {
			if i == 0 {
				return st, err
			}
			continue // a child ended between the scan and the read
		}
		st.CPU += cpu
		st.Procs++
		rss, hwm := readMem(p)
		st.RSS += rss
		if i == 0 {
			st.HWM = hwm
		}
		st.WriteBytes += readWriteBytes(p)
	}
	return st, nil
}

// readCPU returns utime+stime+cutime+cstime from /proc/PID/stat.
func readCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("soak: read stat of %d: %w", pid, err)
	}
	f, err := statFields(b)
	if err != nil {
		return 0, fmt.Errorf("soak: stat of %d: %w", pid, err)
	}
	var ticks int64
	for _, i := range []int{13, 14, 15, 16} { // utime stime cutime cstime (fields 14-17)
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("soak: stat field %d of %d: %w", i+1, pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTick, nil
}

// statFields splits /proc/PID/stat into its fields, field 1 at index 0.
// The command name (field 2) may hold spaces and parentheses, so it is
// taken up to the last ')'.
func statFields(b []byte) ([]string, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return nil, errors.New("malformed /proc stat")
	}
	f := []string{strings.TrimSpace(string(b[:open])), string(b[open+1 : end])}
	f = append(f, strings.Fields(string(b[end+1:]))...)
	if len(f) < 22 {
		return nil, errors.New("short /proc stat")
	}
	return f, nil
}

// readMem returns VmRSS and VmHWM in bytes (0 when unreadable).
func readMem(pid int) (rss, hwm int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rss = parseKB(v)
		} else if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm = parseKB(v)
		}
	}
	return rss, hwm
}

func parseKB(v string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
	return n * 1024
}

func readWriteBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// descendants lists the live descendants of pid, from /proc/*/stat.
func descendants(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f, err := statFields(b)
		if err != nil {
			continue
		}
		ppid, _ := strconv.Atoi(f[3])
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// DirSize is the disk space used by the files under dir (allocated
// blocks, not apparent sizes), skipping files that vanish mid-walk.
func DirSize(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			} else {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// Machine describes the host a run measured.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel,omitempty"`
	MemMiB   int64  `json:"mem_mib,omitempty"`
	Load1    string `json:"loadavg_at_start,omitempty"`
}

// ReadMachine reads nproc, the CPU model, memory and load.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				m.MemMiB = parseKB(v) >> 20
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load1 = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}
