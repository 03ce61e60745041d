package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/keys"
	"github.com/spf13/pflag"
)

// apiTarget is how a command that talks to beatd's HTTP API finds it:
// --server when given (BEATD_SERVER), else the leader's address, as the
// leader registered it in etcd (--etcd-endpoints, --prefix). Every
// command that needs a replica's HTTP goes through it.
type apiTarget struct {
	etcd                        etcdflags.Flags
	server, tokenFile, serverCA string
}

func newAPITarget() apiTarget {
	return apiTarget{etcd: etcdflags.Flags{Prefix: keys.DefaultPrefix}}
}

// register adds the target's flags: the etcd ones, --server,
// --token-file and --server-cacert.
func (t *apiTarget) register(fs *pflag.FlagSet) {
	t.etcd.Register(fs)
	fs.StringVar(&t.server, "server", "", "beatd's HTTP address (default: the leader's, found in etcd through --etcd-endpoints and --prefix)")
	fs.StringVar(&t.tokenFile, "token-file", "", "file holding the bearer token (else BEATD_TOKEN, else BEATD_ADMIN_TOKEN)")
	fs.StringVar(&t.serverCA, "server-cacert", "", serverCACertHelp)
}

// client is an API client of --server, else of the leader found in etcd
// within timeout.
func (t *apiTarget) client(ctx context.Context, timeout time.Duration) (*entriesClient, error) {
	server, via := t.server, "--server"
	if server == "" {
		var err error
		if server, err = leaderServer(ctx, &t.etcd, timeout); err != nil {
			return nil, err
		}
		via = "etcd"
	}
	c, err := newAPIClient(server, t.tokenFile, t.serverCA)
	if err != nil {
		return nil, err
	}
	c.via = via
	return c, nil
}

// leaderServer is the base URL of the leader's HTTP server, as it
// registered it in etcd: the CLI's one way to find the cluster's HTTP.
func leaderServer(ctx context.Context, ef *etcdflags.Flags, timeout time.Duration) (string, error) {
	cli, err := ef.Client()
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, u, err := election.FindLeader(ctx, cli, ef.KeyPrefix())
	switch {
	case errors.Is(err, election.ErrNoLeader):
		return "", fmt.Errorf("no beatd leads the cluster under prefix %s in etcd at %s (is a replica running? is --prefix right? --server or BEATD_SERVER give a replica's HTTP address)",
			ef.KeyPrefix(), ef.Where())
	case errors.Is(err, election.ErrNotRegistered):
		return "", fmt.Errorf("%w in etcd at %s; --server or BEATD_SERVER give a replica's HTTP address", err, ef.Where())
	case err != nil:
		return "", ef.Failure("find the leader", timeout, err)
	}
	return u, nil
}
