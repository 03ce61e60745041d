package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/beatd/beatd/internal/certgen"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/spf13/cobra"
)

// certsCommand is `beatd certs init`: a CA and the certificates of an
// embedded cluster's members, for client and peer TLS with certificate
// auth, named for a StatefulSet's stable DNS names.
func certsCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "certs init --dir DIR [--statefulset beatd --service beatd --namespace default --replicas 3]",
		Short: "make a CA and certificates for the embedded etcd cluster's client and peer TLS",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	var (
		dir, sts, svc, ns string
		replicas          int
		days              int
		extra             []string
	)
	initCmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "write ca.crt, ca.key, tls.crt, tls.key (the members') and cli.crt, cli.key (the CLI's)",
		Long: `init writes a new CA and two certificates it signs, into --dir:

  ca.crt, ca.key     the CA (keep ca.key offline: it signs whatever may join)
  tls.crt, tls.key   the members' certificate, for server and client auth, valid for
                     every replica of the StatefulSet (NAME-i, NAME-i.SERVICE,
                     NAME-i.SERVICE.NAMESPACE.svc[.cluster.local], and *.SERVICE... for
                     replicas added later), localhost and 127.0.0.1
  cli.crt, cli.key   a client certificate for beatd's CLI (--etcd-cert, --etcd-key)

Then put ca.crt, tls.crt and tls.key in the Secret beatd-etcd-tls that the
deploy/k8s/components/etcd-tls component mounts:

  kubectl create secret generic beatd-etcd-tls --from-file=DIR/ca.crt --from-file=DIR/tls.crt --from-file=DIR/tls.key`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			if dir == "" {
				return usageError{c, fmt.Errorf("--dir is required")}
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			for _, f := range []string{"ca.key", "tls.key", "cli.key"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
					fmt.Fprintf(stderr, "beatd certs init: %s exists; not overwritten (use another --dir)\n", filepath.Join(dir, f))
					return codeErr(exitFail)
				}
			}
			now := time.Now()
			life := time.Duration(days) * 24 * time.Hour
			ca, err := certgen.NewCA("beatd etcd CA ("+sts+"."+ns+")", now, 10*life)
			if err != nil {
				return err
			}
			dns := []string{"localhost", "*." + svc, "*." + svc + "." + ns, "*." + svc + "." + ns + ".svc", "*." + svc + "." + ns + ".svc.cluster.local"}
			for i := range replicas {
				pod := sts + "-" + strconv.Itoa(i)
				dns = append(dns, pod, pod+"."+svc, pod+"."+svc+"."+ns, pod+"."+svc+"."+ns+".svc", pod+"."+svc+"."+ns+".svc.cluster.local")
			}
			dns = append(dns, extra...)
			member, memberKey, err := ca.Issue(certgen.Spec{CN: sts, DNS: dns, IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
				Server: true, Client: true, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(life)})
			if err != nil {
				return err
			}
			cli, cliKey, err := ca.Issue(certgen.Spec{CN: "beatd-cli", Client: true, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(life)})
			if err != nil {
				return err
			}
			caKey, err := ca.KeyPEM()
			if err != nil {
				return err
			}
			for name, b := range map[string][]byte{"ca.crt": ca.CertPEM(), "ca.key": caKey, "tls.crt": member, "tls.key": memberKey, "cli.crt": cli, "cli.key": cliKey} {
				if err := certgen.WriteFile(filepath.Join(dir, name), b); err != nil {
					return err
				}
			}
			fmt.Fprintf(stdout, "wrote %s: ca.crt ca.key tls.crt tls.key cli.crt cli.key (valid %d days; the CA %d)\n", dir, days, 10*days)
			fmt.Fprintf(stdout, "kubectl -n %s create secret generic beatd-etcd-tls --from-file=%s --from-file=%s --from-file=%s\n", ns,
				filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
			return nil
		},
	}
	fs := flagenv.New("certs init", stderr)
	fs.StringVar(&dir, "dir", "", "directory to write the files into (made if missing; existing keys are not overwritten)")
	fs.StringVar(&sts, "statefulset", "beatd", "the StatefulSet's name (its pods are NAME-0, NAME-1, ...)")
	fs.StringVar(&svc, "service", "beatd", "the headless Service that names the pods")
	fs.StringVar(&ns, "namespace", "default", "the namespace")
	fs.IntVar(&replicas, "replicas", 3, "replicas to name explicitly (the wildcard covers later ones)")
	fs.IntVar(&days, "days", 365, "the certificates' validity in days (the CA's is ten times it)")
	fs.StringSliceVar(&extra, "dns", nil, "more DNS names for the members' certificate")
	commandFlags(initCmd, fs)
	root.AddCommand(initCmd)
	return root
}
