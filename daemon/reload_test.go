package daemon

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReloadMetricsStartAtZero: both reload results exist before the
// first reload, so rate() and absent() alerts work from the start, and a
// replica that has not reloaded counts as successful.
func TestReloadMetricsStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newReloadMetrics(reg)
	for _, res := range []string{"ok", "error"} {
		if v := testutil.ToFloat64(r.reloads.WithLabelValues(res)); v != 0 {
			t.Errorf("beatd_config_reloads_total{result=%q} = %v", res, v)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "beatd_config_reloads_total"); err != nil || n != 2 {
		t.Errorf("beatd_config_reloads_total: %d series, %v; want 2", n, err)
	}
	if v := testutil.ToFloat64(r.ok); v != 1 {
		t.Errorf("beatd_config_last_reload_successful = %v before any reload, want 1", v)
	}
}
