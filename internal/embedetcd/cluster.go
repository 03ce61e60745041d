package embedetcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/tlsfiles"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"
)

// DefaultClusterToken is the initial-cluster-token of beatd's member
// clusters unless configured: a bootstrapping member only joins peers that
// use the same token.
const DefaultClusterToken = "beatd"

// clustered reports whether cfg asks for a member of a multi-member cluster.
func (cfg *Config) clustered() bool { return cfg.InitialCluster != "" }

// peer is one entry of --etcd-initial-cluster.
type peer struct {
	name string
	urls types.URLs
}

// parseInitialCluster parses "name=url,name=url" (a name may repeat, once
// per peer URL, as in etcd).
func parseInitialCluster(s string) ([]peer, error) {
	m, err := types.NewURLsMap(s)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: initial cluster %q: %w", s, err)
	}
	var out []peer
	for name, urls := range m {
		if name == "" {
			return nil, fmt.Errorf("embedetcd: initial cluster %q: a member without a name", s)
		}
		out = append(out, peer{name: name, urls: urls})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func parseURL(what, s string) (url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return url.URL{}, fmt.Errorf("embedetcd: %s %q is not an http(s)://host:port URL", what, s)
	}
	return *u, nil
}

// listenFor turns an advertised URL into the default listen URL: the same
// scheme and port on every interface, since the advertised host is usually
// a name (a pod's DNS name, maybe not resolvable yet). If the host is, or
// resolves only to, loopback addresses (several members on one machine,
// each with its own 127.0.0.x), the member binds that address alone, so
// its neighbours can use the same port.
func listenFor(adv url.URL) url.URL {
	l := adv
	l.Host = "0.0.0.0:" + adv.Port()
	host := adv.Hostname()
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil || len(addrs) == 0 {
			return l
		}
		ips = ips[:0]
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return l
		}
	}
	l.Host = net.JoinHostPort(ips[0].String(), adv.Port())
	return l
}

// applyCluster configures ec for a member of a multi-member cluster: its
// URLs, peer TLS, raft timing and, for a member without data, whether it
// bootstraps with its peers or joins the running cluster.
func applyCluster(ec *embed.Config, cfg *Config) error {
	if !cfg.clustered() {
		return nil
	}
	log := cfg.ClusterLog
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	peers, err := parseInitialCluster(cfg.InitialCluster)
	if err != nil {
		return err
	}
	var self *peer
	for i := range peers {
		if peers[i].name == cfg.Name {
			self = &peers[i]
		}
	}
	var advPeer url.URL
	switch {
	case cfg.AdvertisePeerURL != "":
		if advPeer, err = parseURL("advertise peer URL", cfg.AdvertisePeerURL); err != nil {
			return err
		}
		if self != nil && (len(self.urls) != 1 || self.urls[0].String() != advPeer.String()) {
			return fmt.Errorf("embedetcd: --etcd-initial-cluster lists %s=%s, but its advertise peer URL is %s", cfg.Name, self.urls, advPeer.String())
		}
	case self != nil && len(self.urls) == 1:
		advPeer = self.urls[0]
	default:
		return fmt.Errorf("embedetcd: member %q is not in the initial cluster %q: give its advertise peer URL", cfg.Name, cfg.InitialCluster)
	}
	if cfg.AdvertiseClientURL == "" {
		return errors.New("embedetcd: a cluster member needs an advertise client URL")
	}
	advClient, err := parseURL("advertise client URL", cfg.AdvertiseClientURL)
	if err != nil {
		return err
	}
	lPeer, lClient := listenFor(advPeer), listenFor(advClient)
	if cfg.ListenPeerURL != "" {
		if lPeer, err = parseURL("listen peer URL", cfg.ListenPeerURL); err != nil {
			return err
		}
	}
	if cfg.ListenClientURL != "" {
		if lClient, err = parseURL("listen client URL", cfg.ListenClientURL); err != nil {
			return err
		}
	}
	clientTLS := cfg.ClientCertFile != "" || cfg.ClientKeyFile != ""
	switch {
	case advClient.Scheme == "https" && !clientTLS:
		return errors.New("embedetcd: an https client URL needs the member's client certificate and key (--etcd-client-cert-file, --etcd-client-key-file)")
	case advClient.Scheme != "https" && clientTLS:
		return errors.New("embedetcd: client TLS is configured, so the advertise client URL must be https")
	case advClient.Scheme != "http" && advClient.Scheme != "https":
		return fmt.Errorf("embedetcd: the member's client URL must be http or https, not %s", advClient.Scheme)
	case cfg.ClientCertAuth && !clientTLS:
		return errors.New("embedetcd: client certificate auth needs client TLS (--etcd-client-cert-file, --etcd-client-key-file, --etcd-client-trusted-ca-file)")
	case cfg.ClientCertAuth && cfg.ClientTrustedCAFile == "":
		return errors.New("embedetcd: client certificate auth needs the CA that signs the clients' certificates (--etcd-client-trusted-ca-file)")
	}
	if clientTLS {
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: cfg.ClientCertFile, KeyFile: cfg.ClientKeyFile,
			TrustedCAFile: cfg.ClientTrustedCAFile, ClientCertAuth: cfg.ClientCertAuth}
	}
	https := advPeer.Scheme == "https"
	tlsFiles := cfg.PeerCertFile != "" || cfg.PeerKeyFile != ""
	switch {
	case https && !tlsFiles && !cfg.PeerAutoTLS:
		return errors.New("embedetcd: an https peer URL needs peer certificate files or peer auto TLS")
	case !https && (tlsFiles || cfg.PeerAutoTLS):
		return errors.New("embedetcd: peer TLS is configured, so the peer URLs must be https")
	case tlsFiles && cfg.PeerAutoTLS:
		return errors.New("embedetcd: give peer certificate files or peer auto TLS, not both")
	}
	if tlsFiles && cfg.PeerTrustedCAFile != "" {
		if err := signedBy(cfg.PeerCertFile, cfg.PeerTrustedCAFile); err != nil {
			return fmt.Errorf("embedetcd: the peer certificate %s is not signed by the peer CA %s, so no member that trusts that CA accepts it (give every member a certificate of the one CA): %w",
				cfg.PeerCertFile, cfg.PeerTrustedCAFile, err)
		}
	}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{lPeer}, []url.URL{advPeer}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{lClient}, []url.URL{advClient}
	ec.InitialClusterToken = cfg.ClusterToken
	if ec.InitialClusterToken == "" {
		ec.InitialClusterToken = DefaultClusterToken
	}
	ec.PeerAutoTLS = cfg.PeerAutoTLS
	ec.PeerTLSInfo = transport.TLSInfo{CertFile: cfg.PeerCertFile, KeyFile: cfg.PeerKeyFile,
		TrustedCAFile: cfg.PeerTrustedCAFile, ClientCertAuth: cfg.PeerClientCertAuth}
	if cfg.HeartbeatMs > 0 {
		ec.TickMs = cfg.HeartbeatMs
	}
	if cfg.ElectionMs > 0 {
		ec.ElectionMs = cfg.ElectionMs
	}
	ec.InitialCluster, ec.ClusterState = cfg.InitialCluster, embed.ClusterStateFlagNew
	if self == nil {
		// A member outside the bootstrap list can only join.
		ec.InitialCluster += "," + cfg.Name + "=" + advPeer.String()
	}
	j := &joiner{cfg: cfg, log: log, peers: peers, self: advPeer, token: ec.InitialClusterToken, http: peerHTTP(cfg)}
	if hasData(cfg.Dir) {
		if !j.removed() {
			// etcd restarts from its WAL and ignores the bootstrap settings.
			log.Info("etcd member restarting from its data", "member", cfg.Name, "dir", cfg.Dir)
			return nil
		}
		// Its member was removed (scaled down, then up again on the same
		// volume): etcd would refuse to start. Keep the old data aside and
		// join afresh.
		aside := cfg.Dir + ".removed-" + time.Now().UTC().Format("20060102T150405Z")
		if err := os.Rename(cfg.Dir, aside); err != nil {
			return fmt.Errorf("embedetcd: move the removed member's data aside: %w", err)
		}
		log.Warn("etcd member was removed from its cluster: its old data is moved aside and it joins afresh", "member", cfg.Name, "aside", aside)
	}
	state, initial, err := j.decide()
	if err != nil {
		return err
	}
	ec.ClusterState = state
	if initial != "" {
		ec.InitialCluster = initial
	}
	return nil
}

func (cfg *Config) ctx() context.Context {
	if cfg.Context != nil {
		return cfg.Context
	}
	return context.Background()
}

// waitCluster waits, for a cluster member, until it serves (its cluster has
// a quorum) or cfg.Context ends. Members start one by one and a quorum can
// be minutes away, so it does not give up by itself; it logs while it waits.
func waitCluster(e *embed.Etcd, cfg *Config) error {
	if !cfg.clustered() {
		return nil
	}
	log := cfg.ClusterLog
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	tick := time.NewTicker(waitTick)
	defer tick.Stop()
	for {
		select {
		case <-e.Server.ReadyNotify():
			return nil
		case err := <-e.Err():
			e.Close()
			return fmt.Errorf("embedetcd: %w", err)
		case <-cfg.ctx().Done():
			// Not e.Close(): before the member is ready it waits for client
			// servers that only start once ready. Stop raft and the WAL; the
			// process is on its way out.
			e.Server.HardStop()
			return fmt.Errorf("embedetcd: waiting for a quorum of members: %w", cfg.ctx().Err())
		case <-tick.C:
			args := []any{"member", cfg.Name, "waited", time.Since(start).Round(time.Second).String()}
			if problems := peerTLSProblems(cfg); len(problems) > 0 {
				// A member of another CA (its own or the others') never
				// joins: say so, not only that it waits.
				log.Error("etcd member waits for a quorum: peers refuse its TLS, or it refuses theirs (a certificate of another CA?)",
					append(args, "peers", problems)...)
				continue
			}
			log.Warn("etcd member waits for a quorum of its cluster's members", args...)
		}
	}
}

// waitTick is how often a member that waits for its quorum says so.
var waitTick = 10 * time.Second

// signedBy checks that the first certificate of certFile verifies
// against the CAs of caFile (for a peer: client and server use).
func signedBy(certFile, caFile string) error {
	pool, err := tlsfiles.Pool(caFile)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return fmt.Errorf("%s: no PEM certificate in it", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", certFile, err)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// peerTLSProblems asks every other member of the initial cluster for its
// member list over the peer TLS settings, and returns the TLS failures:
// the refusals that keep a member of another CA out of the cluster.
func peerTLSProblems(cfg *Config) []string {
	if cfg.PeerCertFile == "" {
		return nil
	}
	peers, err := parseInitialCluster(cfg.InitialCluster)
	if err != nil {
		return nil
	}
	hc := peerHTTP(cfg)
	var out []string
	for _, p := range peers {
		if p.name == cfg.Name {
			continue
		}
		for _, u := range p.urls {
			resp, err := hc.Get(u.String() + "/members")
			if err == nil {
				resp.Body.Close()
				continue
			}
			var uerr x509.UnknownAuthorityError
			if errors.As(err, &uerr) || strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "x509:") {
				out = append(out, p.name+" ("+u.String()+"): "+err.Error())
			}
		}
	}
	return out
}

// hasData reports whether dir holds a member's WAL.
func hasData(dir string) bool {
	ents, err := os.ReadDir(filepath.Join(dir, "member", "wal"))
	return err == nil && len(ents) > 0
}

// peerHTTP is an HTTP client for the peers' /members endpoint, with the
// peer TLS settings.
func peerHTTP(cfg *Config) *http.Client {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case cfg.PeerAutoTLS:
		// Auto TLS certificates are self-signed: etcd's own peers do not
		// verify them either.
		tc.InsecureSkipVerify = true //nolint:gosec // etcd peer auto TLS
	case cfg.PeerCertFile != "":
		info := transport.TLSInfo{CertFile: cfg.PeerCertFile, KeyFile: cfg.PeerKeyFile, TrustedCAFile: cfg.PeerTrustedCAFile}
		if c, err := info.ClientConfig(); err == nil {
			tc = c
		}
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
}

// joiner decides how a member without data starts.
type joiner struct {
	cfg   *Config
	log   *slog.Logger
	peers []peer
	self  url.URL
	token string
	http  *http.Client
}

// probeWindow is how long a member without data looks for a running peer
// before it bootstraps: long enough for the peers of a fresh cluster,
// started together, to open their peer ports.
const probeWindow = 3 * time.Second

// decide returns the cluster state ("new" or "existing") and, for
// "existing", the initial-cluster string that lists the running members.
//
//   - No peer answers: a fresh cluster; bootstrap with the others ("new").
//   - A peer lists this member as one of the bootstrap members that never
//     started: bootstrap late with the same list ("new"): the cluster it
//     joins was built from it.
//   - A peer lists this member as started before: its volume was lost.
//     Remove the old member through the others, add this one, "existing".
//   - A peer lists it as added but never started: "existing".
//   - A peer does not list it: add it (scaling up), "existing".
func (j *joiner) decide() (string, string, error) {
	members, from := j.probe()
	if members == nil && !j.bootstrapMember() {
		if problems := peerTLSProblems(j.cfg); len(problems) > 0 {
			return "", "", fmt.Errorf("embedetcd: member %q cannot join: the members refuse its peer TLS, or it refuses theirs (a certificate of another CA?): %s",
				j.cfg.Name, strings.Join(problems, "; "))
		}
		return "", "", fmt.Errorf("embedetcd: member %q is not in --etcd-initial-cluster and no member there answers: nothing to join", j.cfg.Name)
	}
	if members == nil {
		j.log.Info("etcd member has no data and no peer answers: bootstrapping a new cluster", "member", j.cfg.Name, "initial_cluster", j.cfg.InitialCluster)
		return embed.ClusterStateFlagNew, "", nil
	}
	var mine *membership.Member
	for _, m := range members {
		if m.Name == j.cfg.Name || slices.Contains(m.PeerURLs, j.self.String()) {
			mine = m
		}
	}
	if mine != nil && len(mine.ClientURLs) == 0 {
		boot := membership.NewMember(j.cfg.Name, types.URLs{j.self}, j.token, nil)
		if boot.ID == mine.ID {
			j.log.Info("etcd member joins the cluster it was bootstrapped with", "member", j.cfg.Name, "member_id", mine.ID.String(), "peer", from)
			return embed.ClusterStateFlagNew, "", nil
		}
		j.log.Info("etcd member was added and never started: joining", "member", j.cfg.Name, "member_id", mine.ID.String(), "peer", from)
		return embed.ClusterStateFlagExisting, initialFrom(members, mine.ID, j.cfg.Name), nil
	}
	ctx := j.cfg.ctx()
	var clientURLs []string
	for _, m := range members {
		if mine == nil || m.ID != mine.ID {
			clientURLs = append(clientURLs, m.ClientURLs...)
		}
	}
	if len(clientURLs) == 0 {
		return "", "", fmt.Errorf("embedetcd: peer %s lists no started member to join through", from)
	}
	tc, err := j.cfg.clientTLS()
	if err != nil {
		return "", "", err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: clientURLs, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: tc})
	if err != nil {
		return "", "", fmt.Errorf("embedetcd: join: %w", err)
	}
	defer cli.Close()
	if mine != nil {
		j.log.Warn("etcd member has lost its data: removing its old member id and rejoining", "member", j.cfg.Name, "old_id", mine.ID.String())
		if err := retry(ctx, j.log, "remove", func(ctx context.Context) error {
			_, err := cli.MemberRemove(ctx, uint64(mine.ID))
			if err != nil && strings.Contains(err.Error(), "member not found") {
				return nil
			}
			return err
		}); err != nil {
			return "", "", fmt.Errorf("embedetcd: remove old member %s: %w", mine.ID, err)
		}
	} else {
		j.log.Info("etcd member is not in the cluster: adding it", "member", j.cfg.Name, "peer_url", j.self.String())
	}
	var resp *clientv3.MemberAddResponse
	if err := retry(ctx, j.log, "add", func(ctx context.Context) error {
		var err error
		resp, err = cli.MemberAdd(ctx, []string{j.self.String()})
		return err
	}); err != nil {
		return "", "", fmt.Errorf("embedetcd: add member %s: %w", j.cfg.Name, err)
	}
	var now []*membership.Member
	for _, m := range resp.Members {
		mm := &membership.Member{ID: types.ID(m.ID)}
		mm.Name, mm.PeerURLs = m.Name, m.PeerURLs
		now = append(now, mm)
	}
	j.log.Info("etcd member added: joining the running cluster", "member", j.cfg.Name, "member_id", types.ID(resp.Member.ID).String())
	return embed.ClusterStateFlagExisting, initialFrom(now, types.ID(resp.Member.ID), j.cfg.Name), nil
}

func (j *joiner) bootstrapMember() bool {
	for _, p := range j.peers {
		if p.name == j.cfg.Name {
			return true
		}
	}
	return false
}

// initialFrom renders a member list as an initial-cluster string, naming
// self as name and other nameless (never started) members by their id.
func initialFrom(members []*membership.Member, self types.ID, name string) string {
	var parts []string
	for _, m := range members {
		n := m.Name
		if m.ID == self {
			n = name
		} else if n == "" {
			n = m.ID.String()
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// retry calls f until it succeeds or ctx ends: membership changes need a
// quorum, which may be a while away (the other members restarting).
func retry(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	for {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		log.Warn("etcd membership change failed; retrying", "op", what, "err", err, "took", time.Since(start).String())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// removed reports whether every peer that answers (at least one) lists
// neither this member's name nor its peer URL: the member was removed, and
// its data can never start again.
func (j *joiner) removed() bool {
	answered := false
	for _, p := range j.peers {
		if p.name == j.cfg.Name {
			continue
		}
		for _, u := range p.urls {
			ms, err := j.members(u.String())
			if err != nil {
				continue
			}
			answered = true
			for _, m := range ms {
				if m.Name == j.cfg.Name || slices.Contains(m.PeerURLs, j.self.String()) {
					return false
				}
			}
		}
	}
	return answered
}

// probe asks the other bootstrap peers for the member list, for up to
// probeWindow, and returns the first answer and who gave it.
func (j *joiner) probe() ([]*membership.Member, string) {
	var urls []string
	for _, p := range j.peers {
		if p.name == j.cfg.Name {
			continue
		}
		for _, u := range p.urls {
			urls = append(urls, u.String())
		}
	}
	deadline := time.Now().Add(probeWindow)
	for {
		for _, u := range urls {
			if ms, err := j.members(u); err == nil {
				return ms, u
			}
		}
		if time.Now().After(deadline) {
			return nil, ""
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// members reads a peer's member list from its peer port (served without a
// quorum, from the member's own view).
func (j *joiner) members(peerURL string) ([]*membership.Member, error) {
	resp, err := j.http.Get(strings.TrimSuffix(peerURL, "/") + "/members")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/members: %s", peerURL, resp.Status)
	}
	var ms []*membership.Member
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
		return nil, fmt.Errorf("%s/members: %w", peerURL, err)
	}
	return ms, nil
}

// transferee picks the member to hand raft leadership to: the first other
// voting member whose peer port answers now. (etcd's own choice, the
// longest-connected peer, can be a process that was just frozen: its
// connections stay open, so it still looks connected.)
func (s *Server) transferee(ctx context.Context, pc *http.Client) (uint64, error) {
	self := s.etcd.Server.MemberID()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var peers []*membership.Member
	for _, m := range s.etcd.Server.Cluster().Members() {
		if m.ID != self && !m.IsLearner && len(m.PeerURLs) > 0 {
			peers = append(peers, m)
		}
	}
	answered := make(chan uint64, len(peers))
	for _, m := range peers {
		go func(id uint64, u string) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(u, "/")+"/members", nil)
			if err == nil {
				var resp *http.Response
				if resp, err = pc.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						answered <- id
						return
					}
				}
			}
			answered <- 0
		}(uint64(m.ID), m.PeerURLs[0])
	}
	for range peers {
		if id := <-answered; id != 0 {
			return id, nil
		}
	}
	return 0, errors.New("no other member answers on its peer port")
}

// memberClientURLs is every member's advertised client URLs, as this
// member sees the cluster.
func memberClientURLs(e *embed.Etcd) []string {
	var out []string
	for _, m := range e.Server.Cluster().Members() {
		out = append(out, m.ClientURLs...)
	}
	sort.Strings(out)
	return out
}

// ClientURLs is every member's advertised client URLs, as this member sees
// the cluster now.
func (s *Server) ClientURLs() []string { return memberClientURLs(s.etcd) }

// IsRaftLeader reports whether this member leads the raft group.
func (s *Server) IsRaftLeader() bool {
	return s.etcd.Server.Leader() == s.etcd.Server.MemberID()
}

// AvoidRaftLeadership keeps raft leadership off this member until ctx
// ends, moving it to the longest-connected peer whenever this member
// gains it.
//
// Why: a new raft leader renews every lease to its full TTL (plus an
// election timeout). If the beatd leader's process also hosts the raft
// leader, a kill -9 of it costs a raft election plus a whole TTL before a
// standby can lead. With raft leadership elsewhere, the dead leader's lease
// simply runs out. The transfer itself is cheap: the leader hands over to
// an up-to-date follower without an election.
func (s *Server) AvoidRaftLeadership(ctx context.Context, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := s.etcd.Server
	if len(srv.Cluster().Members()) < 2 {
		return
	}
	ec := s.etcd.Config()
	pc := peerHTTP(&Config{PeerAutoTLS: ec.PeerAutoTLS, PeerCertFile: ec.PeerTLSInfo.CertFile,
		PeerKeyFile: ec.PeerTLSInfo.KeyFile, PeerTrustedCAFile: ec.PeerTLSInfo.TrustedCAFile})
	pc.Timeout = time.Second
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.IsRaftLeader() {
			start := time.Now()
			to, err := s.transferee(ctx, pc)
			if err == nil {
				// Bounded: a transferee that stops answering mid-transfer
				// must not hold the term (or a shutdown) for etcd's whole
				// request timeout; raft aborts the transfer by itself.
				mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				err = srv.MoveLeader(mctx, uint64(srv.MemberID()), to)
				cancel()
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				log.Warn("could not move raft leadership away from the beatd leader", "err", err)
			} else {
				log.Info("moved raft leadership away from the beatd leader", "to", types.ID(to).String(), "took", time.Since(start).String())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-srv.LeaderChangedNotify():
		case <-tick.C:
		}
	}
}

// clientTLS is the TLS a member uses as a client of its cluster (nil
// without client TLS): its own certificate, and the cluster's CA.
func (c *Config) clientTLS() (*tls.Config, error) {
	if c.ClientCertFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: c.ClientCertFile, KeyFile: c.ClientKeyFile, TrustedCAFile: c.ClientTrustedCAFile}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client TLS: %w", err)
	}
	return tc, nil
}
