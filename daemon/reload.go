package daemon

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// Reload re-reads the config. A bad file keeps the running config.
func (m *Main) Reload() {
	if m.Park {
		m.log.Info("parked: no config to reload (restart without --park to run the schedule)")
		return
	}
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	// Remember what was tried, good or bad, so the watcher reloads when the
	// file changes again (including back to the running version).
	m.configSum = fileSum(m.ConfigPath)
	cfg, err := m.loadConfig()
	if err == nil {
		err = m.merger.SetFile(cfg)
	}
	if err != nil {
		m.reloadMetrics.reloads.WithLabelValues("error").Inc()
		m.reloadMetrics.ok.Set(0)
		m.log.Error("config reload failed; keeping the running config", "config", m.ConfigPath, "errors", strings.Split(err.Error(), "\n"))
		return
	}
	m.reloadMetrics.reloads.WithLabelValues("ok").Inc()
	m.reloadMetrics.ok.Set(1)
	m.log.Info("config reloaded", "config", m.ConfigPath, "entries", len(cfg.Entries))
	m.configAccepted(len(cfg.Entries))
}

func fileSum(path string) [32]byte {
	b, _ := os.ReadFile(path)
	return sha256.Sum256(b)
}

// watchConfig reloads when the config file changes. It watches the
// directory, so the symlink swap Kubernetes does for a ConfigMap counts.
func (m *Main) watchConfig(ctx context.Context) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		m.log.Warn("config watch unavailable; SIGHUP still reloads", "err", err)
		return
	}
	defer w.Close()
	abs, _ := filepath.Abs(m.ConfigPath)
	if err := w.Add(filepath.Dir(abs)); err != nil {
		m.log.Warn("config watch unavailable; SIGHUP still reloads", "err", err)
		return
	}
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			name := filepath.Base(ev.Name)
			if name == filepath.Base(abs) || strings.HasPrefix(name, "..") {
				debounce = m.clock.After(200 * time.Millisecond)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			m.log.Warn("config watch", "err", err)
		case <-debounce:
			debounce = nil
			m.reloadMu.Lock()
			same := fileSum(m.ConfigPath) == m.configSum
			m.reloadMu.Unlock()
			if !same {
				m.Reload()
			}
		}
	}
}

// reloadMetrics count config reloads. The daemon owns them: it is what
// reloads (SIGHUP and the file watch), through the source merger.
type reloadMetrics struct {
	reloads *prometheus.CounterVec // result
	ok      prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) *reloadMetrics {
	r := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_config_reloads_total", Help: "Config reloads by result."}, []string{"result"}),
		ok:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_config_last_reload_successful", Help: "1 if the last config reload succeeded."}),
	}
	r.ok.Set(1)
	// Both results exist from the start, so alerts see them at 0.
	for _, res := range []string{"ok", "error"} {
		r.reloads.WithLabelValues(res)
	}
	reg.MustRegister(r.reloads, r.ok)
	return r
}
