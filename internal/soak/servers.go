package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Redis is a redis-server the harness started.
type Redis struct {
	*Proc
	Port int
}

// StartRedis starts redis-server on a free loopback port, without
// persistence: the runs measure the scheduler, not Redis's disk.
func StartRedis(ctx context.Context, ps *Procs, dir string) (*Redis, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("soak: redis-server not on PATH (Debian: apt-get install -y redis-server)")
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p, err := ps.Start("redis-server", filepath.Join(dir, "redis.log"), dir, nil, "redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no",
		"--protected-mode", "yes", "--daemonize", "no")
	if err != nil {
		return nil, err
	}
	r := &Redis{Proc: p, Port: port}
	if err := WaitTCP(ctx, p, r.Addr(), 15*time.Second); err != nil {
		return nil, err
	}
	return r, nil
}

// Addr is host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// URL is a Celery broker URL for database db.
func (r *Redis) URL(db int) string { return fmt.Sprintf("redis://%s/%d", r.Addr(), db) }

// Client opens a client on database db.
func (r *Redis) Client(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr(), DB: db, ReadTimeout: 10 * time.Second, PoolSize: 4})
}

// StartEtcd starts the etcd binary (Debian's etcd-server) as the external
// etcd of a run, on free loopback ports, with data in dir.
func StartEtcd(ctx context.Context, ps *Procs, dir string) (*Proc, string, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, "", errors.New("soak: etcd not on PATH (Debian: apt-get install -y etcd-server)")
	}
	cp, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	pp, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", cp)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	p, err := ps.Start("etcd", filepath.Join(dir, "etcd.log"), dir, nil, "etcd",
		"--name", "soak", "--data-dir", filepath.Join(dir, "etcd-data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "soak="+peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn")
	if err != nil {
		return nil, "", err
	}
	if err := WaitTCP(ctx, p, strings.TrimPrefix(client, "http://"), 30*time.Second); err != nil {
		return nil, "", err
	}
	return p, client, nil
}

// EtcdProbe reads an etcd member's size and write counters from outside.
type EtcdProbe struct {
	endpoint string
	cli      *clientv3.Client
	http     *http.Client
}

// NewEtcdProbe connects to endpoint (http://127.0.0.1:PORT).
func NewEtcdProbe(endpoint string) (*EtcdProbe, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("soak: etcd client for %s: %w", endpoint, err)
	}
	return &EtcdProbe{endpoint: endpoint, cli: cli, http: &http.Client{Timeout: 5 * time.Second}}, nil
}

// Close closes the client.
func (p *EtcdProbe) Close() { p.cli.Close() }

// EtcdSample is one reading of the member.
type EtcdSample struct {
	OK          bool   `json:"ok"`
	DBSize      int64  `json:"db_size"`
	DBSizeInUse int64  `json:"db_size_in_use"`
	Revision    int64  `json:"revision"`
	RaftIndex   uint64 `json:"raft_index"`
	// PutBytes is etcd_debugging_mvcc_total_put_size_in_bytes: the key
	// and value bytes of every put the member applied (-1: unavailable).
	PutBytes int64 `json:"put_bytes"`
	// Puts is etcd_mvcc_put_total (-1: unavailable).
	Puts   int64    `json:"puts"`
	Alarms []string `json:"alarms,omitempty"`
	Err    string   `json:"error,omitempty"`
}

// Sample reads Status (DbSize, DbSizeInUse, revision) over gRPC and the
// mvcc put counters from the member's /metrics on its client port (etcd
// serves /metrics there even when no separate metrics listener is set).
func (p *EtcdProbe) Sample(ctx context.Context) EtcdSample {
	s := EtcdSample{PutBytes: -1, Puts: -1}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := p.cli.Status(sctx, p.endpoint)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.OK = true
	s.DBSize, s.DBSizeInUse, s.Revision, s.RaftIndex = st.DbSize, st.DbSizeInUse, st.Header.Revision, st.RaftIndex
	if al, err := p.cli.AlarmList(sctx); err == nil {
		for _, a := range al.Alarms {
			s.Alarms = append(s.Alarms, a.Alarm.String())
		}
	}
	m, err := p.metrics(sctx)
	if err == nil {
		if v, ok := m["etcd_debugging_mvcc_total_put_size_in_bytes"]; ok {
			s.PutBytes = int64(v)
		}
		if v, ok := m["etcd_mvcc_put_total"]; ok {
			s.Puts = int64(v)
		}
	}
	return s
}

// metrics scrapes the unlabelled samples of /metrics.
func (p *EtcdProbe) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.endpoint+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("soak: %s/metrics: %s", p.endpoint, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.Contains(line, "{") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// KeyVersions is, for every live key under a prefix, its version (etcd
// counts the puts to a key since its creation) and its key+value size.
type KeyVersions map[string]KeyVersion

// KeyVersion is one key's entry in KeyVersions.
type KeyVersion struct {
	Version int64
	Size    int64
}

// PrefixVersions reads every key under prefix: the fallback measure of
// bytes written when the member's put counters cannot be read.
func (p *EtcdProbe) PrefixVersions(ctx context.Context, prefix string) (KeyVersions, error) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := p.cli.Get(sctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("soak: read %s: %w", prefix, err)
	}
	out := make(KeyVersions, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = KeyVersion{Version: kv.Version, Size: int64(len(kv.Key) + len(kv.Value))}
	}
	return out, nil
}

// PutsSince estimates the puts and bytes put between two readings: each
// key's version delta (its whole version if it is new) times its current
// key+value size. It is exact for values whose size did not change; a
// value that grew is counted at its current size, and keys deleted in
// between (and earlier lives of re-created keys) are not counted.
func (now KeyVersions) PutsSince(before KeyVersions) (puts, bytes int64) {
	for k, v := range now {
		d := v.Version - before[k].Version
		if d < 0 { // deleted and re-created: count this life only
			d = v.Version
		}
		puts += d
		bytes += d * v.Size
	}
	return puts, bytes
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
