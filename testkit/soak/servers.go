package soak

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Redis is a redis-server the harness started.
type Redis struct {
	*harness.RedisProc
}

// RedisAOFArgs make Redis persist as a production user runs it: an
// append-only file fsynced once a second (harness.RedisArgs' AOF fsyncs
// every write, which no Celery broker does), with Redis's default
// rewrite thresholds (auto-aof-rewrite-percentage 100, min-size 64mb).
var RedisAOFArgs = []string{"--appendonly", "yes", "--appendfsync", "everysec"}

// StartRedis starts redis-server on a free loopback port, without
// persistence (the runs measure the scheduler, not Redis's disk), or with
// an append-only file when aof is set (RedisAOFArgs).
func StartRedis(ps *Procs, dir string, aof bool) (*Redis, error) {
	p, err := harness.NewRedis(dir, false)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	if aof {
		p.Args = withRedisArgs(p.Args, RedisAOFArgs)
	}
	p.Procs = ps
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	return &Redis{RedisProc: p}, nil
}

// withRedisArgs replaces the directives of args that set names set (each
// a "--name value" pair) and appends set.
func withRedisArgs(args, set []string) []string {
	names := map[string]bool{}
	for i := 0; i+1 < len(set); i += 2 {
		names[set[i]] = true
	}
	var out []string
	for i := 0; i < len(args); i++ {
		if names[args[i]] && i+1 < len(args) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return append(out, set...)
}

// Client opens a client on database db.
func (r *Redis) Client(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr(), DB: db, ReadTimeout: 10 * time.Second, PoolSize: 4})
}

// Etcd is the external etcd of a run: one member of the etcd binary.
type Etcd struct {
	*harness.EtcdMember
	Endpoint string
}

// StartEtcd starts the etcd binary (Debian's etcd-server) as the external
// etcd of a run, on free loopback ports, with data under dir, and waits
// until it commits a write. It runs with etcd's default raft timings, as
// a production member does.
func StartEtcd(ps *Procs, dir string) (*Etcd, error) {
	c, err := harness.StartEtcdCluster(dir, 1, ps)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	m := c.Members[0]
	return &Etcd{EtcdMember: m, Endpoint: m.ClientURL()}, nil
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

// RedisInfo is what a sample keeps of the broker's INFO besides its
// memory: its persistence and its forks, which stall it.
type RedisInfo struct {
	OK bool `json:"ok"`
	// Commands is total_commands_processed (a script's calls included).
	Commands int64 `json:"total_commands_processed"`
	// AOFSize is aof_current_size (0 without an AOF).
	AOFSize int64 `json:"aof_current_size"`
	// AOFRewrites counts the rewrites done, AOFRewriting is set while one
	// runs; Forks is total_forks and LatestForkUs the last fork's stall.
	AOFRewrites  int64 `json:"aof_rewrites"`
	AOFRewriting bool  `json:"aof_rewrite_in_progress"`
	Forks        int64 `json:"total_forks"`
	LatestForkUs int64 `json:"latest_fork_usec"`
	// AOFDelayedFsync counts the times Redis wrote its AOF buffer while
	// an fsync was still pending for over 2 s (the disk was behind).
	AOFDelayedFsync int64 `json:"aof_delayed_fsync"`
	// AOFPendingFsync is aof_pending_bio_fsync: fsyncs queued at the sample.
	AOFPendingFsync int64 `json:"aof_pending_bio_fsync"`
}

// readRedisInfo reads INFO persistence and stats (OK false when Redis did
// not answer).
func readRedisInfo(ctx context.Context, rdb *redis.Client) RedisInfo {
	var ri RedisInfo
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "persistence", "stats").Result()
	if err != nil {
		return ri
	}
	ri.OK = true
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "total_commands_processed":
			ri.Commands = n
		case "aof_current_size":
			ri.AOFSize = n
		case "aof_rewrites":
			ri.AOFRewrites = n
		case "aof_rewrite_in_progress":
			ri.AOFRewriting = n != 0
		case "total_forks":
			ri.Forks = n
		case "latest_fork_usec":
			ri.LatestForkUs = n
		case "aof_delayed_fsync":
			ri.AOFDelayedFsync = n
		case "aof_pending_bio_fsync":
			ri.AOFPendingFsync = n
		}
	}
	return ri
}
