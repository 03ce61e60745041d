package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// podman runs podman with runc and a containers.conf without default
// ulimits: this machine's crun, and podman's default ulimits, are refused
// in the sandbox the tests run in.
type podman struct {
	t    *testing.T
	conf string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			// In CI a missing tool is a failure: a skipped image test is
			// not a tested image. .ci/deps installs both.
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (.ci/deps installs it): the image cannot be tested", tool)
			}
			t.Skipf("%s is not installed (apt-get install podman runc, or make deps): the image is not tested", tool)
		}
	}
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &podman{t: t, conf: conf}
}

func (p *podman) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command("podman", append([]string{"--runtime", "runc"}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	return cmd
}

func (p *podman) run(args ...string) string {
	p.t.Helper()
	out, err := p.cmd(args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestImage builds the FROM scratch image with deploy/image.sh (offline,
// no pull), runs `beatd version` in it as non-root on a read-only root
// filesystem, then runs the embedded StatefulSet's three pods as
// containers on the host network: they form a cluster, elect a leader and
// publish into a Redis on loopback.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a container image")
	}
	pm := newPodman(t)
	tag := fmt.Sprintf("localhost/beatd-test:%d", time.Now().UnixNano())
	build := exec.Command("./image.sh", tag)
	build.Env = append(os.Environ(), "BEATD_BIN="+beatdBin(), "CONTAINERS_CONF="+pm.conf)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("image.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = pm.cmd("rmi", "-f", tag).Run() })
	if user := pm.run("image", "inspect", "-f", "{{.Config.User}}", tag); user != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", user)
	}
	locked := []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"}
	if out := pm.run(append(append([]string{"run", "--rm"}, locked...), tag, "version")...); !strings.HasPrefix(out, "beatd ") {
		t.Errorf("beatd version in the image: %q", out)
	}
	// `kubectl exec POD -- beatd status` finds beatd on the image's PATH.
	if out := pm.run(append(append([]string{"run", "--rm", "--entrypoint", "beatd"}, locked...), tag, "version")...); !strings.HasPrefix(out, "beatd ") {
		t.Errorf("beatd on PATH in the image: %q", out)
	}

	// The embedded StatefulSet's pods as containers.
	rs := testutil.MustStartRedis(t)
	rdb := rs.Client()
	r := render(t, "embedded")
	c := container(t, r)
	var cports []int32
	for _, p := range c.Ports {
		cports = append(cports, p.ContainerPort)
	}
	n := int(*r.sts.Spec.Replicas)
	pn := newPodNet(t, r.sts.Name, r.sts.Spec.ServiceName, n, cports)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	var pods []*pod
	var names []string
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range names {
				out, _ := pm.cmd("logs", "--tail", "20", name).CombinedOutput()
				t.Logf("--- %s ---\n%s", name, out)
			}
		}
		if len(names) > 0 {
			// One podman for all: each podman start takes seconds on a loaded machine.
			_ = pm.cmd(append([]string{"rm", "-f", "-t", "0"}, names...)...).Run()
		}
	})
	for i := 0; i < n; i++ {
		p := buildPod(t, r, pn, i, podOptions{schedule: runSchedule, broker: rs.URL(0), mountsInPlace: true, base: base})
		pods = append(pods, p)
		name := fmt.Sprintf("beatd-test-%d-%s", os.Getpid(), p.name)
		args := append([]string{"run", "-d", "--name", name, "--network", "host"}, locked...)
		for mp, host := range p.mounts {
			if err := os.Chmod(filepath.Dir(host), 0o755); err != nil {
				t.Fatal(err)
			}
			opt := ":ro"
			if strings.HasPrefix(host, p.dataDir(r)) {
				opt = ""
			}
			args = append(args, "-v", host+":"+mp+opt)
		}
		for _, e := range p.env {
			args = append(args, "-e", e)
		}
		args = append(append(args, tag), p.args...)
		pm.run(args...)
		names = append(names, name)
	}
	for _, name := range names {
		if u := pm.run("top", name, "user"); !strings.Contains(u, "beatd") || strings.Contains(u, "root") {
			t.Errorf("%s runs as %q, want the image's user beatd", name, u)
		}
	}
	cli := etcdClient(t, pods, nil)
	var leader string
	waitFor(t, 60*time.Second, "a leader among the containers", func() bool {
		l, err := observe(cli, pods[0].envValue("BEATD_PREFIX"))
		leader = l.ID
		return err == nil
	})
	waitFor(t, 20*time.Second, "publishes from the containers", func() bool {
		n, err := rdb.LLen(context.Background(), "deploytest").Result()
		return err == nil && n >= 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != n {
		t.Fatalf("member list: %v %v", ml, err)
	}
	t.Logf("3 containers (user beatd, read-only root, no capabilities): %d members, leader %s, publishing", len(ml.Members), leader)
}
