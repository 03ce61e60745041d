package soak

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// SupportsRelative reports whether the binary's validate accepts the
// entry key relative (added by a later change): with it, entries spread
// their slots over the interval instead of all firing on the same grid.
func SupportsRelative(ctx context.Context, bin, dir string) bool {
	path := filepath.Join(dir, "probe-relative.yaml")
	if err := os.WriteFile(path, []byte("entries:\n  probe: {task: soak.probe, every: 1s, relative: true}\n"), 0o644); err != nil {
		return false
	}
	defer os.Remove(path)
	return exec.CommandContext(ctx, bin, "validate", path).Run() == nil
}

// WriteBeatdSchedule writes n entries firing every interval, one task
// name for all (beatd tells entries apart by the beat_entry header).
func WriteBeatdSchedule(path string, n int, interval time.Duration, relative bool) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("soak: write schedule: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "entries:")
	rel := ""
	if relative {
		rel = ", relative: true"
	}
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "  e%05d: {task: soak.tick, every: %s%s}\n", i, interval, rel)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("soak: write schedule: %w", err)
	}
	return f.Close()
}

// Beatd is a running beatd under test.
type Beatd struct {
	*Proc
	HTTPAddr string
	// EtcdEndpoint is the etcd it uses: its embedded one or the external.
	EtcdEndpoint string
	// DataDir is the embedded etcd's data dir ("" with an external etcd).
	DataDir string
	Prefix  string
}

// BeatdOptions says how to run beatd.
type BeatdOptions struct {
	Bin, Dir, Config, Broker string
	// EtcdEndpoint empty: the embedded etcd, data in Dir/data.
	EtcdEndpoint string
	Prefix       string
	Extra        []string
}

// StartBeatd runs `beatd run` bound to loopback ports, logging at warn,
// and waits until its HTTP port and its etcd answer.
func StartBeatd(ctx context.Context, ps *Procs, o BeatdOptions) (*Beatd, error) {
	httpPort, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	b := &Beatd{HTTPAddr: "127.0.0.1:" + strconv.Itoa(httpPort), EtcdEndpoint: o.EtcdEndpoint, Prefix: o.Prefix}
	args := []string{"run", "--config=" + o.Config, "--broker=" + o.Broker, "--http=" + b.HTTPAddr,
		"--log-level=warn", "--log-format=json", "--prefix=" + o.Prefix, "--id=soak"}
	if o.EtcdEndpoint == "" {
		cp, err := harness.FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := harness.FreePort()
		if err != nil {
			return nil, err
		}
		b.DataDir = filepath.Join(o.Dir, "data")
		b.EtcdEndpoint = "http://127.0.0.1:" + strconv.Itoa(cp)
		args = append(args, "--data-dir="+b.DataDir, "--etcd-client-port="+strconv.Itoa(cp), "--etcd-peer-port="+strconv.Itoa(pp))
	} else {
		args = append(args, "--etcd-endpoints="+o.EtcdEndpoint)
	}
	args = append(args, o.Extra...)
	r := &harness.Replica{ID: "soak", Bin: o.Bin, HTTPPort: httpPort, Args: args, LogPath: filepath.Join(o.Dir, "beatd.log"), Procs: ps}
	if err := r.Start(); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	b.Proc = r.Proc()
	// A large schedule takes a while to load: wait generously.
	if err := harness.WaitTCP(ctx, b.Proc, b.HTTPAddr, 3*time.Minute); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	return b, nil
}
