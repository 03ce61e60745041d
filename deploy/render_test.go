// Package deploy holds no code: its tests render the Kubernetes manifests
// with kustomize, decode them strictly, check their invariants, run them as
// processes and build and run the container image.
package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The renderings under test: each topology, and each with every component.
var renderings = map[string]string{
	"embedded":            "embedded",
	"external":            "external",
	"embedded+components": "resources: [../embedded]\ncomponents: [../components/monitoring, ../components/peer-tls]\n",
	"external+monitoring": "resources: [../external]\ncomponents: [../components/monitoring]\n",
	"embedded+etcd-tls":   "resources: [../embedded]\ncomponents: [../components/etcd-tls]\n",
	"embedded+https":      "resources: [../embedded]\ncomponents: [../components/etcd-tls, ../components/http-tls]\n",
	"external+https":      "resources: [../external]\ncomponents: [../components/monitoring, ../components/http-tls]\n",
	// The operator's one setting for a sharded cluster, as the base's
	// kustomization.yaml says to write it.
	"embedded+shards": "resources: [../embedded]\n" + shardsOverlay,
	"external+shards": "resources: [../external]\n" + shardsOverlay,
	// The same, parked for a resize (deploy/README.md#shards).
	"embedded+shards+park": "resources: [../embedded]\n" + parkOverlay,
	// The same resized to 8 and unparked.
	"embedded+shards8": "resources: [../embedded]\nconfigMapGenerator:\n  - {name: beatd-cluster, behavior: merge, literals: [shards=8, park=false]}\n",
}

// parkOverlay is shardsOverlay with every replica parked.
const parkOverlay = "configMapGenerator:\n  - {name: beatd-cluster, behavior: merge, literals: [shards=4, park=true]}\n"

// shardsOverlay sets the shard count to 4.
const shardsOverlay = "configMapGenerator:\n  - {name: beatd-cluster, behavior: merge, literals: [shards=4]}\n"

// rendered is one kustomize build, decoded strictly.
type rendered struct {
	name        string
	sts         *appsv1.StatefulSet
	services    []*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	netpols     []*networkingv1.NetworkPolicy
	monitors    []*serviceMonitor
	rules       []*prometheusRule
	resourceIDs []string
}

// serviceMonitor and prometheusRule are the Prometheus Operator's CRDs, as
// far as the manifests use them (not in k8s.io/api): strict decoding still
// catches a misspelt field.
type serviceMonitor struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Metadata   metav1ObjectMeta   `json:"metadata"`
	Spec       serviceMonitorSpec `json:"spec"`
}

type metav1ObjectMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

type serviceMonitorSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	Endpoints []struct {
		Port     string `json:"port"`
		Path     string `json:"path"`
		Interval string `json:"interval"`
	} `json:"endpoints"`
}

type prometheusRule struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   metav1ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// strictUnmarshal decodes JSON into v and fails on an unknown field, as
// the API server's strict field validation does.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// decodeResource decodes one rendered object by its kind into r.
func (r *rendered) decode(b []byte) error {
	var head struct{ APIVersion, Kind string }
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	into := func(v any) error {
		if err := strictUnmarshal(b, v); err != nil {
			return fmt.Errorf("%s %s: %w", head.APIVersion, head.Kind, err)
		}
		return nil
	}
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 StatefulSet":
		if r.sts != nil {
			return fmt.Errorf("two StatefulSets")
		}
		r.sts = &appsv1.StatefulSet{}
		return into(r.sts)
	case "v1 Service":
		s := &corev1.Service{}
		r.services = append(r.services, s)
		return into(s)
	case "v1 ConfigMap":
		c := &corev1.ConfigMap{}
		if err := into(c); err != nil {
			return err
		}
		r.configMaps[c.Name] = c
	case "v1 Secret":
		s := &corev1.Secret{}
		if err := into(s); err != nil {
			return err
		}
		r.secrets[s.Name] = s
	case "policy/v1 PodDisruptionBudget":
		p := &policyv1.PodDisruptionBudget{}
		r.pdbs = append(r.pdbs, p)
		return into(p)
	case "networking.k8s.io/v1 NetworkPolicy":
		p := &networkingv1.NetworkPolicy{}
		r.netpols = append(r.netpols, p)
		return into(p)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		m := &serviceMonitor{}
		r.monitors = append(r.monitors, m)
		return into(m)
	case "monitoring.coreos.com/v1 PrometheusRule":
		m := &prometheusRule{}
		r.rules = append(r.rules, m)
		return into(m)
	default:
		return fmt.Errorf("unexpected kind %s %s: add it to the test's decoder", head.APIVersion, head.Kind)
	}
	return nil
}

// render builds one of the renderings from the files in k8s/.
func render(t *testing.T, name string) *rendered {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir("k8s", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile("/"+filepath.ToSlash(p), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := "/k8s/" + renderings[name]
	if strings.Contains(renderings[name], "\n") {
		dir = "/k8s/test-" + strings.ReplaceAll(name, "+", "-")
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + renderings[name]
		if err := mem.WriteFile(dir+"/kustomization.yaml", []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", name, err)
	}
	r := &rendered{name: name, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, res := range m.Resources() {
		b, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.decode(b); err != nil {
			t.Fatalf("%s: %s/%s: %v", name, res.GetKind(), res.GetName(), err)
		}
		r.resourceIDs = append(r.resourceIDs, res.GetKind()+"/"+res.GetName())
	}
	if r.sts == nil {
		t.Fatalf("%s: no StatefulSet", name)
	}
	return r
}

func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		doc string
		v   any
	}{
		{`{"apiVersion":"apps/v1","kind":"StatefulSet","spec":{"replica":3}}`, &appsv1.StatefulSet{}},
		{`{"apiVersion":"v1","kind":"Service","spec":{"publishNotReadyAdresses":true}}`, &corev1.Service{}},
		{`{"apiVersion":"monitoring.coreos.com/v1","kind":"PrometheusRule","spec":{"groups":[{"name":"g","rules":[{"alert":"a","expr":"1","for":"1m","label":{}}]}]}}`, &prometheusRule{}},
	} {
		if err := strictUnmarshal([]byte(tc.doc), tc.v); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s decoded without an unknown-field error (%v)", tc.doc, err)
		}
	}
}

// TestManifestsDecodeStrictly renders every topology and component with
// kustomize and decodes each object with k8s.io/api types, failing on any
// unknown field.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	names := make([]string, 0, len(renderings))
	for n := range renderings {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := render(t, n)
		t.Logf("%s: %s", n, strings.Join(r.resourceIDs, ", "))
	}
}

// runFlags are the flags of `beatd run`, read from its -h output.
var runFlags = sync.OnceValues(func() (map[string]bool, error) {
	out, _ := exec.Command(beatdBin(), "run", "-h").CombinedOutput()
	flags := map[string]bool{}
	// cobra's help: "  -o, --output string" or "      --lease-ttl duration".
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 {
		return nil, fmt.Errorf("beatd run -h listed only %d flags:\n%s", len(flags), out)
	}
	return flags, nil
})

// flagOfEnv is the flag a BEATD_* variable sets (BEATD_LEASE_TTL:
// lease-ttl), as cmd/beatd's parseFlags reads them.
func flagOfEnv(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "BEATD_")
	return strings.ToLower(strings.ReplaceAll(rest, "_", "-")), ok
}

func container(t *testing.T, r *rendered) *corev1.Container {
	t.Helper()
	cs := r.sts.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers, want 1", r.name, len(cs))
	}
	return &cs[0]
}

func envValue(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// shardsOf is the shard count the rendering's replicas run with: the
// value of the ConfigMap key BEATD_SHARDS is read from.
func shardsOf(t *testing.T, r *rendered, c *corev1.Container) string {
	t.Helper()
	v, ok := clusterSetting(t, r, c, "BEATD_SHARDS")
	if !ok {
		t.Fatal("no BEATD_SHARDS")
	}
	return v
}

// clusterSetting is the value of env, which must come from a ConfigMap
// (one value for every replica); false when the container has no env.
func clusterSetting(t *testing.T, r *rendered, c *corev1.Container, env string) (string, bool) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != env {
			continue
		}
		if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			t.Fatalf("%s: want it from a ConfigMap, one value for every replica", env)
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		cm, ok := r.configMaps[ref.Name]
		if !ok {
			t.Fatalf("%s: no ConfigMap %s", env, ref.Name)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			t.Fatalf("%s: ConfigMap %s has no key %s", env, ref.Name, ref.Key)
		}
		return v, true
	}
	return "", false
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// handoverBound is the longest a SIGTERM'd replica takes to exit, by its
// timeouts: the shutdown flush (0.5 s), the resign (bounded at 2 s), the
// HTTP shutdown (2 s), a raft leadership transfer still in flight, and the
// embedded member's stop, which waits for other replicas' watch streams;
// the last two each within etcd's request timeout (5 s + 2 election
// timeouts); and before all of it, a sharded replica's drain (each shard
// handed to a replica that has loaded it: 10 s at most). A drill on a
// loaded machine saw SIGTERM exits up to 11.7 s.
func handoverBound(electionTimeout time.Duration) time.Duration {
	reqTimeout := 5*time.Second + 2*electionTimeout
	return 10*time.Second + 500*time.Millisecond + 2*time.Second + 2*time.Second + 2*reqTimeout
}

// TestManifestInvariants checks what a reviewer would: the manifests name
// only real flags, probe real endpoints, mount the schedule where --config
// points, give SIGTERM enough time, select their own pods, and wire the
// embedded members to the headless Service's DNS names.
func TestManifestInvariants(t *testing.T) {
	flags, err := runFlags()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"embedded", "external", "embedded+components", "external+monitoring", "embedded+etcd-tls", "embedded+https", "external+https", "embedded+shards", "external+shards", "embedded+shards+park"} {
		t.Run(name, func(t *testing.T) {
			r := render(t, name)
			c := container(t, r)
			pod := r.sts.Spec.Template
			// Every BEATD_* variable and every argument names a flag of
			// `beatd run`.
			if len(c.Command) != 0 {
				t.Errorf("command %v overrides the image's entrypoint (beatd)", c.Command)
			}
			if len(c.Args) == 0 || c.Args[0] != "run" {
				t.Fatalf("args %v: want `run ...`", c.Args)
			}
			args := map[string]string{}
			for i := 1; i < len(c.Args); i++ {
				a := c.Args[i]
				f, ok := strings.CutPrefix(a, "--")
				if !ok {
					t.Errorf("arg %q is not a flag", a)
					continue
				}
				f, v, hasValue := strings.Cut(f, "=")
				if !flags[f] {
					t.Errorf("arg %q: beatd run has no flag --%s", a, f)
				}
				if !hasValue && i+1 < len(c.Args) {
					i++
					v = c.Args[i]
				}
				args[f] = v
			}
			for _, e := range c.Env {
				if expansionOnly[e.Name] {
					continue
				}
				f, ok := flagOfEnv(e.Name)
				if !ok {
					t.Errorf("env %s is not a BEATD_* flag variable", e.Name)
				} else if !flags[f] {
					t.Errorf("env %s: beatd run has no flag --%s", e.Name, f)
				}
			}
			// The shard count is one value that every replica reads: the
			// beatd-cluster ConfigMap's, 1 unless the operator sets it.
			wantShards := "1"
			if strings.Contains(name, "+shards") {
				wantShards = "4"
			}
			if got := shardsOf(t, r, c); got != wantShards {
				t.Errorf("BEATD_SHARDS is %q, want %q", got, wantShards)
			}
			// Parking (docs/shards.md) keeps an embedded member for a
			// resize: every embedded replica reads it from the same
			// ConfigMap, "false" unless the operator parks them; the
			// external topology has no member to keep (beatd refuses
			// --park with --etcd-endpoints).
			park, hasPark := clusterSetting(t, r, c, "BEATD_PARK")
			wantPark := "false"
			if strings.HasSuffix(name, "+park") {
				wantPark = "true"
			}
			switch {
			case strings.HasPrefix(name, "external") && hasPark:
				t.Errorf("BEATD_PARK is set on the external topology, whose replicas refuse --park")
			case strings.HasPrefix(name, "embedded") && park != wantPark:
				t.Errorf("BEATD_PARK is %q (set: %v), want %q from the beatd-cluster ConfigMap", park, hasPark, wantPark)
			}
			// Probes hit real paths on the port beatd serves HTTP on.
			httpAddr, _ := envValue(c, "BEATD_HTTP")
			_, httpPort, _ := strings.Cut(httpAddr, ":")
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if strconv.Itoa(int(ports["http"])) != httpPort {
				t.Errorf("container port http %d, but BEATD_HTTP is %q", ports["http"], httpAddr)
			}
			for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s probe: want an httpGet", what)
					continue
				}
				if p.HTTPGet.Port.String() != "http" && p.HTTPGet.Port.IntValue() != int(ports["http"]) {
					t.Errorf("%s probe port %s is not beatd's HTTP port", what, p.HTTPGet.Port.String())
				}
				if p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz" {
					t.Errorf("%s probe path %s: beatd serves /healthz and /readyz", what, p.HTTPGet.Path)
				}
			}
			if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probes %s, want /readyz", c.ReadinessProbe.HTTPGet.Path)
			}
			// The schedule's ConfigMap is mounted where --config points.
			cfgPath := args["config"]
			if cfgPath == "" {
				t.Fatal("no --config")
			}
			vols := map[string]corev1.Volume{}
			for _, v := range pod.Spec.Volumes {
				vols[v.Name] = v
			}
			found := false
			for _, m := range c.VolumeMounts {
				v, ok := vols[m.Name]
				if !ok || v.ConfigMap == nil || m.MountPath != path.Dir(cfgPath) {
					continue
				}
				if m.SubPath != "" {
					t.Errorf("the schedule is mounted with subPath: Kubernetes never updates it, so hot reload cannot work")
				}
				cm, ok := r.configMaps[v.ConfigMap.Name]
				if !ok {
					t.Fatalf("volume %s: no ConfigMap %s", m.Name, v.ConfigMap.Name)
				}
				text, ok := cm.Data[path.Base(cfgPath)]
				if !ok {
					t.Fatalf("ConfigMap %s has no key %s", cm.Name, path.Base(cfgPath))
				}
				if _, err := config.Parse(cfgPath, []byte(text)); err != nil {
					t.Errorf("the ConfigMap's schedule is invalid: %v", err)
				}
				found = true
			}
			if !found {
				t.Errorf("no ConfigMap is mounted at %s (--config %s)", path.Dir(cfgPath), cfgPath)
			}
			// Every *_FILE variable points into a mounted Secret whose key
			// exists.
			for _, e := range c.Env {
				if !strings.HasSuffix(e.Name, "_FILE") || e.Value == "" {
					continue
				}
				ok := false
				for _, m := range c.VolumeMounts {
					v := vols[m.Name]
					if v.Secret != nil && path.Dir(e.Value) == m.MountPath {
						s, exists := r.secrets[v.Secret.SecretName]
						if !exists {
							ok = true // a Secret the user creates
							break
						}
						_, inData := s.StringData[path.Base(e.Value)]
						_, inBytes := s.Data[path.Base(e.Value)]
						ok = inData || inBytes
					}
				}
				if !ok {
					t.Errorf("%s=%s is not a key of a mounted Secret", e.Name, e.Value)
				}
			}
			// SIGTERM gets more time than a handover can take.
			grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
			if bound := handoverBound(time.Second); grace <= bound {
				t.Errorf("terminationGracePeriodSeconds %s does not exceed the handover bound %s", grace, bound)
			}
			// Non-root, read-only root filesystem, no capabilities, resources.
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, drop ALL", sc)
			}
			psc := pod.Spec.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
				t.Errorf("pod securityContext %+v: want runAsNonRoot with a non-zero user", psc)
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
			}
			// The Services, PDB, NetworkPolicies and ServiceMonitors select
			// the StatefulSet's pods.
			labels := pod.Labels
			if !selects(r.sts.Spec.Selector.MatchLabels, labels) {
				t.Errorf("the StatefulSet's selector does not match its pods")
			}
			var headless *corev1.Service
			for _, s := range r.services {
				if !selects(s.Spec.Selector, labels) {
					t.Errorf("Service %s does not select the pods", s.Name)
				}
				for _, p := range s.Spec.Ports {
					if p.TargetPort.String() != "" && p.TargetPort.IntValue() == 0 && ports[p.TargetPort.String()] == 0 {
						t.Errorf("Service %s port %s targets no container port", s.Name, p.Name)
					}
				}
				if s.Name == r.sts.Spec.ServiceName {
					headless = s
				}
			}
			if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
				t.Fatalf("serviceName %s: want a headless Service with publishNotReadyAddresses", r.sts.Spec.ServiceName)
			}
			if len(r.pdbs) != 1 || !selects(r.pdbs[0].Spec.Selector.MatchLabels, labels) ||
				r.pdbs[0].Spec.MaxUnavailable == nil || r.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("want one PDB with maxUnavailable 1 selecting the pods")
			}
			for _, np := range r.netpols {
				if !selects(np.Spec.PodSelector.MatchLabels, labels) {
					t.Errorf("NetworkPolicy %s does not select the pods", np.Name)
				}
			}
			for _, sm := range r.monitors {
				ok := false
				for _, s := range r.services {
					if selects(sm.Spec.Selector.MatchLabels, s.Labels) {
						for _, p := range s.Spec.Ports {
							ok = ok || (len(sm.Spec.Endpoints) > 0 && p.Name == sm.Spec.Endpoints[0].Port)
						}
					}
				}
				if !ok || sm.Spec.Endpoints[0].Path != "/metrics" {
					t.Errorf("ServiceMonitor %s does not scrape a Service port's /metrics", sm.Metadata.Name)
				}
			}
			for _, pr := range r.rules {
				checkRules(t, pr)
			}
			if strings.HasPrefix(name, "embedded") {
				checkEmbedded(t, r, c, headless, ports)
			} else if _, ok := envValue(c, "BEATD_ETCD_ENDPOINTS"); !ok {
				t.Errorf("the external topology sets no BEATD_ETCD_ENDPOINTS")
			}
		})
	}
}

// expansionOnly are variables the manifests define only to expand in
// another's value ($(ETCD_CLIENT_SCHEME) in the advertise client URL, so
// a component switches it to https without moving that URL above
// BEATD_ID). beatd itself does not read them.
var expansionOnly = map[string]bool{"ETCD_CLIENT_SCHEME": true}

// checkEmbedded checks the embedded topology's wiring: the bootstrap
// members are the StatefulSet's pods at the headless Service's DNS names
// and the container's peer port, and the member's data is on the PVC.
func checkEmbedded(t *testing.T, r *rendered, c *corev1.Container, headless *corev1.Service, ports map[string]int32) {
	t.Helper()
	ic, ok := envValue(c, "BEATD_ETCD_INITIAL_CLUSTER")
	if !ok {
		t.Fatal("no BEATD_ETCD_INITIAL_CLUSTER")
	}
	members := strings.Split(ic, ",")
	if want := int(*r.sts.Spec.Replicas); len(members) != want {
		t.Errorf("initial cluster has %d members, the StatefulSet %d replicas", len(members), want)
	}
	svcPorts := map[string]int32{}
	for _, p := range headless.Spec.Ports {
		svcPorts[p.Name] = p.Port
	}
	autoTLS, _ := envValue(c, "BEATD_ETCD_PEER_AUTO_TLS")
	certFile, _ := envValue(c, "BEATD_ETCD_PEER_CERT_FILE")
	scheme := "http"
	if autoTLS == "true" || certFile != "" {
		scheme = "https"
	}
	for i, m := range members {
		name, u, _ := strings.Cut(m, "=")
		pod := fmt.Sprintf("%s-%d", r.sts.Name, i)
		want := fmt.Sprintf("%s://%s.%s:%d", scheme, pod, headless.Name, ports["etcd-peer"])
		if name != pod || u != want {
			t.Errorf("initial cluster member %q: want %s=%s", m, pod, want)
		}
	}
	if svcPorts["etcd-peer"] != ports["etcd-peer"] || svcPorts["etcd-client"] != ports["etcd-client"] {
		t.Errorf("headless Service ports %v do not match the container's %v", svcPorts, ports)
	}
	adv, _ := envValue(c, "BEATD_ETCD_ADVERTISE_CLIENT_URL")
	clientScheme, _ := envValue(c, "ETCD_CLIENT_SCHEME")
	adv = strings.ReplaceAll(adv, "$(ETCD_CLIENT_SCHEME)", clientScheme)
	wantScheme := "http"
	if cf, _ := envValue(c, "BEATD_ETCD_CLIENT_CERT_FILE"); cf != "" {
		wantScheme = "https"
		if auth, _ := envValue(c, "BEATD_ETCD_CLIENT_CERT_AUTH"); auth != "true" {
			t.Errorf("client TLS without client certificate auth")
		}
	}
	if want := fmt.Sprintf("%s://$(BEATD_ID).%s:%d", wantScheme, headless.Name, ports["etcd-client"]); adv != want {
		t.Errorf("advertise client URL %q, want %q", adv, want)
	}
	advPeer, _ := envValue(c, "BEATD_ETCD_ADVERTISE_PEER_URL")
	if want := fmt.Sprintf("%s://$(BEATD_ID).%s:%d", scheme, headless.Name, ports["etcd-peer"]); advPeer != want {
		t.Errorf("advertise peer URL %q, want %q (pods beyond the bootstrap list join at it)", advPeer, want)
	}
	if pr := r.sts.Spec.PersistentVolumeClaimRetentionPolicy; pr == nil || pr.WhenScaled != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		t.Errorf("PVC retention on scale-down %+v: want Delete, so a re-added member starts empty", pr)
	}
	// $(BEATD_ID) expands only if BEATD_ID comes first, from the pod name.
	for _, e := range c.Env {
		if e.Name == "BEATD_ID" {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("BEATD_ID is not the pod name")
			}
			break
		}
		if strings.Contains(e.Value, "$(BEATD_ID)") {
			t.Errorf("%s uses $(BEATD_ID) before it is defined", e.Name)
		}
	}
	dataDir, _ := envValue(c, "BEATD_DATA_DIR")
	ok = false
	for _, vct := range r.sts.Spec.VolumeClaimTemplates {
		for _, m := range c.VolumeMounts {
			ok = ok || (m.Name == vct.Name && m.MountPath == dataDir)
		}
	}
	if !ok {
		t.Errorf("BEATD_DATA_DIR %q is not a volumeClaimTemplate's mount", dataDir)
	}
	if len(r.netpols) == 0 {
		t.Errorf("no NetworkPolicy guards the etcd ports")
	}
}

// checkRules checks the alerts with promtool when it is installed, and
// that the alerts the issue asks for exist.
func checkRules(t *testing.T, pr *prometheusRule) {
	t.Helper()
	want := map[string]string{"no leader": "beatd_is_leader", "persist backlog": "beatd_state_persist_failing",
		"fires failing": `beatd_fires_total{result="error"}`, "leader changes": "beatd_leader_changes_total"}
	for what, metric := range want {
		ok := false
		for _, g := range pr.Spec.Groups {
			for _, rule := range g.Rules {
				ok = ok || strings.Contains(rule.Expr, metric)
			}
		}
		if !ok {
			t.Errorf("PrometheusRule has no alert on %s (%s)", what, metric)
		}
	}
	// The plain Prometheus rules file, for those without the operator, and
	// the PrometheusRule must say the same.
	if b, err := os.ReadFile("prometheus/alerts.yaml"); err == nil {
		var file struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &file); err != nil {
			t.Fatalf("prometheus/alerts.yaml: %v", err)
		}
		exprs := map[string]string{}
		for _, g := range pr.Spec.Groups {
			for _, rule := range g.Rules {
				exprs[rule.Alert] = rule.Expr
			}
		}
		for _, g := range file.Groups {
			for _, rule := range g.Rules {
				if rule.Alert != "" && strings.TrimSpace(exprs[rule.Alert]) != strings.TrimSpace(rule.Expr) {
					t.Errorf("alert %s: prometheus/alerts.yaml and the PrometheusRule differ (%q vs %q)", rule.Alert, rule.Expr, exprs[rule.Alert])
				}
			}
		}
	}
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool not installed: rule syntax unchecked")
		return
	}
	b, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}

// TestHTTPSOrLoudComment: a rendering either serves beatd's HTTP as HTTPS
// (certificate and key from a mounted Secret, probes over HTTPS, an https
// advertised URL at the name the certificate holds), or it is plain HTTP
// and the base manifest and deploy/README.md say so at their top, with
// the way to turn HTTPS on.
func TestHTTPSOrLoudComment(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"embedded", "external", "embedded+components", "external+monitoring", "embedded+etcd-tls", "embedded+https", "external+https", "embedded+shards", "external+shards"} {
		t.Run(name, func(t *testing.T) {
			r := render(t, name)
			c := container(t, r)
			cert, tls := envValue(c, "BEATD_HTTP_TLS_CERT")
			if want := strings.HasSuffix(name, "+https"); tls != want {
				t.Fatalf("BEATD_HTTP_TLS_CERT set: %v, want %v", tls, want)
			}
			if !tls {
				return
			}
			mounts := map[string]string{} // mount path → Secret
			secrets := map[string]string{}
			for _, v := range r.sts.Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					secrets[v.Name] = v.Secret.SecretName
				}
			}
			for _, m := range c.VolumeMounts {
				if sec, ok := secrets[m.Name]; ok {
					mounts[m.MountPath] = sec
				}
			}
			key, _ := envValue(c, "BEATD_HTTP_TLS_KEY")
			ca, _ := envValue(c, "BEATD_HTTP_TLS_CA")
			for _, f := range []string{cert, key, ca} {
				if mounts[path.Dir(f)] != "beatd-http-tls" {
					t.Errorf("%s is not in the mounted Secret beatd-http-tls (mounts %v)", f, mounts)
				}
			}
			for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
					t.Errorf("%s probe is not HTTPS: %+v", what, p)
				}
			}
			adv, _ := envValue(c, "BEATD_ADVERTISE_URL")
			if adv != "https://$(BEATD_ID)."+r.sts.Spec.ServiceName+":8080" {
				t.Errorf("BEATD_ADVERTISE_URL %q: want the https URL at the pod's DNS name", adv)
			}
			idx := map[string]int{}
			for i, e := range c.Env {
				idx[e.Name] = i
			}
			if idx["BEATD_ID"] > idx["BEATD_ADVERTISE_URL"] {
				t.Errorf("BEATD_ADVERTISE_URL comes before BEATD_ID, so $(BEATD_ID) is not expanded")
			}
		})
	}
	for _, f := range []string{"k8s/base/statefulset.yaml", "README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		top := string(b[:min(len(b), 800)])
		if !strings.Contains(strings.ToLower(top), "plain http") || !strings.Contains(top, "components/http-tls") {
			t.Errorf("%s does not say at its top that the base is plain HTTP and how to turn HTTPS on:\n%s", f, top)
		}
	}
}
