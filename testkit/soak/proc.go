package soak

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat. It
// is 100 on every Linux architecture Go supports (the kernel exports ticks
// in USER_HZ, not in its internal HZ).
const clockTick = 100

// Proc is a child process the harness owns (harness.Proc).
type Proc = harness.Proc

// Procs owns every process the harness started (harness.Procs).
type Procs = harness.Procs

// ProcStats is what /proc says about a process and its live descendants.
type ProcStats struct {
	// CPU is user + system time of the tree, children already reaped
	// included (cutime, cstime).
	CPU time.Duration
	// RSS is the sum of the tree's resident sets; HWM is the root's peak.
	RSS, HWM int64
	// RSSAnon is the anonymous part of RSS (heaps, stacks); the rest is
	// file-backed: the binary and mapped files (etcd's bbolt DB).
	RSSAnon int64
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
		rss, hwm, anon := readMem(p)
		st.RSS += rss
		st.RSSAnon += anon
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

// readMem returns VmRSS, VmHWM and RssAnon in bytes (0 when unreadable).
func readMem(pid int) (rss, hwm, anon int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rss = parseKB(v)
		} else if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm = parseKB(v)
		} else if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			anon = parseKB(v)
		}
	}
	return rss, hwm, anon
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

// hostCPU is the host's busy CPU time since boot (user, nice, system,
// irq, softirq and steal of /proc/stat's cpu line; idle and iowait not)
// in seconds, and the 1-minute load average; zeros when unreadable.
func hostCPU() (busy, load1 float64) {
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) >= 9 && f[0] == "cpu" {
			var ticks int64
			for _, i := range []int{1, 2, 3, 6, 7, 8} {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				ticks += v
			}
			busy = float64(ticks) / clockTick
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			load1, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return busy, load1
}
