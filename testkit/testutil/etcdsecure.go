package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/beatd/beatd/testkit/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// SecureEtcd is Debian's etcd binary serving clients over TLS only, with
// client certificates required (--client-cert-auth, --trusted-ca-file)
// and, once EnableAuth ran, RBAC. One per package: start it in TestMain
// or a sync.Once.
type SecureEtcd struct {
	Certs      *Certs
	ClientPort int
	Dir        string
	// RootCert and RootKey are a client certificate whose CN is root: with
	// --client-cert-auth etcd takes the CN as the user name.
	RootCert, RootKey string
	proc              *harness.Proc
}

// Endpoint is the https client URL.
func (e *SecureEtcd) Endpoint() string { return "https://127.0.0.1:" + strconv.Itoa(e.ClientPort) }

// StartSecureEtcd starts a single etcd member under dir with TLS from certs.
func StartSecureEtcd(dir string, certs *Certs) (*SecureEtcd, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, fmt.Errorf("etcd not on PATH: apt-get install -y etcd-server")
	}
	cp, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	pp, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	e := &SecureEtcd{Certs: certs, ClientPort: cp, Dir: dir}
	if e.RootCert, e.RootKey, err = certs.Issue("etcd-root", "root", false); err != nil {
		return nil, err
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	args := []string{"--name", "secure", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", e.Endpoint(), "--advertise-client-urls", e.Endpoint(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "secure=" + peer, "--initial-cluster-state", "new",
		"--cert-file", certs.ServerCert, "--key-file", certs.ServerKey,
		"--trusted-ca-file", certs.CA, "--client-cert-auth",
		"--heartbeat-interval", "50", "--election-timeout", "500"}
	if e.proc, err = harness.Start(harness.Spec{Name: "etcd", Bin: "etcd", Args: args, LogPath: filepath.Join(dir, "etcd.log")}); err != nil {
		return nil, err
	}
	cli, err := e.Client("", "")
	if err != nil {
		e.Stop()
		return nil, err
	}
	defer cli.Close()
	err = harness.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Put(ctx, "/health", "ok")
		return err
	})
	if err != nil {
		e.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
		return nil, fmt.Errorf("secure etcd did not start: %w\n%s", err, log)
	}
	return e, nil
}

// Client connects with the root client certificate, and as user with
// password if user is set.
func (e *SecureEtcd) Client(user, password string) (*clientv3.Client, error) {
	tc, err := e.Certs.ClientTLSWithCert(e.RootCert, e.RootKey)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, TLS: tc, Username: user, Password: password,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// EnableAuth creates the root user and turns authentication on. From then
// on the root certificate acts as root.
func (e *SecureEtcd) EnableAuth(ctx context.Context, rootPassword string) error {
	cli, err := e.Client("", "")
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.UserAdd(ctx, "root", rootPassword); err != nil {
		return fmt.Errorf("user add root: %w", err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("grant root: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("auth enable: %w", err)
	}
	return nil
}

// AddUser creates user with password (empty: certificate-only) and a role
// of the same name with readwrite on every key under prefix, as the README's
// etcdctl commands do.
func (e *SecureEtcd) AddUser(ctx context.Context, user, password, prefix string) error {
	return e.AddUserPerm(ctx, user, password, prefix, clientv3.PermissionType(clientv3.PermReadWrite))
}

// AddUserPerm is AddUser with the role's permission on prefix.
func (e *SecureEtcd) AddUserPerm(ctx context.Context, user, password, prefix string, perm clientv3.PermissionType) error {
	cli, err := e.Client("", "")
	if err != nil {
		return err
	}
	defer cli.Close()
	// The etcd is shared by a package's tests, and -count=N runs a test
	// again: start from no such user or role. Not found is fine.
	if _, err := cli.UserDelete(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return fmt.Errorf("user delete %s: %w", user, err)
	}
	if _, err := cli.RoleDelete(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return fmt.Errorf("role delete %s: %w", user, err)
	}
	if _, err := cli.RoleAdd(ctx, user); err != nil {
		return fmt.Errorf("role add %s: %w", user, err)
	}
	if _, err := cli.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), perm); err != nil {
		return fmt.Errorf("grant %s on %s: %w", user, prefix, err)
	}
	if password == "" {
		_, err = cli.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
	} else {
		_, err = cli.UserAdd(ctx, user, password)
	}
	if err != nil {
		return fmt.Errorf("user add %s: %w", user, err)
	}
	if _, err := cli.UserGrantRole(ctx, user, user); err != nil {
		return fmt.Errorf("grant role %s: %w", user, err)
	}
	return nil
}

// Stop kills the member and waits for it to exit.
func (e *SecureEtcd) Stop() {
	if e.proc == nil {
		return
	}
	e.proc.Kill()
	e.proc = nil
}
