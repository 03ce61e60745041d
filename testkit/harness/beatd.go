package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Replica is one beatd process, which can be killed and started again
// with the same arguments.
type Replica struct {
	ID  string
	Bin string
	// HTTPPort is the port of its --http listener (0 if it has none);
	// TLS, when set, is how to reach it over HTTPS (--http-tls-cert).
	HTTPPort int
	TLS      *tls.Config
	Args     []string
	// Env is added to the parent's environment.
	Env     []string
	LogPath string
	// Procs, when set, owns every process started.
	Procs *Procs

	mu   sync.Mutex
	proc *Proc
}

// Start launches the replica, appending to its log.
func (r *Replica) Start() error {
	p, err := r.Procs.Start(Spec{Name: "beatd " + r.ID, Bin: r.Bin, Args: r.Args, Env: r.Env, LogPath: r.LogPath})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.proc = p
	r.mu.Unlock()
	return nil
}

// Proc is the process last started (nil before Start).
func (r *Replica) Proc() *Proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// Running reports whether the process is up.
func (r *Replica) Running() bool {
	p := r.Proc()
	return p != nil && !p.Exited()
}

// Done closes when the process last started has exited.
func (r *Replica) Done() <-chan struct{} { return r.Proc().Done() }

// ExitCode is the exit code of the process last started, once Done.
func (r *Replica) ExitCode() int { return r.Proc().ExitCode() }

// Signal sends sig to the process.
func (r *Replica) Signal(sig syscall.Signal) {
	if p := r.Proc(); p != nil {
		_ = p.Signal(sig)
	}
}

// Wait waits up to timeout for the process to exit.
func (r *Replica) Wait(timeout time.Duration) bool {
	p := r.Proc()
	return p == nil || p.Wait(timeout)
}

// Kill SIGKILLs the process (waking it first if stopped) and waits for it.
func (r *Replica) Kill() {
	if p := r.Proc(); p != nil {
		p.Kill()
	}
}

// URL is the address of path on the replica's HTTP listener.
func (r *Replica) URL(path string) string {
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	return scheme + "127.0.0.1:" + strconv.Itoa(r.HTTPPort) + path
}

// Client is an HTTP client that reaches the replica's listener.
func (r *Replica) Client() *http.Client {
	c := &http.Client{Timeout: time.Second}
	if r.TLS != nil {
		c.Transport = &http.Transport{TLSClientConfig: r.TLS}
	}
	return c
}

// WaitHealthy waits until /healthz answers 200, giving up if the process
// exits.
func (r *Replica) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	c := r.Client()
	return Poll(ctx, timeout, 50*time.Millisecond, func() error {
		if !r.Running() {
			return fmt.Errorf("replica %s exited (log %s): %w", r.ID, r.LogPath, ErrGaveUp)
		}
		resp, err := c.Get(r.URL("/healthz"))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("replica %s /healthz: %s", r.ID, resp.Status)
		}
		return nil
	})
}

// Metric reads one sample, unlabelled (name) or labelled
// (`name{label="v"}`, as written in the exposition) from /metrics.
func (r *Replica) Metric(sample string) (float64, bool) {
	resp, err := r.Client().Get(r.URL("/metrics"))
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			// A sample may carry a timestamp after its value.
			f, err := strconv.ParseFloat(strings.Fields(v + " x")[0], 64)
			return f, err == nil
		}
	}
	return 0, false
}
