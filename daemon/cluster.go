package daemon

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/internal/tlsfiles"
)

// clusterFlags configure the embedded etcd as one member of a cluster that
// the beatd replicas form among themselves, in etcd's own vocabulary.
type clusterFlags struct {
	InitialCluster     string
	Token              string
	Name               string
	AdvertisePeerURL   string
	AdvertiseClientURL string
	ListenPeerURL      string
	ListenClientURL    string
	PeerCertFile       string
	PeerKeyFile        string
	PeerTrustedCAFile  string
	PeerClientCertAuth bool
	PeerAutoTLS        bool
	// The member's client TLS (an https advertise client URL), and
	// whether its clients must present a certificate of ClientCAFile.
	ClientCertFile string
	ClientKeyFile  string
	ClientCAFile   string
	ClientCertAuth bool
	// InsecureOK states that a member listening beyond loopback without
	// client certificate auth is meant (it silences the warning).
	InsecureOK     bool
	HeartbeatMs    uint
	ElectionMs     uint
	MoveRaftLeader bool
}

func (c *clusterFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.InitialCluster, "etcd-initial-cluster", "", "embedded cluster mode: the bootstrap members, name=peerURL,... (e.g. beatd-0=http://beatd-0.beatd:2380,...); without --etcd-endpoints each replica runs one member")
	fs.StringVar(&c.Token, "etcd-initial-cluster-token", embedetcd.DefaultClusterToken, "embedded cluster mode: the cluster's bootstrap token")
	fs.StringVar(&c.Name, "etcd-name", "", "embedded cluster mode: this member's name in --etcd-initial-cluster (default --id)")
	fs.StringVar(&c.AdvertisePeerURL, "etcd-advertise-peer-url", "", "embedded cluster mode: the URL peers reach this member at (default: its URL in --etcd-initial-cluster)")
	fs.StringVar(&c.AdvertiseClientURL, "etcd-advertise-client-url", "", "embedded cluster mode: the URL clients reach this member at (required)")
	fs.StringVar(&c.ListenPeerURL, "etcd-listen-peer-url", "", "embedded cluster mode: the peer listen URL (default: the advertised scheme and port on 0.0.0.0)")
	fs.StringVar(&c.ListenClientURL, "etcd-listen-client-url", "", "embedded cluster mode: the client listen URL (default: the advertised port on 0.0.0.0)")
	fs.StringVar(&c.PeerCertFile, "etcd-peer-cert-file", "", "embedded cluster mode: peer TLS certificate (https peer URLs)")
	fs.StringVar(&c.PeerKeyFile, "etcd-peer-key-file", "", "embedded cluster mode: peer TLS key")
	fs.StringVar(&c.PeerTrustedCAFile, "etcd-peer-trusted-ca-file", "", "embedded cluster mode: CA that signs the peers' certificates")
	fs.BoolVar(&c.PeerClientCertAuth, "etcd-peer-client-cert-auth", false, "embedded cluster mode: require peers to present a certificate signed by the trusted CA")
	fs.BoolVar(&c.PeerAutoTLS, "etcd-peer-auto-tls", false, "embedded cluster mode: encrypt peer traffic with self-signed certificates (no peer authentication)")
	fs.StringVar(&c.ClientCertFile, "etcd-client-cert-file", "", "embedded cluster mode: the member's TLS certificate for its client port (an https --etcd-advertise-client-url); this replica presents it as its own etcd client certificate too unless --etcd-cert is given")
	fs.StringVar(&c.ClientKeyFile, "etcd-client-key-file", "", "embedded cluster mode: the key of --etcd-client-cert-file")
	fs.StringVar(&c.ClientCAFile, "etcd-client-trusted-ca-file", "", "embedded cluster mode: the CA that signs the clients' certificates (and the members', for this replica's own client unless --etcd-cacert is given)")
	fs.BoolVar(&c.ClientCertAuth, "etcd-client-cert-auth", false, "embedded cluster mode: refuse etcd clients (other replicas, the CLI) without a certificate signed by --etcd-client-trusted-ca-file")
	fs.BoolVar(&c.InsecureOK, "etcd-insecure-ok", false, "embedded etcd: a client port without --etcd-client-cert-auth (beyond loopback, or the single node's on loopback) is intended; silences the warning (the metric beatd_etcd_client_unauthenticated stays 1 beyond loopback)")
	fs.UintVar(&c.HeartbeatMs, "etcd-heartbeat-interval", 100, "embedded etcd: raft heartbeat interval in milliseconds")
	fs.UintVar(&c.ElectionMs, "etcd-election-timeout", 1000, "embedded etcd: raft election timeout in milliseconds")
	fs.BoolVar(&c.MoveRaftLeader, "etcd-move-raft-leader", true, "embedded cluster mode: the beatd leader moves raft leadership off its own member, so a kill -9 of it fails over within the lease TTL")
}

// embedConfig is the embedded etcd's configuration: a loopback single node,
// or with --etcd-initial-cluster one member of the replicas' cluster, whose
// wait for its peers ends with ctx (a signal).
func (m *Main) embedConfig(ctx context.Context) embedetcd.Config {
	c := m.Cluster
	name := "beatd"
	if c.InitialCluster != "" {
		name = c.Name
		if name == "" {
			name = m.ID
		}
	}
	return embedetcd.Config{Dir: filepath.Join(m.DataDir, "etcd"), DataDir: m.DataDir, ClientPort: m.EtcdClientPort, PeerPort: m.EtcdPeerPort, Name: name,
		InitialCluster: c.InitialCluster, ClusterToken: c.Token, AdvertisePeerURL: c.AdvertisePeerURL,
		AdvertiseClientURL: c.AdvertiseClientURL, ListenPeerURL: c.ListenPeerURL, ListenClientURL: c.ListenClientURL,
		PeerCertFile: c.PeerCertFile, PeerKeyFile: c.PeerKeyFile, PeerTrustedCAFile: c.PeerTrustedCAFile,
		PeerClientCertAuth: c.PeerClientCertAuth, PeerAutoTLS: c.PeerAutoTLS,
		ClientCertFile: c.ClientCertFile, ClientKeyFile: c.ClientKeyFile, ClientTrustedCAFile: c.ClientCAFile, ClientCertAuth: c.ClientCertAuth,
		HeartbeatMs: c.HeartbeatMs, ElectionMs: c.ElectionMs, ClusterLog: m.log, Context: ctx}
}

// logEmbedded says which embedded mode starts.
func (m *Main) logEmbedded() {
	if m.Cluster.InitialCluster != "" {
		cfg := m.embedConfig(context.Background())
		m.log.Info("starting an embedded etcd member of the replicas' cluster", "member", cfg.Name,
			"initial_cluster", cfg.InitialCluster, "data_dir", m.DataDir)
		return
	}
	m.log.Warn("no --etcd-endpoints: starting an embedded single-node etcd; this mode has NO high availability",
		"data_dir", m.DataDir, "client_port", m.EtcdClientPort)
}

// dataDirFailed logs, as the one ERROR line naming the data dir and the
// cause, a start-up failure of the embedded etcd's storage (a data dir
// that is a file, read-only, full); other errors are left to the
// caller. A failure while running is said by embedetcd's stop hook.
func (m *Main) dataDirFailed(err error) {
	cause, path := embedetcd.StorageCause(err)
	// The file that failed is in the data dir, or is the data dir or one
	// of its parents (a file where a directory must be).
	if cause == "" || path != "" && !embedetcd.Within(path, m.DataDir) && !embedetcd.Within(m.DataDir, path) {
		return
	}
	m.log.Error("the data dir is not usable: beatd stops", "data_dir", m.DataDir, "cause", cause, "path", path, "err", err.Error())
}

// avoidRaftLeader keeps raft leadership off this replica's embedded member
// during a term (see embedetcd.Server.AvoidRaftLeadership). The returned
// func stops it and waits.
func (m *Main) avoidRaftLeader(ctx context.Context) (stop func()) {
	if m.embedded == nil || m.Cluster.InitialCluster == "" || !m.Cluster.MoveRaftLeader {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.embedded.AvoidRaftLeadership(ctx, m.log.With("component", "embedetcd"))
	}()
	return func() { cancel(); wg.Wait() }
}

// checkClusterFlags rejects cluster flags that cannot work together and
// prepares the etcd client for a member cluster.
func (m *Main) checkClusterFlags() error {
	c := m.Cluster
	if c.InitialCluster == "" {
		return nil
	}
	if len(m.Etcd.EndpointURLs()) > 0 {
		return fmt.Errorf("--etcd-initial-cluster starts an embedded member; it cannot be combined with --etcd-endpoints")
	}
	if c.AdvertiseClientURL == "" {
		return fmt.Errorf("--etcd-initial-cluster needs --etcd-advertise-client-url (the URL the other replicas reach this member's clients port at)")
	}
	// Every certificate, key and CA is checked now: a bad one is one
	// error naming its file, not a member that never joins.
	now := m.clock.Now()
	for _, f := range [][3]string{
		{c.ClientCertFile, c.ClientKeyFile, c.ClientCAFile},
		{c.PeerCertFile, c.PeerKeyFile, c.PeerTrustedCAFile},
	} {
		if err := tlsfiles.Check(f[0], f[1], f[2], now); err != nil {
			return fmt.Errorf("embedded etcd TLS: %w", err)
		}
	}
	// The replica is a client of its own cluster: with client TLS it
	// presents the member's certificate and trusts the cluster's CA,
	// unless told otherwise.
	if c.ClientCertFile != "" {
		if m.Etcd.Cert == "" && m.Etcd.Key == "" {
			m.Etcd.Cert, m.Etcd.Key = c.ClientCertFile, c.ClientKeyFile
		}
		if m.Etcd.CACert == "" {
			m.Etcd.CACert = c.ClientCAFile
		}
	}
	// The client starts with every member's client URL and follows the
	// member list as replicas are added and removed.
	m.Etcd.AutoSync = 10 * time.Second
	return nil
}

// clientUnauthenticated says who can use the embedded member's client
// port without authenticating, from the addresses its listeners are
// bound to (what etcd bound, not a URL it advertises): "" when nobody
// can (client certificate auth, or no embedded member); otherwise why,
// and whether that reaches beyond this machine (a listener on a
// non-loopback or unspecified address).
func clientUnauthenticated(addrs []net.Addr, certAuth bool) (why string, beyondLoopback bool) {
	if certAuth || len(addrs) == 0 {
		return "", false
	}
	var open, local []string
	for _, a := range addrs {
		switch a := a.(type) {
		case *net.TCPAddr:
			if a.IP.IsLoopback() {
				local = append(local, a.String())
				continue
			}
		case *net.UnixAddr:
			local = append(local, a.String())
			continue
		}
		open = append(open, a.String())
	}
	if len(open) > 0 {
		return "the embedded etcd member's client port listens on " + strings.Join(open, ", ") + " without client certificate auth: " +
			"whoever reaches it can rewrite the schedule, and so which tasks every worker runs. " +
			"Set --etcd-client-cert-auth with --etcd-client-cert-file, --etcd-client-key-file and --etcd-client-trusted-ca-file " +
			"(beatd certs init makes them), or --etcd-insecure-ok to state that this is intended", true
	}
	return "the embedded etcd's client port " + strings.Join(local, ", ") + " has no authentication: any local user on this machine " +
		"can connect to it and add, change, trigger or pause entries, which the leader fires, with no audit record. " +
		"Where other users share the machine, run the embedded etcd with client certificate auth " +
		"(a one-member cluster: see Securing the quickstart in docs/operations.md), or use an external etcd with auth; " +
		"--etcd-insecure-ok states that this is intended", false
}

// watchUnauthenticated exports beatd_etcd_client_unauthenticated and
// runs warnUnauthenticated until ctx ends (a replica's, or a parked one's:
// its member serves clients all the same).
func (m *Main) watchUnauthenticated(ctx context.Context) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_etcd_client_unauthenticated",
		Help: "1 while this replica's embedded etcd member serves clients beyond loopback without client certificate auth."})
	m.registry.MustRegister(g)
	m.wg.Go(func() { m.warnUnauthenticated(ctx, g) })
}

// warnUnauthenticated says who can use the embedded member's client port
// without authenticating: beyond loopback, once a minute until ctx ends,
// with the gauge at 1; on loopback only, once at start (any local user
// can). External etcd's access is its own operator's to set.
func (m *Main) warnUnauthenticated(ctx context.Context, g prometheus.Gauge) {
	var addrs []net.Addr
	var certAuth bool
	if m.embedded != nil {
		addrs, certAuth = m.embedded.ClientAddrs(), m.embedded.ClientCertAuth()
	}
	m.warnClients(ctx, g, addrs, certAuth)
}

// warnClients is warnUnauthenticated for the given listeners.
func (m *Main) warnClients(ctx context.Context, g prometheus.Gauge, addrs []net.Addr, certAuth bool) {
	why, beyond := clientUnauthenticated(addrs, certAuth)
	g.Set(0)
	if beyond {
		g.Set(1)
	}
	switch {
	case why == "":
		return
	case m.Cluster.InsecureOK:
		m.log.Info("embedded etcd client port without client certificate auth, as --etcd-insecure-ok states", "listen", addrStrings(addrs))
		return
	case !beyond:
		m.log.Warn(why)
		return
	}
	t := m.clock.NewTicker(time.Minute)
	defer t.Stop()
	for {
		m.log.Warn(why)
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

func addrStrings(addrs []net.Addr) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
