package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SoakConfig parameterises a soak run.
type SoakConfig struct {
	// Bin is the beatd binary.
	Bin      string
	Entries  int
	Interval time.Duration
	Duration time.Duration
	Sample   time.Duration
	// ExternalEtcd runs Debian's etcd binary instead of beatd's embedded
	// one; CPU, RSS and disk then count both processes.
	ExternalEtcd bool
	// RedisAOF runs the broker with an append-only file fsynced every
	// second (RedisAOFArgs), as a production Redis does; off, Redis
	// persists nothing.
	RedisAOF bool
	// Out is where the JSON report goes ("" for none).
	Out string
	// GrowthWindow is the tail of the run whose linear fit judges growth
	// (5 min); a run shorter than twice that fits its second half.
	GrowthWindow time.Duration
	DBLimit      GrowthLimit
	RSSLimit     GrowthLimit
	// BrokerLimit judges Redis's used_memory, KeysLimit its key count
	// (fitted as if each key were a byte).
	BrokerLimit, KeysLimit GrowthLimit
	// DrainEvery makes the consumer empty the queue once per period
	// instead of continuously (0).
	DrainEvery time.Duration
	// SteadyAfter is the start-up part left out of the steady figures
	// (delivered, worst window): windows starting before it (default 1
	// minute).
	SteadyAfter time.Duration
	// Extra arguments for `beatd run`.
	Extra []string
	// Keep the run's directory (logs, data) even when it passed.
	Keep bool
	// Log receives the table as it is sampled.
	Log io.Writer
}

// DefaultDBLimit and DefaultRSSLimit are the growth thresholds: a slope
// over the growth window above max(absolute, relative × mean) per minute
// is growth. 1 MiB/min of etcd DB is 1.4 GiB a day, which would fill the
// default 2 GiB quota within two days; 4 MiB/min of RSS (5.6 GiB a day)
// stays above a Go heap's noise between GC cycles at 10 s samples.
var (
	DefaultDBLimit  = GrowthLimit{AbsMiBPerMin: 1, RelPerMin: 0.005}
	DefaultRSSLimit = GrowthLimit{AbsMiBPerMin: 4, RelPerMin: 0.01}
	// DefaultBrokerLimit: 1 MiB/min of the broker's memory is 1.4 GiB a
	// day in the user's Redis, which is also the Celery broker.
	DefaultBrokerLimit = GrowthLimit{AbsMiBPerMin: 1, RelPerMin: 0.005}
	// DefaultKeysLimit: 1,000 keys a minute (or 0.5 % of the mean), where
	// a key per fire at 1,000 fires/s is 60,000.
	DefaultKeysLimit = GrowthLimit{AbsMiBPerMin: 1000.0 / (1 << 20), RelPerMin: 0.005}
)

// SoakSample is one row of the soak table.
type SoakSample struct {
	T        float64   `json:"t_s"`
	At       time.Time `json:"at"`
	Fires    int       `json:"fires"`
	FiresPS  float64   `json:"fires_per_s"`
	Offered  float64   `json:"offered"`
	Lag      LagStats  `json:"lag"`
	Repeats  int       `json:"repeats"`
	Gaps     int       `json:"gaps"`
	Unparsed int       `json:"unparsed"`
	// Backlog is the queue's length at the sample: a growing one means
	// the consumer fell behind and its delay is in the lag.
	Backlog int64 `json:"backlog"`

	Etcd EtcdSample `json:"etcd"`
	// RedisUsed is the broker's used_memory and RedisKeys the keys in
	// beatd's database (its own, the queue and the bindings): what the
	// user's Redis pays for beatd.
	RedisUsed int64 `json:"redis_used_memory_bytes"`
	RedisKeys int64 `json:"redis_keys"`
	// RedisUsedPeak is the largest used_memory of the readings once a
	// second over the trailing BrokerPeakWindow: what the broker's growth
	// is judged by (RedisUsed, one reading, aliases the history's
	// sawtooth).
	RedisUsedPeak int64 `json:"redis_used_memory_peak_bytes"`
	RSSAnon       int64 `json:"rss_anon_bytes"`
	// Redis is the rest of the broker's INFO the window is judged by:
	// its persistence (AOF size, rewrites, forks, delayed fsyncs).
	Redis RedisInfo `json:"redis"`
	// RedisCPU is redis-server's CPU (its reaped rewrite children
	// included), HostBusy the whole host's, OtherCPU the host's minus
	// beatd's, Redis's and this test process's: other load on the
	// machine (a compile, say) in CPUs over the window.
	RedisCPU float64 `json:"redis_cpu_s"`
	HostBusy float64 `json:"host_busy_s"`
	SelfCPU  float64 `json:"self_cpu_s"`
	OtherCPU float64 `json:"other_cpus"`
	// RedisCPUs is Redis's CPU over the window, in CPUs; Delivered the
	// window's fires over its offered fires, in percent.
	RedisCPUs float64 `json:"redis_cpus"`
	Delivered float64 `json:"delivered_pct"`
	Load1     float64 `json:"load1"`
	DataDir   int64   `json:"data_dir_bytes"`
	RSS       int64   `json:"rss_bytes"`
	HWM       int64   `json:"hwm_bytes"`
	CPU       float64 `json:"cpu_s"`
	// Per fire, over this window.
	CPUPerFireUs     float64 `json:"cpu_per_fire_us"`
	PutBytesPerFire  float64 `json:"etcd_put_bytes_per_fire"`
	RevisionsPerFire float64 `json:"etcd_revisions_per_fire"`
	DiskWritePerFire float64 `json:"disk_write_bytes_per_fire"`
	WriteBytes       int64   `json:"write_bytes"`
	BeatdAlive       bool    `json:"beatd_alive"`
	hist             Hist
}

// SoakReport is the outcome of a soak.
type SoakReport struct {
	Machine  Machine  `json:"machine"`
	Binary   string   `json:"binary"`
	Entries  int      `json:"entries"`
	Interval string   `json:"interval"`
	Duration string   `json:"duration"`
	Etcd     string   `json:"etcd"`
	Redis    string   `json:"redis"`
	Relative bool     `json:"relative"`
	Extra    []string `json:"extra_args,omitempty"`
	Dir      string   `json:"dir"`
	// Pids of the processes the run started, by name.
	Pids map[string]int `json:"pids"`

	StartupS float64      `json:"startup_to_first_fire_s"`
	Samples  []SoakSample `json:"samples"`
	Growth   []Growth     `json:"growth"`

	Fires        int      `json:"fires"`
	Offered      float64  `json:"offered"`
	Lag          LagStats `json:"lag"`
	Repeats      int      `json:"repeats"`
	Gaps         int      `json:"gaps"`
	CPUPerFireUs float64  `json:"cpu_per_fire_us"`
	// BytesPerFire is what etcd stored per fire (keys + values put);
	// BytesMethod says how it was measured.
	BytesPerFire float64 `json:"etcd_bytes_per_fire"`
	BytesMethod  string  `json:"etcd_bytes_method"`
	// PrefixBytesPerFire is the same from the keys under beatd's prefix.
	PrefixBytesPerFire float64 `json:"prefix_bytes_per_fire"`
	PrefixMethod       string  `json:"prefix_bytes_method"`
	RevisionsPerFire   float64 `json:"etcd_revisions_per_fire"`
	DiskWritePerFire   float64 `json:"disk_write_bytes_per_fire"`
	// Steady: delivery from SteadyFromS on, window by window, as
	// received in each window; SteadyBySlot: of the slots due in each
	// window, how many were delivered by the end (after the last drain).
	Steady           Steady  `json:"steady"`
	SteadyBySlot     *Steady `json:"steady_by_slot,omitempty"`
	DrainEvery       string  `json:"drain_every,omitempty"`
	ShutdownS        float64 `json:"shutdown_s"`
	ShutdownKilled   bool    `json:"shutdown_killed"`
	shutdownMeasured bool
	keysAtStart      KeyVersions
	brokerPeakWindow time.Duration

	Failures []string `json:"failures"`
	OK       bool     `json:"ok"`
}

// RunSoak runs beatd on cfg.Entries entries for cfg.Duration and samples
// it. It stops every process it started before it returns, and returns
// within Duration plus a bounded start-up and shut-down time (or sooner,
// when ctx ends). A failed verdict is in the report, with a non-nil error.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Entries <= 0 || cfg.Interval <= 0 || cfg.Duration <= 0 || cfg.Sample <= 0 {
		return nil, errors.New("soak: entries, interval, duration and sample must be positive")
	}
	if cfg.GrowthWindow <= 0 {
		cfg.GrowthWindow = 5 * time.Minute
	}
	// The hard bound: start-up (build excluded) + the run + shut-down.
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+8*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "beatd-soak-")
	if err != nil {
		return nil, fmt.Errorf("soak: temp dir: %w", err)
	}
	r := &SoakReport{Machine: ReadMachine(), Binary: cfg.Bin, Entries: cfg.Entries, Interval: cfg.Interval.String(),
		Duration: cfg.Duration.String(), Etcd: "embedded", Redis: "no persistence", Extra: cfg.Extra, Dir: dir, Failures: []string{},
		Pids: map[string]int{}}
	if cfg.ExternalEtcd {
		r.Etcd = "external (etcd binary)"
	}
	if cfg.RedisAOF {
		r.Redis = "AOF " + strings.Join(RedisAOFArgs, " ")
	}
	if cfg.DrainEvery > 0 {
		r.DrainEvery = cfg.DrainEvery.String()
	}
	ps := &Procs{}
	defer func() {
		ps.StopAll(10 * time.Second)
		switch {
		case cfg.Keep:
		case r.OK:
			os.RemoveAll(dir)
		default:
			// Keep the logs of a failed run, not its etcd data (which is
			// what a failed soak has too much of).
			os.RemoveAll(filepath.Join(dir, "data"))
			os.RemoveAll(filepath.Join(dir, "etcd0", "data"))
		}
	}()
	err = runSoak(ctx, cfg, ps, dir, r)
	if err != nil {
		r.Failures = append(r.Failures, err.Error())
	}
	r.OK = len(r.Failures) == 0
	if cfg.Out != "" {
		if b, jerr := json.MarshalIndent(r, "", "  "); jerr == nil {
			if werr := os.WriteFile(cfg.Out, b, 0o644); werr != nil {
				fmt.Fprintf(cfg.Log, "soak: write %s: %v\n", cfg.Out, werr)
			}
		}
	}
	r.WriteSummary(cfg.Log)
	if !r.OK {
		return r, fmt.Errorf("soak failed (logs in %s): %s", dir, strings.Join(r.Failures, "; "))
	}
	return r, nil
}

func runSoak(ctx context.Context, cfg SoakConfig, ps *Procs, dir string, r *SoakReport) error {
	rs, err := StartRedis(ps, dir, cfg.RedisAOF)
	if err != nil {
		return err
	}
	r.Pids["redis-server"] = rs.Pid()
	redisPid := rs.Pid()
	var etcdProc *Proc
	endpoint, etcdDir := "", ""
	if cfg.ExternalEtcd {
		e, err := StartEtcd(ps, dir)
		if err != nil {
			return err
		}
		etcdProc, endpoint, etcdDir = e.Proc(), e.Endpoint, e.DataDir()
		r.Pids["etcd"] = etcdProc.Pid()
	}
	r.brokerPeakWindow = BrokerPeakWindow(cfg.Interval, cfg.Sample)
	r.Relative = SupportsRelative(ctx, cfg.Bin, dir)
	config := filepath.Join(dir, "schedules.yaml")
	if err := WriteBeatdSchedule(config, cfg.Entries, cfg.Interval, r.Relative); err != nil {
		return err
	}
	rdb := rs.Client(0)
	defer rdb.Close()
	cons := StartConsumerEvery(rdb, "celery", LagSlot, cfg.Interval, cfg.DrainEvery)
	defer cons.Stop()
	peak := startUsedMemoryPeak(rdb, BrokerPeakWindow(cfg.Interval, cfg.Sample))
	defer peak.Stop()

	started := time.Now()
	bd, err := StartBeatd(ctx, ps, BeatdOptions{Bin: cfg.Bin, Dir: dir, Config: config, Broker: rs.URL(0),
		EtcdEndpoint: endpoint, Prefix: "/soak/", Extra: cfg.Extra})
	if err != nil {
		return err
	}
	r.Pids["beatd"] = bd.Pid()
	if etcdDir == "" {
		etcdDir = bd.DataDir
	}
	probe, err := NewEtcdProbe(bd.EtcdEndpoint)
	if err != nil {
		return err
	}
	defer probe.Close()
	if err := waitFirstFire(ctx, cons, bd.Proc, 3*time.Minute); err != nil {
		return err
	}
	r.StartupS = time.Since(started).Seconds()
	fmt.Fprintf(cfg.Log, "soak: %d entries every %s, etcd %s, relative=%v, first fire after %.1fs; sampling every %s for %s (dir %s)\n",
		cfg.Entries, cfg.Interval, r.Etcd, r.Relative, r.StartupS, cfg.Sample, cfg.Duration, dir)

	pids := []*Proc{bd.Proc}
	if etcdProc != nil {
		pids = append(pids, etcdProc)
	}
	read := func(w Window, t0 time.Time, prev *SoakSample) SoakSample {
		s := SoakSample{At: w.End, T: w.End.Sub(t0).Seconds(), Fires: w.Messages, Lag: w.Lag.Stats(),
			Repeats: w.Repeats, Gaps: w.Gaps, Unparsed: w.Unparsed, BeatdAlive: !bd.Exited(), hist: w.Lag}
		if d := w.End.Sub(w.Start).Seconds(); d > 0 {
			s.FiresPS = float64(w.Messages) / d
			s.Offered = float64(cfg.Entries) * w.End.Sub(w.Start).Seconds() / cfg.Interval.Seconds()
		}
		var cpu time.Duration
		gone := false
		for _, p := range pids {
			st, err := ReadProcStats(p.Pid())
			if err != nil {
				gone = true
				continue
			}
			cpu += st.CPU
			s.RSS += st.RSS
			s.RSSAnon += st.RSSAnon
			s.HWM += st.HWM
			s.WriteBytes += st.WriteBytes
		}
		s.CPU = cpu.Seconds()
		if gone && prev != nil {
			// A process ended: keep its last reading rather than count
			// its CPU and writes as undone.
			s.CPU, s.RSS, s.RSSAnon, s.HWM, s.WriteBytes = prev.CPU, prev.RSS, prev.RSSAnon, prev.HWM, prev.WriteBytes
		}
		s.Backlog = cons.Backlog(ctx)
		s.RedisUsed, s.RedisKeys = redisFootprint(ctx, rdb)
		s.RedisUsedPeak = peak.Peak(time.Now(), s.RedisUsed)
		s.Redis = readRedisInfo(ctx, rdb)
		if st, err := ReadProcStats(redisPid); err == nil {
			s.RedisCPU = st.CPU.Seconds()
		} else if prev != nil {
			s.RedisCPU = prev.RedisCPU
		}
		s.HostBusy, s.Load1 = hostCPU()
		if st, err := ReadProcStats(os.Getpid()); err == nil {
			s.SelfCPU = st.CPU.Seconds()
		}
		s.Etcd = probe.Sample(ctx)
		s.DataDir = DirSize(etcdDir)
		if prev != nil && s.Fires > 0 {
			f := float64(s.Fires)
			s.CPUPerFireUs = (s.CPU - prev.CPU) * 1e6 / f
			if s.Etcd.PutBytes >= 0 && prev.Etcd.PutBytes >= 0 {
				s.PutBytesPerFire = float64(s.Etcd.PutBytes-prev.Etcd.PutBytes) / f
			}
			if s.Etcd.OK && prev.Etcd.OK {
				s.RevisionsPerFire = float64(s.Etcd.Revision-prev.Etcd.Revision) / f
			}
			s.DiskWritePerFire = float64(s.WriteBytes-prev.WriteBytes) / f
		}
		if d := w.End.Sub(w.Start).Seconds(); prev != nil && d > 0 && s.HostBusy > 0 && prev.HostBusy > 0 {
			s.OtherCPU = max(0, ((s.HostBusy-prev.HostBusy)-(s.CPU-prev.CPU)-(s.RedisCPU-prev.RedisCPU)-(s.SelfCPU-prev.SelfCPU))/d)
		}
		if d := w.End.Sub(w.Start).Seconds(); prev != nil && d > 0 {
			s.RedisCPUs = (s.RedisCPU - prev.RedisCPU) / d
		}
		if s.Offered > 0 {
			s.Delivered = 100 * float64(s.Fires) / s.Offered
		}
		return s
	}

	cons.Take() // the start-up's messages are not part of the run
	t0 := time.Now()
	base := read(Window{Start: t0, End: t0}, t0, nil)
	if r.keysAtStart, err = probe.PrefixVersions(ctx, "/soak/"); err != nil {
		fmt.Fprintf(cfg.Log, "soak: %v (no per-key measure of etcd bytes)\n", err)
	}
	r.Samples = append(r.Samples, base)
	writeSoakHeader(cfg.Log)
	writeSoakRow(cfg.Log, base)
	tick := time.NewTicker(cfg.Sample)
	defer tick.Stop()
	end := t0.Add(cfg.Duration)
	var stopped error
loop:
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			stopped = fmt.Errorf("soak: interrupted at t=%.0fs: %w", time.Since(t0).Seconds(), ctx.Err())
			break loop
		case <-bd.Done():
			// No last sample: its etcd (embedded) is gone with it.
			stopped = fmt.Errorf("soak: beatd exited during the run at t=%.0fs (%v); log %s", time.Since(t0).Seconds(), bd.ExitErr(), bd.LogPath)
			break loop
		case <-tick.C:
		}
		s := read(cons.Take(), t0, &r.Samples[len(r.Samples)-1])
		r.Samples = append(r.Samples, s)
		writeSoakRow(cfg.Log, s)
	}
	// The figures so far are worth a summary even when the run was cut.
	r.summarise(ctx, cfg, probe)
	if stopped != nil {
		return stopped
	}
	// The last window's slots are published a lag after they are due:
	// give beatd two intervals to publish them before it stops, so the
	// per-slot figures (counted after the drain) do not miss them.
	select {
	case <-ctx.Done():
	case <-time.After(2 * cfg.Interval):
	}
	took, killed := bd.Stop(30 * time.Second)
	r.ShutdownS, r.ShutdownKilled, r.shutdownMeasured = took.Seconds(), killed, true
	if killed {
		r.Failures = append(r.Failures, "beatd did not exit within 30s of SIGTERM")
	}
	// What beatd published before it stopped is still due to be counted:
	// let the consumer empty the queue, then count each window's slots.
	drained := drainQueue(ctx, cons, max(2*cfg.DrainEvery, 10*time.Second))
	if err := cons.Stop(); err != nil {
		r.Failures = append(r.Failures, err.Error())
	}
	if drained {
		st := slotDelivery(r.Samples, cons.SlotCounts(), cfg.Entries, cfg.Interval, cfg.SteadyAfter)
		r.SteadyBySlot = &st
		if st.Windows > 0 && st.WorstPct == 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("publishing stopped: no slot due in the window ending at t=%.0fs was delivered", st.WorstT))
		}
	} else {
		fmt.Fprintf(cfg.Log, "soak: the queue did not empty after beatd stopped: no per-slot delivery figures\n")
	}
	return nil
}

// drainQueue waits until the consumer has emptied the queue (true), or
// timeout.
func drainQueue(ctx context.Context, cons *Consumer, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if cons.Backlog(ctx) == 0 {
			// The last batch popped may still be being recorded.
			time.Sleep(500 * time.Millisecond)
			return cons.Backlog(ctx) == 0
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// slotDelivery judges the windows of samples like steadyDelivery, but
// counts in each window the messages whose slot fell in it (counts: by
// slot's Unix second), wherever they were received: what the scheduler
// delivered of the window's due slots, independent of when the consumer
// took them. A window holds the whole seconds from its start, rounded
// up, to its end, rounded up; each is due entries x 1s/interval slots.
func slotDelivery(samples []SoakSample, counts map[int64]int, entries int, interval, after time.Duration) Steady {
	by := make([]SoakSample, len(samples))
	perSecond := float64(entries) * time.Second.Seconds() / interval.Seconds()
	for i, s := range samples {
		by[i] = s
		if i == 0 {
			continue
		}
		from, to := ceilUnix(samples[i-1].At), ceilUnix(s.At)
		n := 0
		for sec := from; sec < to; sec++ {
			n += counts[sec]
		}
		by[i].Fires = n
		by[i].Offered = perSecond * float64(to-from)
		by[i].Delivered = 0
		if by[i].Offered > 0 {
			by[i].Delivered = 100 * float64(n) / by[i].Offered
		}
	}
	return steadyDelivery(by, after)
}

func ceilUnix(t time.Time) int64 {
	sec := t.Unix()
	if t.Nanosecond() > 0 {
		sec++
	}
	return sec
}

// waitFirstFire waits until the consumer has seen a message.
func waitFirstFire(ctx context.Context, cons *Consumer, p *Proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if cons.Total().Messages > 0 {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("soak: %s exited before its first fire (%v); log %s", p.Name, p.ExitErr(), p.LogPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("soak: no message from %s within %s; log %s", p.Name, timeout, p.LogPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// summarise computes the totals, the growth fits and the verdict.
func (r *SoakReport) summarise(ctx context.Context, cfg SoakConfig, probe *EtcdProbe) {
	if len(r.Samples) < 2 {
		r.Failures = append(r.Failures, "fewer than two samples")
		return
	}
	first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
	var lag Hist
	for i, s := range r.Samples[1:] {
		lag.Merge(&s.hist)
		r.Fires += s.Fires
		r.Offered += s.Offered
		r.Repeats += s.Repeats
		r.Gaps += s.Gaps
		// Publishing stopped: a whole window (at least one interval long)
		// without a message, while every entry was due in it.
		// (With a periodic drain a window may receive nothing: the slots
		// judge it then, after the last drain.)
		if s.Fires == 0 && s.Offered >= float64(cfg.Entries) && cfg.DrainEvery == 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("publishing stopped: no message in the window ending at t=%.0fs (sample %d)", s.T, i+1))
		}
		if len(s.Etcd.Alarms) > 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("etcd alarm %v at t=%.0fs", s.Etcd.Alarms, s.T))
		}
		if !s.Etcd.OK {
			r.Failures = append(r.Failures, fmt.Sprintf("etcd status failed at t=%.0fs: %s", s.T, s.Etcd.Err))
		}
	}
	r.Lag = lag.Stats()
	r.Steady = steadyDelivery(r.Samples, cfg.SteadyAfter)
	if r.Repeats > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d messages repeated or reordered an entry's slot", r.Repeats))
	}
	if r.Fires == 0 {
		r.Failures = append(r.Failures, "no fire during the run")
		return
	}
	f := float64(r.Fires)
	r.CPUPerFireUs = (last.CPU - first.CPU) * 1e6 / f
	r.DiskWritePerFire = float64(last.WriteBytes-first.WriteBytes) / f
	if last.Etcd.OK && first.Etcd.OK {
		r.RevisionsPerFire = float64(last.Etcd.Revision-first.Etcd.Revision) / f
	}
	// Two measures of what etcd stored per fire: etcd's own put counter
	// (everything the member applied), and the keys under beatd's prefix
	// (version deltas x current sizes: beatd's own keys only).
	if r.keysAtStart != nil && last.Etcd.OK {
		if now, err := probe.PrefixVersions(ctx, "/soak/"); err == nil {
			puts, bytes := now.PutsSince(r.keysAtStart)
			r.PrefixBytesPerFire = float64(bytes) / f
			r.PrefixMethod = fmt.Sprintf("the puts to the keys under /soak/, from each key's version delta, times its current key+value size, / fires "+
				"(%d puts to %d keys, %.3f per fire); exact for values of stable size, high while values grow, blind to keys deleted in between", puts, len(now), float64(puts)/f)
		} else {
			r.PrefixMethod = "unavailable: " + err.Error()
		}
	}
	switch {
	case last.Etcd.PutBytes >= 0 && first.Etcd.PutBytes >= 0:
		r.BytesPerFire = float64(last.Etcd.PutBytes-first.Etcd.PutBytes) / f
		r.BytesMethod = "delta of etcd_debugging_mvcc_total_put_size_in_bytes (key+value bytes of every put the member applied, beatd's leases and election included) / fires"
	case r.PrefixMethod != "" && !strings.HasPrefix(r.PrefixMethod, "unavailable"):
		r.BytesPerFire = r.PrefixBytesPerFire
		r.BytesMethod = "estimate (no put counter): " + r.PrefixMethod
	default:
		r.BytesMethod = "unavailable: no put counter, and the keys could not be read"
	}

	// Growth: a linear fit over the tail window.
	window := cfg.GrowthWindow
	note := ""
	if cfg.Duration < 2*window {
		window = cfg.Duration / 2
		note = "run shorter than twice the growth window: fitted over its second half"
	}
	var ts, db, inUse, rss, dd, rmem, rkeys []float64
	for _, s := range r.Samples {
		if s.T < last.T-window.Seconds()-0.5 {
			continue
		}
		ts = append(ts, s.T)
		db = append(db, float64(s.Etcd.DBSize))
		inUse = append(inUse, float64(s.Etcd.DBSizeInUse))
		rss = append(rss, float64(s.RSS))
		dd = append(dd, float64(s.DataDir))
		rmem = append(rmem, float64(s.RedisUsedPeak))
		rkeys = append(rkeys, float64(s.RedisKeys))
	}
	r.Growth = []Growth{
		FitGrowth("etcd DB size", ts, db, cfg.DBLimit, true),
		FitGrowth("RSS", ts, rss, cfg.RSSLimit, true),
		FitGrowth("etcd DB size in use", ts, inUse, cfg.DBLimit, false),
		FitGrowth("data dir", ts, dd, cfg.DBLimit, false),
		FitGrowth("Redis used_memory peak", ts, rmem, cfg.BrokerLimit, true),
		FitGrowth("Redis keys (as bytes)", ts, rkeys, cfg.KeysLimit, true),
	}
	if n := last.RedisKeys; n > int64(5*cfg.Entries+100) {
		r.Failures = append(r.Failures, fmt.Sprintf("Redis holds %d keys for %d entries: more than 5 per entry + 100", n, cfg.Entries))
	}
	for i := range r.Growth {
		r.Growth[i].Note = note
	}
	for _, g := range r.Growth {
		if g.Judged && g.Samples < 3 {
			r.Failures = append(r.Failures, fmt.Sprintf("%s: %d samples in the growth window, too few to judge (run longer or sample more often)", g.Metric, g.Samples))
		}
		if g.Judged && g.Growing {
			r.Failures = append(r.Failures, fmt.Sprintf("%s still growing: %.2f MiB/min over the last %ds (limit %.2f MiB/min)", g.Metric, g.SlopeMiBPerMin, g.WindowS, g.LimitMiBPerMin))
		}
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func writeSoakHeader(w io.Writer) {
	fmt.Fprintf(w, "%6s %7s %8s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %6s %7s %9s %8s %6s %7s %7s %5s %5s\n",
		"t(s)", "fires", "fires/s", "deliv%", "lag p50", "lag p99", "db MiB", "inuse", "dir MiB", "rss MiB", "cpu s", "cpu/fire", "etcd B/f", "disk B/f", "gaps", "queue", "redis MiB", "keys",
		"r cpus", "aof MiB", "rewrite", "other", "load1")
}

func writeSoakRow(w io.Writer, s SoakSample) {
	put := "-"
	if s.PutBytesPerFire > 0 {
		put = fmt.Sprintf("%.0f", s.PutBytesPerFire)
	}
	rewrite := fmt.Sprintf("%d", s.Redis.AOFRewrites)
	if s.Redis.AOFRewriting {
		rewrite += "+"
	}
	fmt.Fprintf(w, "%6.0f %7d %8.0f %6.1f %6.1fms %6.1fms %8.1f %8.1f %8.1f %8.1f %8.1f %6.0fus %8s %8.0f %6d %7d %9.1f %8d %6.2f %7.1f %7s %5.2f %5.2f\n",
		s.T, s.Fires, s.FiresPS, s.Delivered, s.Lag.P50ms, s.Lag.P99ms, mib(s.Etcd.DBSize), mib(s.Etcd.DBSizeInUse), mib(s.DataDir),
		mib(s.RSS), s.CPU, s.CPUPerFireUs, put, s.DiskWritePerFire, s.Gaps, s.Backlog, mib(s.RedisUsed), s.RedisKeys,
		s.RedisCPUs, mib(s.Redis.AOFSize), rewrite, s.OtherCPU, s.Load1)
}

// WriteSummary prints the verdict and the per-fire figures.
func (r *SoakReport) WriteSummary(w io.Writer) {
	verdict := "PASS"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\nsoak %s: %d entries every %s for %s, etcd %s; machine: %d CPUs, %s\n", verdict, r.Entries, r.Interval, r.Duration, r.Etcd, r.Machine.CPUs, r.Machine.CPUModel)
	if r.Offered > 0 {
		fmt.Fprintf(w, "  fires: %d of %.0f offered (%.1f%%), lag p50 %.1fms p99 %.1fms max %.1fms (%s)\n", r.Fires, r.Offered, 100*float64(r.Fires)/r.Offered, r.Lag.P50ms, r.Lag.P99ms, r.Lag.MaxMs, LagSlot)
	}
	fmt.Fprintf(w, "  CPU per fire (beatd%s, utime+stime): %.1f us\n", map[bool]string{true: " + etcd", false: " incl. its embedded etcd"}[strings.HasPrefix(r.Etcd, "external")], r.CPUPerFireUs)
	fmt.Fprintf(w, "  etcd bytes per fire: %.1f B, %.3f revisions per fire; %s\n", r.BytesPerFire, r.RevisionsPerFire, r.BytesMethod)
	if r.PrefixMethod != "" {
		fmt.Fprintf(w, "  beatd's keys in etcd per fire: %.1f B; %s\n", r.PrefixBytesPerFire, r.PrefixMethod)
	}
	fmt.Fprintf(w, "  bytes written to disk per fire (/proc write_bytes, WAL + bbolt + logs): %.0f B\n", r.DiskWritePerFire)
	if len(r.Samples) > 0 {
		l := r.Samples[len(r.Samples)-1]
		fmt.Fprintf(w, "  at the end: etcd DB %.1f MiB (in use %.1f), data dir %.1f MiB, RSS %.1f MiB (anonymous %.1f, peak %.1f), Redis %.1f MiB (peak of the last %s %.1f) in %d keys\n",
			mib(l.Etcd.DBSize), mib(l.Etcd.DBSizeInUse), mib(l.DataDir), mib(l.RSS), mib(l.RSSAnon), mib(l.HWM), mib(l.RedisUsed), r.brokerPeakWindow, mib(l.RedisUsedPeak), l.RedisKeys)
	}
	for _, g := range r.Growth {
		judged := "informational"
		if g.Judged {
			judged = fmt.Sprintf("limit %.2f MiB/min", g.LimitMiBPerMin)
			if g.Growing {
				judged += ": GROWING"
			}
		}
		fmt.Fprintf(w, "  growth %-20s %+8.2f MiB/min over the last %ds, mean %.1f MiB (%s)\n", g.Metric, g.SlopeMiBPerMin, g.WindowS, g.MeanMiB, judged)
	}
	if len(r.Growth) > 0 && r.Growth[0].Note != "" {
		fmt.Fprintf(w, "  growth window: %s\n", r.Growth[0].Note)
	}
	if r.DrainEvery != "" {
		fmt.Fprintf(w, "  the consumer drained the queue every %s\n", r.DrainEvery)
	}
	if st := r.Steady; st.Windows > 0 {
		fmt.Fprintf(w, "  steady part, as received (windows from t=%.0fs): %d of %.0f offered (%.1f%%, target >= 98%%: %s); worst window %.1f%% at t=%.0fs; windows < 80%%: %d (target 0: %s), < 90%%: %d, of %d\n",
			st.FromS, st.Fires, st.Offered, st.DeliveredPct, metMark(st.DeliveredPct >= 98), st.WorstPct, st.WorstT, st.Below80, metMark(st.Below80 == 0), st.Below90, st.Windows)
		for _, d := range st.Dips {
			fmt.Fprintf(w, "    dip %s\n", d)
		}
	}
	if st := r.SteadyBySlot; st != nil && st.Windows > 0 {
		fmt.Fprintf(w, "  steady part, due slots delivered (by each message's slot, counted after the last drain): %d of %.0f due (%.2f%%, target >= 98%%: %s); worst window %.1f%% at t=%.0fs; windows < 80%%: %d (target 0: %s), < 90%%: %d, of %d\n",
			st.Fires, st.Offered, st.DeliveredPct, metMark(st.DeliveredPct >= 98), st.WorstPct, st.WorstT, st.Below80, metMark(st.Below80 == 0), st.Below90, st.Windows)
		for _, d := range st.Dips {
			fmt.Fprintf(w, "    dip (by slot) %s\n", d)
		}
	}
	if r.shutdownMeasured {
		fmt.Fprintf(w, "  shutdown after SIGTERM: %.2fs\n", r.ShutdownS)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  FAIL: %s\n", f)
	}
}

// redisFootprint reads the broker's used_memory and the keys in beatd's
// database; -1 where Redis did not answer.
func redisFootprint(ctx context.Context, rdb *redis.Client) (used, keys int64) {
	used, keys = usedMemory(ctx, rdb), -1
	if n, err := rdb.DBSize(ctx).Result(); err == nil {
		keys = n
	}
	return used, keys
}

// Steady is the delivery of a soak's steady part: every window that
// started at or after FromS.
type Steady struct {
	FromS        float64 `json:"from_s"`
	Windows      int     `json:"windows"`
	Fires        int     `json:"fires"`
	Offered      float64 `json:"offered"`
	DeliveredPct float64 `json:"delivered_pct"`
	WorstPct     float64 `json:"worst_window_pct"`
	WorstT       float64 `json:"worst_window_t_s"`
	Below80      int     `json:"windows_below_80pct"`
	Below90      int     `json:"windows_below_90pct"`
	// Dips describe the windows below 90 %: what Redis, beatd and the
	// rest of the host did in them.
	Dips []string `json:"dips,omitempty"`
}

// steadyDelivery judges the windows of samples that start at or after
// after (1 minute when 0).
func steadyDelivery(samples []SoakSample, after time.Duration) Steady {
	if after <= 0 {
		after = time.Minute
	}
	st := Steady{FromS: after.Seconds(), WorstPct: -1}
	for i := 1; i < len(samples); i++ {
		prev, s := samples[i-1], samples[i]
		if prev.T < st.FromS-0.5 || s.Offered <= 0 {
			continue
		}
		st.Windows++
		st.Fires += s.Fires
		st.Offered += s.Offered
		if st.WorstPct < 0 || s.Delivered < st.WorstPct {
			st.WorstPct, st.WorstT = s.Delivered, s.T
		}
		if s.Delivered < 80 {
			st.Below80++
		}
		if s.Delivered < 90 {
			st.Below90++
			rw := ""
			if s.Redis.AOFRewriting || s.Redis.AOFRewrites > prev.Redis.AOFRewrites {
				rw = fmt.Sprintf(", AOF rewrite (%d done, in progress %v)", s.Redis.AOFRewrites-prev.Redis.AOFRewrites, s.Redis.AOFRewriting)
			}
			st.Dips = append(st.Dips, fmt.Sprintf("t=%.0fs: %.1f%% delivered, lag p99 %.0fms max %.0fms, queue %d, beatd %.0fus/fire, Redis %.2f CPUs%s, forks +%d (last %.1fms), delayed fsyncs +%d, AOF %.0f MiB, other load %.2f CPUs, load1 %.2f",
				s.T, s.Delivered, s.Lag.P99ms, s.Lag.MaxMs, s.Backlog, s.CPUPerFireUs, s.RedisCPUs, rw, s.Redis.Forks-prev.Redis.Forks,
				float64(s.Redis.LatestForkUs)/1000, s.Redis.AOFDelayedFsync-prev.Redis.AOFDelayedFsync, mib(s.Redis.AOFSize), s.OtherCPU, s.Load1))
		}
	}
	if st.Offered > 0 {
		st.DeliveredPct = 100 * float64(st.Fires) / st.Offered
	}
	return st
}

func metMark(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
