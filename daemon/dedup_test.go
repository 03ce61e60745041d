package daemon

import (
	"testing"
	"time"

	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/config"
)

// TestDedupFor checks the dedup horizon of a replica: the longest
// catch-up window of an entry it runs, of the whole file on a sharded
// replica (whose merged config holds its led shards' alone), and of
// dcb's entries, which take the file's default.
func TestDedupFor(t *testing.T) {
	t.Parallel()
	parse := func(y string) *config.Config {
		t.Helper()
		c, err := config.Parse("s.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	long := parse("entries:\n  a: {task: t, every: 10s, catchup_window: 200h}\n")
	defaults := parse("defaults: {catchup_window: 300h}\nentries:\n  a: {task: t, every: 10s, catchup_window: 1h}\n")
	empty := long.WithEntries(nil)
	for _, tc := range []struct {
		name      string
		cfg, file *config.Config
		withDCB   bool
		want      time.Duration
	}{
		{"unsharded, the merged config's", long, nil, false, 200 * time.Hour},
		{"unsharded with dcb: dcb's entries are in the merged config", empty, nil, true, redisbroker.DefaultDedupTTL},
		{"sharded, leading nothing: the whole file's", empty, long, false, 200 * time.Hour},
		{"sharded with dcb: the file's default window", empty, defaults, true, 300 * time.Hour},
		{"sharded without dcb: the entries' windows", empty, defaults, false, redisbroker.DefaultDedupTTL},
	} {
		if got := dedupFor(tc.cfg, tc.file, tc.withDCB); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
