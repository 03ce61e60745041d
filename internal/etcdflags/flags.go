package etcdflags

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/internal/tlsfiles"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Flags are how every command reaches etcd: `beatd run` and the CLI alike.
type Flags struct {
	Endpoints    string
	Prefix       string
	CACert       string
	Cert         string
	Key          string
	Username     string
	PasswordFile string
	// AutoSync refreshes the endpoints from the member list (embedded
	// cluster mode, where members come and go with the replicas); not a
	// flag: the daemon sets it.
	AutoSync time.Duration
}

// Register adds the etcd flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Endpoints, "etcd-endpoints", f.Endpoints, "comma-separated etcd client URLs; empty runs an embedded single-node etcd (run) or uses http://127.0.0.1:2379 (other commands)")
	fs.StringVar(&f.Prefix, "prefix", f.Prefix, "key prefix of this beatd cluster in etcd")
	fs.StringVar(&f.CACert, "etcd-cacert", "", "CA bundle to verify etcd's TLS certificate")
	fs.StringVar(&f.Cert, "etcd-cert", "", "client certificate for etcd TLS")
	fs.StringVar(&f.Key, "etcd-key", "", "client key for etcd TLS")
	fs.StringVar(&f.Username, "etcd-username", "", "etcd user; the password comes from --etcd-password-file or BEATD_ETCD_PASSWORD")
	fs.StringVar(&f.PasswordFile, "etcd-password-file", "", "file holding the etcd password")
}

// EndpointURLs are --etcd-endpoints, split.
func (f *Flags) EndpointURLs() []string {
	var out []string
	for _, e := range strings.Split(f.Endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// KeyPrefix is --prefix as etcd keys begin with it (keys.Prefix).
func (f *Flags) KeyPrefix() string {
	return keys.Prefix(f.Prefix)
}

// Client dials etcd with TLS and auth as configured. Secrets are read
// here and never logged.
func (f *Flags) Client() (*clientv3.Client, error) {
	eps := f.EndpointURLs()
	if len(eps) == 0 {
		eps = []string{"http://127.0.0.1:2379"}
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		// A leader that lost etcd must see it back within a lease TTL,
		// not after gRPC's minutes-long default backoff.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(retry.GRPCConnect(250*time.Millisecond, 2*time.Second, 3*time.Second))}}
	cfg.AutoSyncInterval = f.AutoSync
	tc, err := f.TLSConfig()
	if err != nil {
		return nil, err
	}
	cfg.TLS = tc
	if f.Username != "" {
		pw, err := Secret(f.PasswordFile, "BEATD_ETCD_PASSWORD")
		if err != nil {
			return nil, err
		}
		if pw == "" {
			return nil, errors.New("etcd user set without a password: use --etcd-password-file or BEATD_ETCD_PASSWORD")
		}
		cfg.Username, cfg.Password = f.Username, pw
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(eps, ","), err)
	}
	return cli, nil
}

// TLSConfig is the client TLS configuration, nil without TLS flags.
func (f *Flags) TLSConfig() (*tls.Config, error) {
	if f.CACert == "" && f.Cert == "" && f.Key == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CACert != "" {
		pool, err := tlsfiles.Pool(f.CACert)
		if err != nil {
			return nil, fmt.Errorf("etcd %w", err)
		}
		tc.RootCAs = pool
	}
	if f.Cert != "" || f.Key != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// Secret reads a secret from a file, else from an environment variable.
// Secrets are never logged.
func Secret(file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read secret: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv(env), nil
}
