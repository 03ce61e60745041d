// Package embedetcd runs an etcd member inside the beatd process: a
// single node on loopback (no HA; for one machine and fast tests), or one
// member of a cluster that the beatd replicas form among themselves.
package embedetcd

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/internal/logbridge"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
)

// Config says where the member keeps its data and which loopback ports it
// binds. A zero port picks a free one.
type Config struct {
	Dir        string
	ClientPort int
	PeerPort   int
	Name       string
	// QuotaBackendBytes is the backend quota (default
	// DefaultQuotaBackendBytes). Past it etcd refuses writes until it is
	// compacted and defragmented; beatd keeps firing meanwhile.
	QuotaBackendBytes int64
	// MaxTxnOps is etcd's --max-txn-ops (0: etcd's default, 128).
	MaxTxnOps int
	// CompactionRetention is the periodic auto-compaction's retention
	// (default DefaultCompactionRetention).
	CompactionRetention string
	// Logger receives etcd's own log, errors only; nil: JSON on stderr.
	Logger *slog.Logger
	// DataDir is the data dir the operator gave (default Dir): the one
	// the ERROR line names when etcd stops on a storage failure.
	DataDir string
	// Exit ends the process after etcd's fatal error (default os.Exit;
	// tests replace it).
	Exit func(code int)

	// Cluster mode: with InitialCluster set ("name=peerURL,..." in etcd's
	// syntax), the member is one of several that form a cluster, and the
	// ports above are ignored (cluster.go).
	InitialCluster     string
	ClusterToken       string // initial-cluster-token; default DefaultClusterToken
	AdvertisePeerURL   string // default: this member's URL in InitialCluster
	AdvertiseClientURL string // required in cluster mode
	ListenPeerURL      string // default: see listenFor
	ListenClientURL    string // default: see listenFor
	PeerCertFile       string
	PeerKeyFile        string
	PeerTrustedCAFile  string
	PeerClientCertAuth bool
	PeerAutoTLS        bool
	// Client TLS (cluster mode, an https advertise client URL): the
	// member's certificate and key, served on the client port and
	// presented as the member's own client certificate (joining, moving
	// raft leadership), and the CA that signs the clients' certificates;
	// ClientCertAuth refuses a client without one.
	ClientCertFile      string
	ClientKeyFile       string
	ClientTrustedCAFile string
	ClientCertAuth      bool
	HeartbeatMs         uint // raft heartbeat interval; default etcd's 100
	ElectionMs          uint // raft election timeout; default etcd's 1000
	ClusterLog          *slog.Logger
	// Context ends a cluster member's wait for its peers (joining, or a
	// quorum to serve): a member may wait for them as long as they take.
	Context context.Context
}

// Defaults that keep the embedded etcd's disk and memory flat while beatd
// rewrites its state buckets every second.
const (
	// DefaultQuotaBackendBytes is etcd's own default, set explicitly so
	// that it is a decision, not an accident.
	DefaultQuotaBackendBytes = 2 << 30
	// DefaultCompactionRetention keeps a minute of history: beatd reads
	// only the newest revision, and a short history keeps the backend
	// small.
	DefaultCompactionRetention = "1m"
	// snapshotCount triggers a raft snapshot (and frees the raft log held
	// in memory) every this many entries. etcd's default of 10,000
	// entries of state writes holds hundreds of MB in memory at 20k fires
	// a second; a single member needs no long log for followers.
	snapshotCount = 500
	// snapshotCatchUpEntries are the entries kept after a snapshot for
	// slow followers; a single member has none.
	snapshotCatchUpEntries = 100
)

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	Endpoints []string
}

// singleTickMs is a single member's raft tick; etcd's default is 100.
const singleTickMs = 200

// Start launches the member and waits until it serves.
func Start(cfg Config) (*Server, error) {
	if cfg.Name == "" {
		cfg.Name = "beatd"
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.LogLevel = "error"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapLogger(&cfg, quietClose{logbridge.ZapCore(cfg.Logger, "etcd", zapcore.ErrorLevel)}))
	client := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(cfg.ClientPort)}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(cfg.PeerPort)}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	ec.ListenMetricsUrls = nil
	ec.QuotaBackendBytes = cmp.Or(cfg.QuotaBackendBytes, DefaultQuotaBackendBytes)
	if cfg.MaxTxnOps > 0 {
		ec.MaxTxnOps = uint(cfg.MaxTxnOps)
	}
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = cmp.Or(cfg.CompactionRetention, DefaultCompactionRetention)
	ec.SnapshotCount = snapshotCount
	ec.SnapshotCatchUpEntries = snapshotCatchUpEntries
	// Keep two WAL segments (64 MiB each) and snapshots, not etcd's five:
	// the data dir then stays flat at a few hundred MiB.
	ec.MaxWalFiles, ec.MaxSnapFiles = 2, 2
	// A single member has no peer to heartbeat, but each raft tick still
	// wakes its raft goroutines, and on a small VM the wake-ups were most
	// of an idle beatd's CPU. A 200 ms tick cut an idle beatd's CPU from
	// 11.4 to 8.4 ms a second (docs/performance.md, round 16). The
	// election timeout stays at etcd's 1 s: etcd raises every lease to at
	// least 1.5 election timeouts, so a longer one would stretch a 2 s
	// lease TTL. The cost is at start: the member elects itself ~0.3 s
	// later. Cluster mode keeps etcd's tick, or its flags' (applyCluster).
	ec.TickMs, ec.ElectionMs = singleTickMs, 1000
	if err := applyCluster(ec, &cfg); err != nil {
		return nil, err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, err)
	}
	if err := waitCluster(e, &cfg); err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedetcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedetcd: not ready after 60s")
	}
	eps := make([]string, 0, len(e.Clients))
	for _, l := range e.Clients {
		eps = append(eps, "http://"+l.Addr().String())
	}
	if cfg.clustered() {
		eps = memberClientURLs(e)
	}
	return &Server{etcd: e, Endpoints: eps}, nil
}

// ClientAddrs are the addresses the member's client listeners are bound
// to, as the kernel reports them: what a warning about who can reach
// the member must look at, not the URLs it advertises.
func (s *Server) ClientAddrs() []net.Addr {
	out := make([]net.Addr, 0, len(s.etcd.Clients))
	for _, l := range s.etcd.Clients {
		out = append(out, l.Addr())
	}
	return out
}

// ClientCertAuth reports whether the member refuses clients without a
// certificate of its client CA.
func (s *Server) ClientCertAuth() bool {
	cfg := s.etcd.Config()
	return cfg.ClientTLSInfo.ClientCertAuth
}

// Close stops the member; its data stays in Dir.
func (s *Server) Close() { s.etcd.Close() }

// CloseWithin stops the member for a process that is exiting: raft
// leadership first moves to a peer (a no-op unless this member leads),
// then the member closes, both within d. etcd's leadership transfer waits
// up to its request timeout (5 s plus two election timeouts) for a peer
// to take over, and its Close as long for the other replicas' watch
// streams on this member to end: a SIGTERM'd standby whose member led
// raft took 8-10 s when a peer was down. Past d the caller exits anyway,
// which costs nothing: every write this member acknowledged is in its
// fsync'd WAL, as after a crash, and the remaining members elect a raft
// leader within an election timeout. It returns the steps that had not
// finished by d, nil if the member closed.
func (s *Server) CloseWithin(d time.Duration) (unfinished []string) {
	var transferred atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		if srv := s.etcd.Server; srv != nil {
			_ = srv.TryTransferLeadershipOnShutdown()
		}
		transferred.Store(true)
		s.etcd.Close()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	if !transferred.Load() {
		unfinished = append(unfinished, "raft leadership transfer")
	}
	return append(unfinished, "member close")
}

// quietClose drops the errors etcd logs when its listeners close during a
// normal shutdown; everything else at error level passes.
type quietClose struct{ zapcore.Core }

func (q quietClose) With(f []zapcore.Field) zapcore.Core { return quietClose{q.Core.With(f)} }

func (q quietClose) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !q.Enabled(e.Level) {
		return ce
	}
	return ce.AddCore(e, q)
}

func (q quietClose) Write(e zapcore.Entry, fields []zapcore.Field) error {
	for _, f := range fields {
		if f.Type == zapcore.ErrorType {
			if err, ok := f.Interface.(error); ok && isClosedErr(err) {
				return nil
			}
		}
	}
	return q.Core.Write(e, fields)
}

func isClosedErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "use of closed network connection") ||
		strings.Contains(s, "Server closed") || strings.Contains(s, "server closed")
}
