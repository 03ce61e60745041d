package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// write100k writes a config of 100,000 entries: intervals, Celery crontabs
// and cron specs in several zones.
func write100k(b *testing.B, path string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "timezone: Europe/Berlin\nentries:")
	zones := []string{"UTC", "America/New_York", "Asia/Tokyo", "Europe/Berlin"}
	for i := 0; i < 100_000; i++ {
		switch i % 3 {
		case 0:
			fmt.Fprintf(w, "  e%06d: {task: tasks.add, every: %ds, args: [%d, 1]}\n", i, 10+i%600, i)
		case 1:
			fmt.Fprintf(w, "  e%06d: {task: tasks.hello, crontab: {minute: '%d', hour: '*/%d'}, kwargs: {who: e%d}, timezone: %s}\n", i, i%60, 1+i%6, i, zones[i%4])
		default:
			fmt.Fprintf(w, "  e%06d: {task: tasks.report, cron: '%d %d * * 1-5', options: {queue: reports, priority: %d}}\n", i, i%60, i%24, i%10)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
}

// peakRSS reads VmHWM (peak resident set) of a process, in MiB.
func peakRSS(pid int) float64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkStart100k starts beatd on 100,000 entries and reports the time
// until it is scheduling as leader, and its peak RSS, with etcd external
// (as in production) and embedded (the default).
func BenchmarkStart100k(b *testing.B) {
	dir := b.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	write100k(b, config)
	rs := testutil.MustStartRedis(b)
	for _, mode := range []string{"external-etcd", "embedded-etcd"} {
		b.Run(mode, func(b *testing.B) {
			var starts []time.Duration
			var rss float64
			for i := 0; i < b.N; i++ {
				args := []string{"run", "--config", config, "--broker", rs.URL(0), "--http", "127.0.0.1:0",
					"--prefix", fmt.Sprintf("/bench%d/", i), "--log-level", "warn", "--log-format", "json"}
				if mode == "external-etcd" {
					srv := testutil.MustStartEmbeddedEtcd(b)
					args = append(args, "--etcd-endpoints", strings.Join(srv.Endpoints, ","))
				} else {
					args = append(args, "--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", i)),
						"--etcd-client-port", strconv.Itoa(testutil.FreePort(b)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(b)))
				}
				logPath := filepath.Join(dir, fmt.Sprintf("%s-%d.log", mode, i))
				logf, _ := os.Create(logPath)
				cmd := exec.Command(beatdBin, append(args, "--log-level", "info")...)
				cmd.Stdout, cmd.Stderr = logf, logf
				start := time.Now()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				var ready time.Time
				testutil.EventuallyErr(b, 60*time.Second, 5*time.Millisecond, "beatd to be scheduling", func() error {
					data, _ := os.ReadFile(logPath)
					if !strings.Contains(string(data), `"msg":"scheduling"`) {
						return fmt.Errorf("not scheduling yet:\n%s", data)
					}
					ready = time.Now()
					return nil
				})
				starts = append(starts, ready.Sub(start))
				time.Sleep(3 * time.Second) // let it settle into steady state
				rss = max(rss, peakRSS(cmd.Process.Pid))
				_ = cmd.Process.Signal(os.Interrupt)
				_ = cmd.Wait()
				logf.Close()
			}
			var total time.Duration
			for _, s := range starts {
				total += s
			}
			b.ReportMetric(total.Seconds()/float64(len(starts)), "start-s")
			b.ReportMetric(rss, "peak-rss-MiB")
		})
	}
}
