package deploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// A pod of the embedded StatefulSet, run as a process (or a container) on
// loopback. The manifest's container command, args and env are taken as
// they are, with what Kubernetes would do to them:
//   - the pod name comes from the fieldRef, and $(VAR) expands as the
//     kubelet expands it (only variables defined earlier);
//   - "<pod>.<service>:<port>" DNS names map to 127.0.0.1 and a port of
//     that pod's own, as the pod network would route them;
//   - ":PORT" listen addresses bind 127.0.0.1 and the pod's port, and the
//     etcd listen URLs (0.0.0.0 in a pod) bind 127.0.0.1;
//   - volume mounts map to directories of the pod (unless mountsInPlace,
//     for a container that bind-mounts them).
type pod struct {
	name     string
	index    int
	args     []string
	env      []string // NAME=value
	dir      string   // the pod's directories: one per volume
	mounts   map[string]string
	httpAddr string
	log      string
	cmd      *exec.Cmd
	exited   chan struct{}
}

// podNet assigns every pod its own loopback ports for the container ports.
type podNet struct {
	sts, svc string
	ports    []map[int32]int // pod index -> container port -> host port
}

func newPodNet(t *testing.T, sts, svc string, n int, containerPorts []int32) *podNet {
	pn := &podNet{sts: sts, svc: svc}
	// Every port is picked before any pod binds one, so a port free at
	// its pick can be picked again: a CI run gave a scaled-up pod the
	// HTTP port of a running one, which then failed to bind it.
	taken := map[int]bool{}
	for i := 0; i < n; i++ {
		m := map[int32]int{}
		for _, p := range containerPorts {
			m[p] = freePort(t, taken)
		}
		pn.ports = append(pn.ports, m)
	}
	return pn
}

// freePort returns a free loopback port below Linux's ephemeral range
// (32768 and up), not in taken, and adds it there: the pods bind their
// ports again after every restart, and a port from the ephemeral range
// can meanwhile be taken by some outbound connection.
func freePort(t *testing.T, taken map[int]bool) int {
	t.Helper()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if taken[port] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			l.Close()
			taken[port] = true
			return port
		}
	}
	t.Fatal("no free port in 20000-32000")
	return 0
}

// rewrite maps DNS names and listen addresses in s for pod i.
func (pn *podNet) rewrite(s string, i int) string {
	re := regexp.MustCompile(regexp.QuoteMeta(pn.sts) + `-(\d+)\.` + regexp.QuoteMeta(pn.svc) + `:(\d+)`)
	s = re.ReplaceAllStringFunc(s, func(m string) string {
		sub := re.FindStringSubmatch(m)
		j, _ := strconv.Atoi(sub[1])
		p, _ := strconv.Atoi(sub[2])
		if j >= len(pn.ports) {
			return m
		}
		return "127.0.0.1:" + strconv.Itoa(pn.ports[j][int32(p)])
	})
	if port, ok := strings.CutPrefix(s, ":"); ok {
		if p, err := strconv.Atoi(port); err == nil {
			s = "127.0.0.1:" + strconv.Itoa(pn.ports[i][int32(p)])
		}
	}
	return s
}

// expand is the kubelet's $(VAR) expansion: defined variables expand,
// $$ escapes, anything else stays as written.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			if s[i+1] == '$' {
				b.WriteByte('$')
				i++
				continue
			}
			if s[i+1] == '(' {
				if end := strings.IndexByte(s[i:], ')'); end > 0 {
					if v, ok := vars[s[i+2:i+end]]; ok {
						b.WriteString(v)
						i += end
						continue
					}
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// podOptions are the test's changes to the manifest: the schedule and the
// broker are the test's; the rest is as written.
type podOptions struct {
	schedule      string
	broker        string
	mountsInPlace bool // a container bind-mounts the pod's directories
	base          string
	extraEnv      []string // NAME=value, after the manifest's
	// secrets are the files of Secrets the manifests name but do not
	// hold (a TLS Secret the operator makes): name -> key -> content.
	secrets map[string]map[string]string
}

// buildPod turns the rendered StatefulSet's container into pod i.
func buildPod(t *testing.T, r *rendered, pn *podNet, i int, opt podOptions) *pod {
	t.Helper()
	c := container(t, r)
	p := &pod{name: fmt.Sprintf("%s-%d", r.sts.Name, i), index: i, dir: filepath.Join(opt.base, fmt.Sprintf("%s-%d", r.sts.Name, i)),
		mounts: map[string]string{}}
	p.log = filepath.Join(opt.base, p.name+".log")
	vols := map[string]corev1.Volume{}
	for _, v := range r.sts.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	claims := map[string]bool{}
	for _, v := range r.sts.Spec.VolumeClaimTemplates {
		claims[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		host := filepath.Join(p.dir, m.Name)
		if err := os.MkdirAll(host, 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		v := vols[m.Name]
		switch {
		case v.ConfigMap != nil:
			cm := r.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("no ConfigMap %s", v.ConfigMap.Name)
			}
			for k, val := range cm.Data {
				files[k] = val
				if strings.HasSuffix(k, ".yaml") && opt.schedule != "" {
					files[k] = opt.schedule
				}
			}
		case v.Secret != nil:
			if s := r.secrets[v.Secret.SecretName]; s != nil {
				for k, val := range s.StringData {
					files[k] = val
				}
			}
			for k, val := range opt.secrets[v.Secret.SecretName] {
				files[k] = val
			}
		case claims[m.Name]:
			// An empty volume owned by the pod's user (fsGroup).
			if err := os.Chown(host, 65532, 65532); err != nil && os.Geteuid() == 0 {
				t.Fatal(err)
			}
		default:
			t.Fatalf("volume %s: unexpected source", m.Name)
		}
		for k, val := range files {
			if err := os.WriteFile(filepath.Join(host, k), []byte(val), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		p.mounts[m.MountPath] = host
	}
	vars := map[string]string{}
	var names []string
	for _, e := range c.Env {
		val := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			val = p.name
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := r.configMaps[ref.Name]
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[ref.Key]
			}
			if !ok {
				t.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			val = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := r.secrets[ref.Name]
			v, ok := "", false
			if s != nil {
				v, ok = s.StringData[ref.Key]
			}
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				t.Fatalf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			if !ok {
				continue
			}
			val = v
		default:
			t.Fatalf("env %s: unsupported valueFrom", e.Name)
		}
		val = expand(val, vars)
		vars[e.Name] = val
		names = append(names, e.Name)
	}
	// The pod network: loopback, its own ports.
	for _, n := range names {
		vars[n] = pn.rewrite(vars[n], i)
	}
	if opt.broker != "" {
		vars["BEATD_BROKER"] = opt.broker
	}
	if ic := vars["BEATD_ETCD_INITIAL_CLUSTER"]; ic != "" {
		// In a pod the member binds 0.0.0.0; here only its own loopback port.
		vars["BEATD_ETCD_LISTEN_PEER_URL"] = vars["BEATD_ETCD_ADVERTISE_PEER_URL"]
		vars["BEATD_ETCD_LISTEN_CLIENT_URL"] = vars["BEATD_ETCD_ADVERTISE_CLIENT_URL"]
		names = append(names, "BEATD_ETCD_LISTEN_PEER_URL", "BEATD_ETCD_LISTEN_CLIENT_URL")
	}
	p.httpAddr = vars["BEATD_HTTP"]
	p.args = append([]string(nil), c.Command...)
	p.args = append(p.args, c.Args...)
	for k := range p.args {
		p.args[k] = pn.rewrite(expand(p.args[k], vars), i)
	}
	if !opt.mountsInPlace {
		for k := range p.args {
			p.args[k] = p.hostPath(p.args[k])
		}
		for _, n := range names {
			vars[n] = p.hostPath(vars[n])
		}
	}
	sort.Strings(names)
	for _, n := range names {
		p.env = append(p.env, n+"="+vars[n])
	}
	p.env = append(p.env, opt.extraEnv...)
	return p
}

// hostPath maps a path under a mount to the pod's directory.
func (p *pod) hostPath(s string) string {
	var best string
	for mp := range p.mounts {
		if (s == mp || strings.HasPrefix(s, mp+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	if best == "" {
		return s
	}
	return p.mounts[best] + strings.TrimPrefix(s, best)
}

// dataDir is the pod's persistent volume on the host.
func (p *pod) dataDir(r *rendered) string {
	return filepath.Join(p.dir, r.sts.Spec.VolumeClaimTemplates[0].Name)
}

// start runs the pod's container as a process of the static binary (the
// image's entrypoint).
func (p *pod) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(beatdBin(), p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
}

func (p *pod) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.cmd = nil
}

func (p *pod) term(timeout time.Duration) bool {
	if p.cmd == nil {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		p.cmd = nil
		return true
	case <-time.After(timeout):
		p.kill()
		return false
	}
}

func (p *pod) envValue(name string) string {
	for _, e := range p.env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	return ""
}

// etcdClient reaches the members' client URLs (as the pods advertise them).
func etcdClient(t *testing.T, pods []*pod, tc *tls.Config) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, p := range pods {
		eps = append(eps, p.envValue("BEATD_ETCD_ADVERTISE_CLIENT_URL"))
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: tc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// observe returns the current beatd leader, or an error.
func observe(cli *clientv3.Client, prefix string) (election.Leader, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return election.Observe(ctx, cli, prefix)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, timeout, 50*time.Millisecond, what, cond)
}
