// Package embedetcd runs an etcd member inside the beatd process: a
// single node on loopback (no HA; for one machine and fast tests), or one
// member of a cluster that the beatd replicas form among themselves.
package embedetcd

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config says where the member keeps its data and which loopback ports it
// binds. A zero port picks a free one.
type Config struct {
	Dir        string
	ClientPort int
	PeerPort   int
	Name       string

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
	HeartbeatMs        uint // raft heartbeat interval; default etcd's 100
	ElectionMs         uint // raft election timeout; default etcd's 1000
	ClusterLog         *slog.Logger
	// Context ends a cluster member's wait for its peers (joining, or a
	// quorum to serve): a member may wait for them as long as they take.
	Context context.Context
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	Endpoints []string
}

// Start launches the member and waits until it serves.
func Start(cfg Config) (*Server, error) {
	if cfg.Name == "" {
		cfg.Name = "beatd"
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.LogLevel = "error"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(quietClose{zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.ErrorLevel)}))
	client := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(cfg.ClientPort)}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(cfg.PeerPort)}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	ec.ListenMetricsUrls = nil
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

// Close stops the member; its data stays in Dir.
func (s *Server) Close() { s.etcd.Close() }

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
